"""The trace through the API: the daemon's JSON lines, filtered, and followed as they come.

    GET /v1/trace?grep=TEXT&limit=N&follow=true      every line a caller may see
    GET /v1/jobs/{id}/events?follow=true             one job's lines; a follow ends with the job

Both answer NDJSON (one JSON trace line per line), from the in-memory ring that
logging.render() feeds (trace_ring). A caller sees the daemon's own lines and those about
its own uid; root and the admin group see all (access.may_see). A follow polls the ring
every POLL_S and ends when the daemon drains, so it never holds a shutdown up.

`follow` is read from the query string, not declared: the OpenAPI document (which the fuzzer
reads whole, response by response) describes the finite answer; a follow never ends by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.peer import peer_of
from taogpud.daemon.state import DaemonState, Phase
from taogpud.jobs.access import check_access, may_see
from taogpud.observability import trace
from taogpud.observability.trace_ring import RING, RING_LINES, TraceLine

router = APIRouter(tags=["trace"])
NDJSON = "application/x-ndjson"
POLL_S = 0.1
FINAL_EVENTS = {f"job.{state}" for state in ("succeeded", "failed", "cancelled", "timed_out")}
FINAL_EVENTS |= {"job.interrupted"}

Keep = Callable[[TraceLine], bool]
Limit = Annotated[int, Query(ge=1, le=RING_LINES)]


@router.get(wire.TRACE.path, response_class=StreamingResponse)
async def read_trace(
    request: Request,
    daemon: Daemon,
    grep: Annotated[str | None, Query(max_length=200)] = None,
    limit: Limit = 1000,
) -> StreamingResponse:
    """The last `limit` lines holding `grep`; `?follow=true` keeps the answer open for more."""
    peer = peer_of(request)
    follow = following(request)
    needle = grep.encode() if grep else b""

    def keep(item: TraceLine) -> bool:
        return may_see(peer, item.uid) and needle in item.line

    return StreamingResponse(_lines(daemon, keep, limit, follow, None), media_type=NDJSON)


@router.get(wire.JOB_EVENTS.path, response_class=StreamingResponse)
async def job_events(
    job_id: str, request: Request, daemon: Daemon, limit: Limit = 1000
) -> StreamingResponse:
    """The job's lines; `?follow=true` keeps the answer open until the job's last line."""
    follow = following(request)
    job = daemon.scheduler.get(job_id)  # job_not_found for an unknown id
    check_access(job, peer_of(request), "read the trace of")

    def keep(item: TraceLine) -> bool:
        return item.job_id == job_id

    def ended(item: TraceLine) -> bool:
        return orjson.loads(item.line).get("event") in FINAL_EVENTS

    ends = ended if not job.status.finished else None  # a finished job: its backlog, then the end
    return StreamingResponse(
        _lines(daemon, keep, limit, follow and ends is not None, ends), media_type=NDJSON
    )


def following(request: Request) -> bool:
    return request.query_params.get("follow", "false").lower() in ("true", "1", "yes")


async def _lines(
    daemon: DaemonState,
    keep: Keep,
    limit: int,
    follow: bool,
    ends: Callable[[TraceLine], bool] | None,
) -> AsyncIterator[bytes]:
    """The last `limit` kept lines; then, following, new ones until `ends` or a drain."""
    trace.flush()  # the deferred lines first: whatever an earlier answer showed is read here
    seq = RING.last_seq()
    backlog = [item for item in RING.after(0) if item.seq <= seq and keep(item)][-limit:]
    for item in backlog:
        yield item.line + b"\n"
        if ends is not None and ends(item):
            return
    while follow and daemon.status.phase is Phase.ready:
        await asyncio.sleep(POLL_S)
        for item in RING.after(seq):
            seq = item.seq
            if keep(item):
                yield item.line + b"\n"
                if ends is not None and ends(item):
                    return
