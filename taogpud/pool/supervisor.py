"""The pool: start every worker, wait until all are warm, replace the ones that die.

A worker that dies is replaced after a backoff that doubles with each crash in a
row (1 s … 60 s), so a crash-looping device is not restarted in a tight loop;
the other workers carry on meanwhile. A worker that stayed warm for STREAK_RESET_S
before it died starts the count again: one faulty job an hour is not a crash loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from taogpud.backends.base import WorkerSpec
from taogpud.errors import BackendUnavailable
from taogpud.observability.logging import get_logger
from taogpud.pool import protocol as msg
from taogpud.pool.interface import WorkerState
from taogpud.pool.worker import WorkerHandle

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
STREAK_RESET_S = 300.0  # warm this long before dying: the next respawn waits BACKOFF_FIRST_S

log = get_logger("taogpud.pool")


class PoolSink(Protocol):
    """What the pool tells the scheduler."""

    def on_job_finished(self, worker: WorkerHandle, finished: msg.JobFinished) -> None: ...
    def on_worker_lost(self, worker: WorkerHandle) -> None: ...
    def on_worker_warm(self, worker: WorkerHandle) -> None: ...


class WorkerPool:
    executor = "local"

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.workers = [WorkerHandle(s, self._on_message, self._on_exit) for s in specs]
        self._sink: PoolSink | None = None  # given to start(): nothing reports before it
        self._stopping = False
        self._respawns: set[asyncio.Task[None]] = set()

    @property
    def _told(self) -> PoolSink:
        assert self._sink is not None, "a worker reported before the pool was started"
        return self._sink

    async def start(self, sink: PoolSink, warm_timeout_s: float) -> None:
        """Spawn all workers and return once every one is warm; raise if any is not. From
        now on the workers' news goes to `sink` (the scheduler)."""
        self._sink = sink
        for worker in self.workers:
            worker.start()
        try:
            await asyncio.gather(*(w.wait_settled(warm_timeout_s) for w in self.workers))
        except TimeoutError:
            raise BackendUnavailable(
                f"workers were not warm after {warm_timeout_s:.0f} s",
                "check the daemon log for the worker that hangs during warm-up",
            ) from None
        failed = [w for w in self.workers if w.state is not WorkerState.warm]
        if failed:
            reasons = "; ".join(
                f"{w.label}: {w.warm_failure or w.exit_description()}" for w in failed
            )
            raise BackendUnavailable(f"a worker failed to warm up: {reasons}")

    async def stop(self, timeout_s: float) -> None:
        self._stopping = True
        for task in self._respawns:
            task.cancel()
        await asyncio.gather(*(w.stop(timeout_s) for w in self.workers))

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()

    def problem(self) -> str | None:
        return None  # a local worker's trouble is its own state (dead, restarts)

    @property
    def exit_hooks_safe(self) -> bool:
        return True

    @property
    def healthy(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.state is WorkerState.warm]

    async def unresponsive(self, timeout_s: float) -> list[WorkerHandle]:
        """The warm workers that did not answer a ping within timeout_s, pinged together.

        Starting, stopping and dead workers are not asked: warm-up and respawn have
        their own timeouts, and a respawn in backoff is the pool working as it should."""
        warm = self.healthy
        answers = await asyncio.gather(*(w.ping(timeout_s) for w in warm))
        return [w for w, answered in zip(warm, answers, strict=True) if not answered]

    def _on_message(self, worker: WorkerHandle, message: msg.FromWorker) -> None:
        if isinstance(message, msg.JobFinished):
            self._told.on_job_finished(worker, message)
        elif isinstance(message, msg.Warm):
            log.info(
                "worker.warm",
                device=worker.label,
                pid=message.pid,
                frozen_objects=message.frozen_objects,
                **_warm_fields(worker),
            )
            if worker.restarts:  # a respawn; a rolled worker is announced by _replace
                self._told.on_worker_warm(worker)

    def set_memory_fraction(self, fraction: float) -> None:
        for worker in self.healthy:
            worker.send(msg.SetMemoryFraction(fraction))

    async def roll(self, specs: list[WorkerSpec], warm_timeout_s: float) -> list[str]:
        """Replace the workers with ones built from `specs`, one device at a time.

        Each old worker first takes no new jobs and finishes the ones it has, so no accepted
        job is lost; the other devices keep serving meanwhile. Returns the problems met
        (a new worker that did not warm is left to the respawn loop)."""
        wanted = {spec.index for spec in specs}
        for worker in [w for w in self.workers if w.spec.index not in wanted]:
            await self._retire(worker)
            self.workers.remove(worker)
        problems = []
        for spec in specs:
            problem = await self._replace(spec, warm_timeout_s)
            if problem:
                problems.append(problem)
        return problems

    async def _replace(self, spec: WorkerSpec, warm_timeout_s: float) -> str | None:
        old = next((w for w in self.workers if w.spec.index == spec.index), None)
        if old is not None:
            await self._retire(old)
        fresh = WorkerHandle(spec, self._on_message, self._on_exit)
        if old is not None:
            self.workers[self.workers.index(old)] = fresh
        else:
            self.workers.append(fresh)
            self.workers.sort(key=lambda w: w.spec.index)
        fresh.start()
        try:
            await fresh.wait_settled(warm_timeout_s)
        except TimeoutError:
            return f"{fresh.label}: not warm after {warm_timeout_s:.0f} s"
        if fresh.state is not WorkerState.warm:
            return f"{fresh.label}: {fresh.warm_failure or fresh.exit_description()}"
        log.info("worker.rolled", device=fresh.label, pid=fresh.pid)
        self._told.on_worker_warm(fresh)
        return None

    async def _retire(self, worker: WorkerHandle) -> None:
        """Stop giving the worker jobs, wait for the ones it has, then stop it."""
        worker.retired = True
        worker.state = WorkerState.stopping  # no free slots: the scheduler places nothing here
        while worker.running:
            await asyncio.sleep(0.02)
        await worker.stop(timeout_s=10.0)

    def _on_exit(self, worker: WorkerHandle) -> None:
        if self._stopping or worker.retired:
            return
        log.error(
            "worker.lost",
            device=worker.label,
            pid=worker.pid,
            exit=worker.exit_description(),
            jobs_lost=len(worker.running),
        )
        self._told.on_worker_lost(worker)
        task = asyncio.get_running_loop().create_task(self._respawn(worker))
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self, worker: WorkerHandle) -> None:
        delay = next_respawn_delay(worker)
        log.warning("worker.respawn", device=worker.label, in_s=delay, restarts=worker.restarts)
        await asyncio.sleep(delay)
        if not self._stopping:
            worker.start()


class Respawned(Protocol):
    """What the backoff reads and counts on a worker of either pool."""

    restarts: int
    crash_streak: int
    warm_at: float | None


def next_respawn_delay(worker: Respawned) -> float:
    """Seconds to wait before the next respawn of `worker`, counting this one."""
    if worker.warm_at is not None and time.monotonic() - worker.warm_at >= STREAK_RESET_S:
        worker.crash_streak = 0
    delay: float = min(BACKOFF_FIRST_S * 2.0**worker.crash_streak, BACKOFF_MAX_S)
    worker.crash_streak += 1
    worker.restarts += 1
    return delay


def _warm_fields(worker: WorkerHandle) -> dict[str, object]:
    info = worker.info
    if info is None:
        return {}
    return {"backend": info.backend, "warmup_ms": round(info.warmup_ms, 1), "name": info.name}
