"""Programs in the scheduler (taogpud.jobs.programs), the real scheduler and store over the
state machine's fake pool: their trace lines, as a job's, each written once the store holds
what it says (JobStore.tell, Tell.TRACE), so a kill -9 never leaves a trace that says more
than a restart finds; and their clients, followed once each however many leases they hold.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from taogpud.jobs import store as store_module
from taogpud.jobs.programs import ProgramExit
from taogpud.jobs.records import JobState, Peer
from taogpud.observability import trace
from taogpud.wire import ProgramRequest
from tests.test_scheduler_states import NEVER_S, Incarnation

WAIT_S = 60.0  # for the loop to hear of a process's end: generous, a loaded host's bound


def run_until(incarnation: Incarnation, done: Callable[[], bool], what: str) -> None:
    """Turn the incarnation's loop (its pidfd readers fire) until `done()`."""

    async def turns() -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"{what}: not within {WAIT_S} s"
            await asyncio.sleep(0.01)

    incarnation.loop.run_until_complete(turns())


@pytest.fixture
def lines() -> Iterator[structlog.testing.LogCapture]:
    """The trace lines written; the store's and the trace's timers never fire by themselves."""
    captured = structlog.testing.LogCapture()
    processors = structlog.get_config()["processors"]
    delays = store_module.FLUSH_DELAY_S, trace.FLUSH_AFTER_S
    structlog.configure(processors=[captured])
    store_module.FLUSH_DELAY_S = trace.FLUSH_AFTER_S = NEVER_S
    try:
        yield captured
    finally:
        structlog.configure(processors=processors)
        store_module.FLUSH_DELAY_S, trace.FLUSH_AFTER_S = delays


def test_a_programs_start_is_traced_once_the_store_holds_it(
    tmp_path: Path, lines: structlog.testing.LogCapture
) -> None:
    """program.started is written after the commit that holds the program's pid, not when
    its starter's word arrives: before that commit, a kill -9 would leave a trace saying the
    program started and a store that does not know its pid."""
    incarnation = Incarnation(tmp_path / "jobs.sqlite3")
    incarnation.pool.executor = "local"  # programs run under the local executor only
    caller = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    program = subprocess.Popen(["sleep", "60"])  # this process's child: the caller's own
    try:
        scheduler = incarnation.scheduler
        job = incarnation.call(scheduler.submit_program, ProgramRequest(["sleep"], "/"), caller)
        incarnation.call(scheduler.commit, job.id)  # accepted and granted, as its submit answers
        incarnation.call(scheduler.programs.started, job.id, program.pid, caller)
        incarnation.call(trace.flush)
        assert "program.started" not in [line["event"] for line in lines.entries]
        incarnation.call(incarnation.store.flush)
        incarnation.call(trace.flush)
        (started,) = [line for line in lines.entries if line["event"] == "program.started"]
        assert started["job_id"] == job.id and started["pid"] == program.pid
        assert incarnation.store.get(job.id).program.pid == program.pid  # type: ignore[union-attr]
    finally:
        program.kill()
        program.wait()
        incarnation.end()


def test_a_client_that_exits_ends_every_lease_it_holds_and_none_it_let_go(
    tmp_path: Path,
) -> None:
    """One client, followed once for all its leases (leases.Watches): a lease that ended
    before (it could not start its program) keeps its end; the two it holds when it exits,
    granted and never started, end cancelled, client_gone."""
    incarnation = Incarnation(tmp_path / "jobs.sqlite3")
    incarnation.pool.executor = "local"
    client = subprocess.Popen(["sleep", "60"])  # the process that asks for the leases
    caller = Peer(pid=client.pid, uid=os.getuid(), gid=os.getgid())
    scheduler = incarnation.scheduler

    def submit() -> str:
        job = incarnation.call(scheduler.submit_program, ProgramRequest(["x"], "/"), caller)
        incarnation.call(scheduler.commit, job.id)
        return job.id

    try:
        first = submit()
        not_started = ProgramExit(None, not_started="cannot run 'x'")
        incarnation.call(scheduler.programs.exited, first, caller, not_started)
        held = [submit(), submit()]
        assert [scheduler.get(job_id).status for job_id in held] == [JobState.running] * 2
        client.kill()
        client.wait()
        run_until(
            incarnation,
            lambda: all(scheduler.get(job_id).status.finished for job_id in held),
            "the leases of a client that exited ended",
        )
        for job_id in held:
            job = scheduler.get(job_id)
            assert job.status is JobState.cancelled and job.error is not None
            assert job.error.code == "client_gone", job.error
        assert scheduler.get(first).status is JobState.failed  # its own end, kept
    finally:
        client.kill()
        client.wait()
        incarnation.end()
