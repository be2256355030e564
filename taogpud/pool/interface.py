"""What the scheduler, the daemon and the API see of a pool, whichever executor runs it.

    Pool     start(sink) · stop · kill_all · roll · set_memory_fraction · healthy · unresponsive
    Worker   one device's warm worker: its spec, state, info, the jobs it runs; send(RunJob |
             CancelJob), kill()

Two executors implement them: `supervisor.WorkerPool` (spawned processes on this host) and
`ray_pool.RayWorkerPool` (Ray actors, one per GPU, anywhere in a cluster). Both report to the
scheduler through the same `PoolSink`, with the same pipe messages (protocol.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from taogpud.backends.base import DeviceInfo, WorkerSpec
from taogpud.pool import protocol as msg


class WorkerState(StrEnum):
    starting = "starting"  # spawned, warming up
    warm = "warm"  # takes jobs
    stopping = "stopping"  # told to stop; finishes what it has
    dead = "dead"  # exited or failed to warm; the pool may replace it


class Worker(Protocol):
    spec: WorkerSpec
    state: WorkerState
    info: DeviceInfo | None
    pid: int | None
    running: set[str]  # job ids on this worker now
    reserved_bytes: int
    jobs_done: int
    restarts: int
    warm_failure: str | None
    retired: bool

    @property
    def label(self) -> str: ...
    @property
    def free_slots(self) -> int: ...
    def send(self, order: msg.ToWorker) -> None: ...
    def kill(self) -> None: ...
    def exit_description(self) -> str: ...


class Pool(Protocol):
    executor: str  # "local" | "ray"

    @property
    def workers(self) -> Sequence[Worker]: ...
    @property
    def healthy(self) -> Sequence[Worker]: ...
    async def start(self, sink: PoolSink, warm_timeout_s: float) -> None: ...
    async def stop(self, timeout_s: float) -> None: ...
    def kill_all(self) -> None: ...
    async def unresponsive(self, timeout_s: float) -> Sequence[Worker]: ...
    def set_memory_fraction(self, fraction: float) -> None: ...
    async def roll(self, specs: list[WorkerSpec], warm_timeout_s: float) -> list[str]: ...
    def problem(self) -> str | None: ...  # what keeps the executor from working, if anything
    @property
    def exit_hooks_safe(self) -> bool: ...  # False: leave with os._exit once all is saved


class PoolSink(Protocol):
    """What a pool tells the scheduler."""

    def on_job_finished(self, worker: Worker, finished: msg.JobFinished) -> None: ...
    def on_worker_lost(self, worker: Worker) -> None: ...
    def on_worker_warm(self, worker: Worker) -> None: ...
