"""The job state machine, driven by hypothesis: the real scheduler and the real SQLite store
over a fake pool (the only fake: workers that run nothing and report what a rule says).

Rules: submit, start (placement, inside the scheduler), finish, worker crash, daemon crash
(kill -9 between any two steps: before or after the store's timer commits, before or after
the trace's writes its lines) and recovery, cancel, timeout, retry (after a crash), drain
with late finishes, restart. After every step: each accepted id is in exactly one state and
is where that state says (the run queue or one worker); no id is queued twice; no job runs
twice at once, nor more than max_retries + 1 times in all; running jobs stay within the
caps; a finished job never changes again; no accepted job is lost across crashes; the trace
says each job ended at most once, and as the store holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog
import structlog.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from taogpud.arrayfiles.store import ArrayStore
from taogpud.backends.base import DeviceInfo, WorkerSpec
from taogpud.errors import Draining, QueueFull
from taogpud.jobs import store as store_module
from taogpud.jobs.policy import Policy
from taogpud.jobs.records import JobState, Peer
from taogpud.jobs.scheduler import Scheduler
from taogpud.jobs.store import JobStore
from taogpud.observability import trace
from taogpud.pool import protocol as msg
from taogpud.pool.interface import WorkerState
from taogpud.wire import JobRequest

T = TypeVar("T")
DEVICES, SLOTS, CAP, QUEUE_LIMIT = 2, 2, 3, 8
PEER = Peer(pid=1, uid=0, gid=0)
NEVER_S = 3600.0


class FakeWorker:
    """A warm worker that runs nothing: it remembers the jobs sent to it until a rule says
    how each ended. Like the real one, it refuses a job when no slot is free."""

    def __init__(self, index: int, sink: Callable[[], Scheduler]) -> None:
        self.spec = WorkerSpec("cpu", index, SLOTS, 1, 0.85, 0, True, "auto", False)
        self.state = WorkerState.warm
        self.info = DeviceInfo("cpu", f"cpu:{index}", index, "fake")
        self.pid: int | None = 1000 + index
        self.running: set[str] = set()  # the scheduler's bookkeeping
        self.reserved_bytes = 0
        self.jobs_done = 0
        self.restarts = 0
        self.warm_failure: str | None = None
        self.retired = False
        self.active: dict[str, bool] = {}  # job id → told to cancel: what it really runs
        self.runs: Counter[str] = Counter()
        self._sink = sink

    @property
    def label(self) -> str:
        return f"cpu:{self.spec.index}"

    @property
    def free_slots(self) -> int:
        return self.spec.stream_count - len(self.running) if self.state is WorkerState.warm else 0

    def send(self, order: msg.ToWorker) -> None:
        if isinstance(order, msg.RunJob):
            if len(self.active) >= self.spec.stream_count:
                raise RuntimeError(f"worker {self.label} was sent a job with no slot free")
            assert order.job_id not in self.active, f"{order.job_id} sent twice to {self.label}"
            self.active[order.job_id] = False
            self.runs[order.job_id] += 1
        elif isinstance(order, msg.CancelJob) and order.job_id in self.active:
            self.active[order.job_id] = True

    def kill(self) -> None:
        """What the pool does when a worker is lost: mark it dead, tell the scheduler, and
        replace it (at once: backoff is the pool's business)."""
        self.active.clear()
        self.state = WorkerState.dead
        self._sink().on_worker_lost(self)
        self.state, self.pid, self.restarts = WorkerState.warm, (self.pid or 0) + 100, 1
        self._sink().on_worker_warm(self)

    def exit_description(self) -> str:
        return "killed by a rule"


class FakePool:
    executor = "fake"

    def __init__(self, sink: Callable[[], Scheduler]) -> None:
        self.workers = [FakeWorker(i, sink) for i in range(DEVICES)]

    @property
    def healthy(self) -> list[FakeWorker]:
        return [w for w in self.workers if w.state is WorkerState.warm]


class Incarnation:
    """One run of the daemon: its loop, store, scheduler and pool."""

    def __init__(self, path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = JobStore(path)
        policy = Policy(max_concurrent_tasks=CAP, queue_limit=QUEUE_LIMIT)
        arrays = ArrayStore(1 << 20, self.store, "hypothesis")
        self.pool = FakePool(lambda: self.scheduler)
        self.scheduler = Scheduler(
            policy,
            self.store,
            arrays,
            self.pool,  # type: ignore[arg-type]
            path.parent / "outputs",
        )
        self.draining = False

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one step inside the loop (timers and the store's flush need it). What it wrote
        is committed when the step commits itself (the API's commit before an answer, a
        dispatch) or when a rule fires the store's timer: a crash can come between any two
        steps, before or after a commit."""

        async def step() -> T:
            return fn(*args)

        return self.loop.run_until_complete(step())

    def end(self) -> None:
        """A clean stop: the store commits what is pending, the trace writes what it holds."""
        self.call(self.store.close)  # in the loop, as the daemon's run() closes it
        self.call(trace.flush)
        self.loop.close()

    def kill_9(self) -> None:
        """What kill -9 leaves: the store's commits and the trace lines written. What was
        pending in either is gone (the store's pending records are its own, dropped here)."""
        self.store._dirty.clear()
        with dropped_lines():
            self.call(self.store.close)
            self.call(trace.flush)
        self.loop.close()


@contextlib.contextmanager
def dropped_lines() -> Iterator[None]:
    """trace.flush() within renders nothing: the lines it held are lost, as with the process."""
    processors = structlog.get_config()["processors"]

    def drop(_logger: Any, _level: str, _event: Any) -> Any:
        raise structlog.DropEvent

    structlog.configure(processors=[drop])
    try:
        yield
    finally:
        structlog.configure(processors=processors)


class JobStates(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="tgd-states-"))
        self.daemon = Incarnation(self.folder / "jobs.sqlite3")
        self.accepted: dict[str, int] = {}  # id → max_retries, in the order of acceptance
        self.ended: dict[str, str] = {}  # id → the finished state first seen
        self.runs: Counter[str] = Counter()  # RunJob orders of every incarnation
        self.lines = structlog.testing.LogCapture()  # the trace lines written, every incarnation
        self._processors = structlog.get_config()["processors"]
        structlog.configure(processors=[self.lines])
        self._delays = store_module.FLUSH_DELAY_S, trace.FLUSH_AFTER_S
        # The store's and the trace's timers fire when a rule says so, never by the clock:
        # an example replays the same steps however long hypothesis takes between them.
        store_module.FLUSH_DELAY_S = trace.FLUSH_AFTER_S = NEVER_S

    def teardown(self) -> None:
        self.daemon.end()
        structlog.configure(processors=self._processors)
        store_module.FLUSH_DELAY_S, trace.FLUSH_AFTER_S = self._delays
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- rules --------------------------------------------------------------------------

    @rule(
        max_retries=st.integers(0, 2),
        priority=st.integers(-1, 1),
        timeout=st.booleans(),
        device=st.sampled_from([None, None, 0, 1]),
    )
    def submit(self, max_retries: int, priority: int, timeout: bool, device: int | None) -> None:
        request = JobRequest(
            task="sleep",
            params={"ms": 1},
            inputs={},
            max_retries=max_retries,
            priority=priority,
            timeout_s=3600.0 if timeout else None,
            device=device,
        )
        queued = self.daemon.scheduler.queued
        try:
            job = self.daemon.call(self.daemon.scheduler.submit, request, PEER)
        except Draining:
            assert self.daemon.draining
            return
        except QueueFull:
            assert queued >= QUEUE_LIMIT
            return
        assert not self.daemon.draining
        self.daemon.call(self.daemon.scheduler.commit, job.id)
        self.accepted[job.id] = max_retries

    @rule(data=st.data(), succeed=st.booleans())
    def finish(self, data: st.DataObject, succeed: bool) -> None:
        """A worker reports a job it ran: succeeded, failed, or cancelled if it was told to."""
        busy = [(w, job_id) for w in self.daemon.pool.workers for job_id in w.active]
        if not busy:
            return
        worker, job_id = data.draw(st.sampled_from(sorted(busy, key=self._order)))
        cancelled = worker.active.pop(job_id)
        status = "cancelled" if cancelled else "succeeded" if succeed else "failed"
        error = None if status == "succeeded" else ("task_failed", "a rule said so", "")
        finished = msg.JobFinished(job_id, status, 1.0, result={} if succeed else None, error=error)
        self.daemon.call(self.daemon.scheduler.on_job_finished, worker, finished)

    @rule(index=st.integers(0, DEVICES - 1))
    def crash_worker(self, index: int) -> None:
        self.daemon.call(self.daemon.pool.workers[index].kill)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if self.accepted:
            job_id = data.draw(st.sampled_from(list(self.accepted)))
            self.daemon.call(self.daemon.scheduler.cancel, job_id, PEER)

    @rule(data=st.data())
    def time_out(self, data: st.DataObject) -> None:
        running = sorted((j for w in self.daemon.pool.workers for j in w.running), key=self._rank)
        if running:
            self.daemon.call(self.daemon.scheduler.time_out, data.draw(st.sampled_from(running)))

    @rule()
    def store_timer_fires(self) -> None:
        """The store's flush timer (FLUSH_DELAY_S after a change): every pending change."""
        self.daemon.call(self.daemon.store.flush)

    @rule()
    def trace_timer_fires(self) -> None:
        """The trace's timer (or the API's idle moment): every line it holds is written."""
        self.daemon.call(trace.flush)

    @rule()
    def crash_daemon(self) -> None:
        """kill -9, between any two steps: the workers die with it, and whatever neither the
        store nor the trace had written is gone; the next start recovers what the store holds."""
        self._count_runs()
        self.daemon.kill_9()
        self._start_again()

    @precondition(lambda self: not self.daemon.draining)
    @rule()
    def drain_past_the_deadline(self) -> None:
        """SIGTERM and a drain deadline that passes at once: running jobs are interrupted,
        and their workers may still report them afterwards (the finish rule)."""
        daemon = self.daemon
        daemon.draining = True
        left = daemon.loop.run_until_complete(daemon.scheduler.drain(0.0))
        if left:
            daemon.call(daemon.scheduler.interrupt_running)

    @precondition(lambda self: self.daemon.draining)
    @rule()
    def restart(self) -> None:
        self._count_runs()
        self.daemon.end()
        self._start_again()

    def _rank(self, job_id: str) -> int:
        """Choices are drawn in acceptance order: ids made in one millisecond sort by their
        random bits, which would make a replayed example choose another job."""
        return list(self.accepted).index(job_id)

    def _order(self, busy: tuple[FakeWorker, str]) -> tuple[int, int]:
        return self._rank(busy[1]), busy[0].spec.index

    def _start_again(self) -> None:
        self.daemon = Incarnation(self.folder / "jobs.sqlite3")
        store = self.daemon.store
        self.daemon.call(self.daemon.scheduler.recover, store.unfinished())
        store.load_recent(10_000)

    def _count_runs(self) -> None:
        for worker in self.daemon.pool.workers:
            self.runs.update(worker.runs)

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def each_job_is_where_its_state_says(self) -> None:
        scheduler, workers = self.daemon.scheduler, self.daemon.pool.workers
        queue = scheduler.queue.ids()
        assert len(queue) == len(set(queue)), f"queued twice: {queue}"
        on_workers = [j for w in workers for j in w.running]
        assert len(on_workers) == len(set(on_workers)), f"on two workers: {on_workers}"
        for job_id in self.accepted:
            job = self.daemon.store.get(job_id)
            assert job is not None, f"accepted job {job_id} is lost"
            assert (job.status is JobState.queued) == (job_id in queue), job
            assert (job.status is JobState.running) == (job_id in on_workers), job

    @invariant()
    def no_job_runs_twice(self) -> None:
        busy = [j for w in self.daemon.pool.workers for j in w.active]
        assert len(busy) == len(set(busy)), f"running twice at once: {busy}"
        runs = self.runs.copy()
        for worker in self.daemon.pool.workers:
            runs.update(worker.runs)
        for job_id, count in runs.items():
            assert count <= self.accepted[job_id] + 1, f"{job_id} ran {count} times"

    @invariant()
    def the_trace_says_each_job_ended_once_as_the_store_holds(self) -> None:
        """A job's end is written to the trace only once the store holds it: a line never
        says a job ended one way that a restart then finds unfinished, or ending another."""
        ends: dict[str, list[str]] = {}
        for line in self.lines.entries:
            status = line.get("status")
            if line["event"] == f"job.{status}" and JobState(status).finished:
                ends.setdefault(line["job_id"], []).append(status)
        for job_id, said in ends.items():
            assert len(said) == 1, f"the trace says {job_id} ended {len(said)} times: {said}"
            job = self.daemon.store.get(job_id)
            assert job is not None and job.status.value == said[0], (job_id, said, job)

    @invariant()
    def caps_hold(self) -> None:
        scheduler, workers = self.daemon.scheduler, self.daemon.pool.workers
        assert scheduler.running_total == sum(len(w.running) for w in workers)
        assert scheduler.running_total <= CAP
        assert all(len(w.running) <= w.spec.stream_count for w in workers)

    @invariant()
    def a_finished_job_never_changes(self) -> None:
        """Once a commit holds a job's end (what an answer or a restart can see), neither
        memory nor a later commit says otherwise."""
        committed = self._committed_states()
        for job_id in self.accepted:
            job = self.daemon.store.get(job_id)
            assert job is not None
            if job_id in self.ended:
                assert job.status.value == self.ended[job_id], (job_id, self.ended[job_id], job)
                assert committed[job_id] == self.ended[job_id], (job_id, committed[job_id])
            elif JobState(committed.get(job_id, "queued")).finished:
                self.ended[job_id] = committed[job_id]

    def _committed_states(self) -> dict[str, str]:
        """Each job's status as the store's commits hold it, read beside the store."""
        with contextlib.closing(sqlite3.connect(self.folder / "jobs.sqlite3")) as db:
            return dict(db.execute("SELECT id, status FROM jobs").fetchall())


JobStates.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestJobStates = pytest.mark.slow(JobStates.TestCase)  # 3–25 s here, with the host's load
