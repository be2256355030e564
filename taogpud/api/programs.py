"""Programs: a user's own process under a lease (docs/programs.md).

The daemon never starts one: the caller queues it (POST /v1/programs), follows its lease
until granted (GET …/lease), starts it itself with the lease's environment, and says so
(POST …/started: the pid is checked to be the caller's and followed with a pidfd); once it
and its descendants are gone, the caller reports how it ended (POST …/exited).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from enum import Enum
from typing import Annotated, Literal

from fastapi import APIRouter, FastAPI, Query, Request, Response

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.direct import add_direct_route, daemon_of, json_body
from taogpud.api.models import (
    LeaseView,
    LogView,
    ProgramExitModel,
    ProgramRequestModel,
    ProgramStartedModel,
)
from taogpud.api.peer import peer_of
from taogpud.daemon.state import DaemonState
from taogpud.jobs.access import check_access
from taogpud.jobs.programs import ProgramExit
from taogpud.jobs.records import JobRecord

TAGS: list[str | Enum] = ["programs"]
router = APIRouter(tags=TAGS)
JSON = "application/json"
Phase = Literal["queued", "granted", "stopping", "ended"]


def add_program_routes(app: FastAPI) -> None:
    """A program's submit and its two reports, direct routes (api/direct.py): with 8
    submitters of short programs they are every request the daemon gets."""
    add_direct_route(
        app,
        wire.SUBMIT_PROGRAM,
        submit_program,
        ProgramRequestModel,
        status_code=201,
        response_model=JobRecord,
        tags=TAGS,
    )
    for route, endpoint, body in (
        (wire.PROGRAM_STARTED, program_started, ProgramStartedModel),
        (wire.PROGRAM_EXITED, program_exited, ProgramExitModel),
    ):
        add_direct_route(app, route, endpoint, body, response_model=JobRecord, tags=TAGS)


async def submit_program(request: Request) -> Response:
    daemon, body = daemon_of(request), await json_body(request, ProgramRequestModel)
    job = daemon.scheduler.submit_program(body.to_wire(), peer_of(request))
    record = daemon.scheduler.commit(job.id)  # stored before its id is returned
    return Response(record, status_code=201, media_type=JSON)


@router.get(wire.PROGRAM_LEASE.path, response_model=LeaseView)
async def follow_lease(
    job_id: str,
    request: Request,
    daemon: Daemon,
    after: Phase | None = None,
    wait_s: Annotated[float, Query(ge=0, le=wire.MAX_WAIT_S)] = 0.0,
) -> LeaseView:
    """The lease now, or once its phase is no longer `after` (at most wait_s from now)."""
    scheduler = daemon.scheduler
    job = scheduler.get(job_id)
    check_access(job, peer_of(request), "follow the lease of")
    if after is not None and scheduler.programs.lease_phase(job) == after:
        await _until_changed(daemon, job_id, wait_s)
    return daemon.store.tell(lambda: _lease_view(daemon, job_id))  # as a restart finds it


def _lease_view(daemon: DaemonState, job_id: str) -> LeaseView:
    scheduler = daemon.scheduler
    job = scheduler.get(job_id)
    return LeaseView(
        phase=scheduler.programs.lease_phase(job),
        queue_position=scheduler.queue.position(job_id),
        job=job.model_dump(mode="json"),
    )


async def _until_changed(daemon: DaemonState, job_id: str, wait_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s) as deadline:
            daemon.waits.add(deadline)  # answered at once when the server stops (end_waits)
            try:
                await daemon.scheduler.programs.lease_change(job_id).wait()
            finally:
                daemon.waits.discard(deadline)


async def program_started(request: Request) -> Response:
    daemon, body = daemon_of(request), await json_body(request, ProgramStartedModel)
    job_id = request.path_params["job_id"]
    job = daemon.scheduler.programs.started(job_id, body.pid, peer_of(request))
    return _committed(daemon, job)


@router.post(wire.PROGRAM_LOG_APPEND.path, status_code=204)
async def append_log(job_id: str, request: Request, daemon: Daemon) -> Response:
    """Output of a detached program, from its supervisor (application/octet-stream)."""
    data = await request.body()
    daemon.scheduler.programs.append_log(job_id, peer_of(request), data)
    return Response(status_code=204)


@router.get(wire.PROGRAM_LOG.path, response_model=LogView)
async def read_log(
    job_id: str,
    request: Request,
    daemon: Daemon,
    offset: Annotated[int, Query(ge=0)] = 0,
    wait_s: Annotated[float, Query(ge=0, le=wire.MAX_WAIT_S)] = 0.0,
) -> LogView:
    """The log from `offset` (at most 1 MiB); with wait_s, once there is more or it ended."""
    scheduler = daemon.scheduler
    job = scheduler.get(job_id)
    check_access(job, peer_of(request), "read the log of")
    logs = scheduler.programs.logs
    if wait_s and logs.size(job_id) <= offset and not job.status.finished:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s) as deadline:
                daemon.waits.add(deadline)
                try:
                    await scheduler.programs.log_growth(job_id).wait()
                finally:
                    daemon.waits.discard(deadline)
    return daemon.store.tell(lambda: _log_view(daemon, job_id, offset))  # `ended`: committed


def _log_view(daemon: DaemonState, job_id: str, offset: int) -> LogView:
    logs = daemon.scheduler.programs.logs
    data = logs.read(job_id, offset)
    ended = daemon.scheduler.get(job_id).status.finished and offset + len(data) >= logs.size(job_id)
    return LogView(data_b64=base64.b64encode(data).decode(), next=offset + len(data), ended=ended)


async def program_exited(request: Request) -> Response:
    daemon, body = daemon_of(request), await json_body(request, ProgramExitModel)
    exit = ProgramExit(body.exit_code, body.signal, body.cancelled, body.not_started, body.pid)
    job = daemon.scheduler.programs.exited(request.path_params["job_id"], peer_of(request), exit)
    return _committed(daemon, job)


def _committed(daemon: DaemonState, job: JobRecord) -> Response:
    """The job's record once committed (JobStore.tell): the text the commit wrote, not a
    second dump."""
    store = daemon.store
    return store.tell(
        lambda: Response(store.written.get(job.id) or job.model_dump_json(), media_type=JSON)
    )
