"""A program's trace lines, as a job's: each written once the store holds what it says
(JobStore.tell, Tell.TRACE), so a kill -9 never leaves a trace that says more than a
restart finds (the real scheduler and store over the state machine's fake pool)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from taogpud.jobs import store as store_module
from taogpud.jobs.records import Peer
from taogpud.observability import trace
from taogpud.wire import ProgramRequest
from tests.test_scheduler_states import NEVER_S, Incarnation


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
