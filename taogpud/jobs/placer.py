"""The scheduler's side of placement: the workers as placement sees them (with what the
programs' leases hold), and what placement remembers from one decision to the next (the
round-robin cursor, the device each affinity key went to). The decision itself is
taogpud.jobs.placement's, a pure function.
"""

from __future__ import annotations

from taogpud.jobs import placement
from taogpud.jobs.programs import Held
from taogpud.jobs.records import JobRecord
from taogpud.pool.interface import Pool, Worker, WorkerState


class Placer:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._rr_next = 0
        self._affinity: dict[str, int] = {}  # affinity key → device index

    def devices(self, held: dict[int, Held] | None = None) -> list[placement.Device]:
        """The workers as placement sees them, in pool order; `held`: by the leases."""
        if not held:
            return [_device(w) for w in self.pool.workers]
        return [_device(w, held.get(w.spec.index)) for w in self.pool.workers]

    def place(
        self,
        wanted: placement.Job,
        devices: list[placement.Device],
        rules: placement.Rules,
        running_total: int,
    ) -> list[Worker] | None:
        """Where a job starts now (placement.place decides: one worker, or `count` for a
        program's --gpus), or None: it waits."""
        workers = self.pool.workers
        decision = placement.place(
            wanted,
            devices,
            rules,
            running_total=running_total,
            rr_next=self._rr_next,
            affinity=self._affinity,
        )
        self._rr_next = decision.rr_next
        if decision.position is None:
            return None
        if decision.remember is not None:
            key, index = decision.remember
            self._affinity[key] = index
        return [workers[position] for position in decision.positions]


def wanted(job: JobRecord) -> placement.Job:
    """What a queued job asks of placement; a program's words too (--gpus, --share, --mem)."""
    program = job.program
    if program is None:
        return placement.Job(job.estimate_bytes, job.requested_device, job.affinity)
    whole, reserve_cap = not program.share, program.mem_bytes is None
    return placement.Job(
        job.estimate_bytes, job.requested_device, job.affinity, program.gpus, whole, reserve_cap
    )


def _device(worker: Worker, held: Held | None = None) -> placement.Device:
    info, spec = worker.info, worker.spec
    running, free, reserved = len(worker.running), worker.free_slots, worker.reserved_bytes
    if held is not None:  # a program's lease takes a slot, or every slot, and its memory
        running, reserved = running + held.running, reserved + held.bytes
        free = 0 if held.whole else max(free - held.running, 0)
    return placement.Device(  # index, slots, running, free_slots, reserved_bytes, cap, alive
        spec.index,
        spec.stream_count,
        running,
        free,
        reserved,
        info.memory_cap_bytes if info and info.memory_cap_bytes > 0 else None,
        worker.state is not WorkerState.dead,
    )
