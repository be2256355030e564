"""Job records, their states, and the job store.

The record is the API's job view too: what a client reads is exactly what the
daemon knows, including where the job really ran.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class JobState(StrEnum):
    queued = "queued"  # accepted, waiting for a slot
    running = "running"  # sent to a worker
    succeeded = "succeeded"  # the task returned
    failed = "failed"  # the task raised, ran out of memory, or its worker died
    cancelled = "cancelled"  # cancelled by a client, queued or running
    timed_out = "timed_out"  # ran past its timeout_s
    interrupted = "interrupted"  # the daemon stopped before the job could finish

    @property
    def finished(self) -> bool:
        return self not in (JobState.queued, JobState.running)


class JobErrorView(BaseModel):
    code: str
    message: str
    hint: str = ""


class OutputView(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    nbytes: int


class Peer(BaseModel):
    """Who submitted the job, from SO_PEERCRED on the Unix socket."""

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None


class JobRecord(BaseModel):
    id: str
    task: str
    params: dict[str, Any]
    inputs: dict[str, str] = Field(default_factory=dict)  # input name → array id
    status: JobState = JobState.queued
    priority: int = 0  # higher runs first
    timeout_s: float | None = None
    affinity: str | None = None
    requested_device: int | None = None
    keep_outputs: bool = False
    peer: Peer = Field(default_factory=Peer)
    estimate_bytes: int = 0
    # Where it really ran: filled in by the worker, never by the request.
    backend: str | None = None
    device: str | None = None
    device_index: int | None = None
    device_uuid: str | None = None
    compute_capability: str | None = None
    fallback: bool = False
    fallback_reason: str | None = None
    worker_pid: int | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    # Timings (ms). h2d/kernel/d2h only with enable_profiling.
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    queue_ms: float | None = None
    run_ms: float | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    outputs: list[OutputView] = Field(default_factory=list)
    error: JobErrorView | None = None


def new_job_id() -> str:
    """Sortable by creation time, unique without coordination: ms clock + 24 random bits."""
    return f"{time.time_ns() // 1_000_000:011x}{secrets.token_hex(3)}"


class JobStore:
    """Every job the daemon knows, newest last; finished ones are kept up to a bound.

    In memory for now: the durable store (SQLite) replaces this class behind the
    same methods.
    """

    def __init__(self, keep_finished: int = 10_000) -> None:
        self._jobs: OrderedDict[str, JobRecord] = OrderedDict()
        self._done: dict[str, asyncio.Event] = {}
        self._keep_finished = keep_finished
        self._finished_count = 0

    def add(self, job: JobRecord) -> None:
        self._jobs[job.id] = job
        self._done[job.id] = asyncio.Event()

    def get(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    def list(self, status: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        """Newest first."""
        picked: list[JobRecord] = []
        for job in reversed(self._jobs.values()):
            if status is None or job.status == status:
                picked.append(job)
                if len(picked) >= limit:
                    break
        return picked

    def mark_finished(self, job: JobRecord) -> None:
        """Wake every waiter and forget the oldest finished jobs past the bound."""
        self._done[job.id].set()
        self._finished_count += 1
        if self._finished_count > self._keep_finished:
            self._evict_oldest_finished()

    async def wait(self, job_id: str, timeout_s: float) -> None:
        event = self._done.get(job_id)
        if event is None or event.is_set():
            return
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            return

    def _evict_oldest_finished(self) -> None:
        for job_id, job in self._jobs.items():
            if job.status.finished:
                del self._jobs[job_id]
                del self._done[job_id]
                self._finished_count -= 1
                return
