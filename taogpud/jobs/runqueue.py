"""The run queue: the jobs waiting for a slot, in the order they start (priority first, then
arrival).

It follows the job states: the scheduler adds a job as its status becomes queued and removes
it as its status becomes anything else (Scheduler._move, the one place a status changes), so
a job is in it exactly while it is queued, and once.
"""

from __future__ import annotations

import bisect

from taogpud.jobs.records import JobRecord


class RunQueue:
    def __init__(self) -> None:
        self._entries: list[tuple[tuple[int, int], JobRecord]] = []  # ((-priority, seq), job)
        self._ids: set[str] = set()
        self._seq = 0  # arrival order, for jobs of one priority

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, job: JobRecord) -> None:
        """Queue the job behind those of its priority; a job queued already stays where it is."""
        if job.id in self._ids:
            return
        self._ids.add(job.id)
        self._seq += 1
        bisect.insort(self._entries, ((-job.priority, self._seq), job), key=lambda e: e[0])

    def remove(self, job_id: str) -> None:
        if job_id in self._ids:
            self._ids.discard(job_id)
            # dispatch starts jobs from the front: the search is short where it is frequent
            index = next(i for i, entry in enumerate(self._entries) if entry[1].id == job_id)
            del self._entries[index]

    def at(self, index: int) -> JobRecord:
        """The job `index` places from the front (0 starts next)."""
        return self._entries[index][1]

    def position(self, job_id: str) -> int | None:
        """Where a queued job stands: 1 starts next; None for a job not queued."""
        if job_id not in self._ids:
            return None
        return 1 + next(i for i, (_, job) in enumerate(self._entries) if job.id == job_id)

    def ids(self) -> list[str]:
        """The queue in the order it starts jobs (tests check it against the states)."""
        return [job.id for _, job in self._entries]
