"""One trace line per job state change: the proof of where each job ran. What a job's line
says (its fields, its level) is the jobs' own (jobs/trace_line.py); this writes lines.

A job's line goes out only once the job store has committed the change it tells (the
scheduler hands it to JobStore.tell (Tell.TRACE), with its fields and timestamp taken at the
change). A kill -9 between a change and its commit loses the line with the change: the
trace never says a job succeeded that a restart finds running and marks interrupted.

Lines are written within FLUSH_AFTER_S of their event, together, never inside the callback
that made them: the fields and the timestamp are taken when the state changes; only the
rendering and the write wait, or less: when the API has answered the last request it held
(api/edge.py), the daemon is idle until the next one and they go then. A tiny job's lines
(queued, running, succeeded and its request's) then leave in one write after its answer,
while its client reads the answer, instead of in two batches, one of them while the job's
worker ran: a worker woken on the daemon's own CPU waited for it. In an A/B here
(sequential tiny jobs, four pairs) that took the p50 from 0.69–0.95 to 0.67–0.79 ms and the
daemon's CPU per job from 660–923 to 623–733 µs. The daemon's stop writes what is pending
(flush()), and so does a read of the trace through the API (api/trace.py), so that it has
whatever an earlier answer showed.

Measured again for issue 36 (bench/ab.py, this tree against one whose lines are written at
once, two rounds at a load of 20–28): the p50 7.9% and the daemon's CPU per job 7.5% lower
with the deferral. Kept for that: the tiny-job p50 is the one goal measured against Ray's
warm actor, and it stands at 0.80-0.88 of Ray's (bench/results/refactor-guard.md), so 8% is
most of the margin. Its cost to a reader is the flush calls in api/edge.py, api/trace.py and
the lifecycle; bench/results/speed-paths-ab.md has the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

import structlog

from taogpud.observability.logging import get_logger, write_lines

log = get_logger("taogpud.jobs")


def line(level: str, event: str, fields: dict[str, Any]) -> Callable[[], None]:
    """`event` with `fields` as they stand now (its timestamp taken here), logged when called:
    the scheduler has the job store call a job's (jobs/trace_line.py) once a commit holds the
    change it tells (JobStore.tell, Tell.TRACE), so the trace never says what a restart would
    not find."""
    fields["_at"] = time.time()
    return functools.partial(_defer, level, event, fields)


_pending: list[tuple[str, str, dict[str, Any]]] = []  # (level, event, fields), oldest first
FLUSH_AFTER_S = 0.001  # longer than a tiny job's round trip; too short for anyone to wait on


class _Timer:
    loop: asyncio.AbstractEventLoop | None = None  # whose timer will write _pending; None: none
    handle: asyncio.TimerHandle | None = None

    def stop(self) -> None:
        """The lines are being written: a timer still set would write the next job's lines
        in the middle of that job."""
        handle, self.loop, self.handle = self.handle, None, None
        if handle is not None:
            with contextlib.suppress(RuntimeError):  # on a loop that ended first (a test's)
                handle.cancel()


_timer = _Timer()


def deferred(level: str, event: str, **fields: Any) -> None:
    """Log `event` within FLUSH_AFTER_S (now, outside a loop), in order with the other
    deferred lines; its timestamp is now."""
    fields["_at"] = time.time()
    _defer(level, event, fields)


def _defer(level: str, event: str, fields: dict[str, Any]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a thread of its own, or a tool: nothing to wait for
        getattr(log, level)(event, **fields)
        return
    _pending.append((level, event, fields))
    if _timer.loop is not loop:  # none set, or one on a loop that ended first (a test's)
        _timer.loop = loop
        _timer.handle = loop.call_later(FLUSH_AFTER_S, flush)


def flush() -> None:
    """Write every deferred line now: through the configured processors (level, redaction,
    JSON, the journal), then the stdout ones in one write (logging.configure() sends lines
    to stdout; unconfigured, structlog's default renderer gives text)."""
    if not _pending:
        return  # the timer, or the API's idle moment (api/edge.py), finds nothing
    _timer.stop()
    lines: list[bytes] = []
    processors = structlog.get_config()["processors"]
    batch = _pending[:]
    _pending.clear()
    for level, event, fields in batch:
        fields["event"] = event
        rendered: Any = fields
        try:
            for processor in processors:  # the last one renders the line's bytes
                rendered = processor(None, level, rendered)
        except structlog.DropEvent:  # below the level, or gone to the journal
            continue
        lines.append(rendered if isinstance(rendered, bytes) else str(rendered).encode())
    if lines:
        lines.append(b"")
        write_lines(b"\n".join(lines))  # never blocks the loop, never raises (logging.py)
