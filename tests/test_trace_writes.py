"""Deferred trace lines (observability/trace.py): made in different turns of the loop, a tiny job's
lines leave together in one write, after FLUSH_AFTER_S; the daemon's stop writes what is
pending."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import orjson
import pytest

from taogpud.api.trace import _lines
from taogpud.observability import trace
from taogpud.observability.logging import configure
from taogpud.observability.trace_ring import TraceLine, TraceRing


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Each write of trace lines, as the sink would get it (the configured JSON renderer)."""
    configure("info")
    trace.flush()  # lines another test's loop left pending go out first, elsewhere
    seen: list[bytes] = []
    monkeypatch.setattr(trace, "write_lines", seen.append)
    return seen


def test_lines_of_several_turns_leave_in_one_write(writes: list[bytes]) -> None:
    async def a_tiny_job() -> int:
        trace.deferred("info", "job.queued", job_id="j1")
        await asyncio.sleep(0)  # the submit's turn ends; the worker runs
        trace.deferred("info", "job.succeeded", job_id="j1")
        await asyncio.sleep(0)  # the answer's turn
        trace.deferred("info", "api.request", path="/v1/jobs")
        await asyncio.sleep(0)
        before = len(writes)  # nothing yet: the lines wait for FLUSH_AFTER_S
        await asyncio.sleep(trace.FLUSH_AFTER_S * 5)
        return before

    assert asyncio.run(a_tiny_job()) == 0
    assert len(writes) == 1
    events = [orjson.loads(line)["event"] for line in writes[0].splitlines()]
    assert events == ["job.queued", "job.succeeded", "api.request"]


def test_flush_writes_what_is_pending_at_once(writes: list[bytes]) -> None:
    async def stopping() -> list[bytes]:
        trace.deferred("info", "job.running", job_id="j2")
        trace.flush()  # as the daemon's stop does, before its own last lines
        written = list(writes)
        await asyncio.sleep(trace.FLUSH_AFTER_S * 5)  # the timer then finds nothing
        return written

    written = asyncio.run(stopping())
    assert [orjson.loads(line)["event"] for line in written[0].splitlines()] == ["job.running"]
    assert len(writes) == 1


def test_lines_left_by_a_loop_that_ended_are_written_by_the_next(
    writes: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that ends before its timer fires (a test's asyncio.run) leaves its lines
    pending: the next loop's first deferred line schedules their write. (The first loop's
    timer is a minute long: asyncio.run's own shutdown runs the loop, and on a busy host it
    outlived the 1 ms timer, which then wrote the lines.)"""

    async def ends_at_once() -> None:
        trace.deferred("info", "job.queued", job_id="j3")

    async def the_next() -> None:
        trace.deferred("info", "job.running", job_id="j3")
        await asyncio.sleep(trace.FLUSH_AFTER_S * 5)

    flush_after_s = trace.FLUSH_AFTER_S
    monkeypatch.setattr(trace, "FLUSH_AFTER_S", 60.0)
    asyncio.run(ends_at_once())
    assert writes == []
    monkeypatch.setattr(trace, "FLUSH_AFTER_S", flush_after_s)
    asyncio.run(the_next())
    assert [orjson.loads(line)["event"] for line in writes[0].splitlines()] == [
        "job.queued",
        "job.running",
    ]


def test_a_trace_read_has_the_lines_still_waiting_for_their_write() -> None:
    """GET /v1/trace and /v1/jobs/{id}/events read the in-memory ring, which rendering
    feeds: a read that comes before the deferred write still gets every line an earlier
    answer could have shown."""
    configure("info")

    async def read_right_after_an_answer() -> list[bytes]:
        trace.deferred("info", "job.succeeded", job_id="j-ring")
        mine: Callable[[TraceLine], bool] = lambda item: b'"j-ring"' in item.line  # noqa: E731
        return [line async for line in _lines(cast(Any, None), mine, 10, False, None)]

    lines = asyncio.run(read_right_after_an_answer())
    assert [orjson.loads(line)["event"] for line in lines] == ["job.succeeded"]


def test_the_trace_ring_is_bounded_in_bytes_as_well_as_lines() -> None:
    """Long lines (a relay request's trace, several KB) cannot grow the ring past its byte
    budget: the oldest go first, the newest are all there, in order."""
    ring = TraceRing(size=20_000, max_bytes=1_000_000)
    line = b"x" * 8_000
    for number in range(2_000):  # 16 MB of lines offered
        ring.append(line, {"job_id": f"j{number}"})
    kept = list(ring.after(0))
    assert sum(len(item.line) for item in kept) <= 1_000_000
    assert len(kept) == 1_000_000 // 8_000
    assert [item.job_id for item in kept][-1] == "j1999"
    assert [item.seq for item in kept] == list(range(kept[0].seq, kept[0].seq + len(kept)))
