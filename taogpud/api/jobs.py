"""Jobs: submit, list, get, wait, cancel, download an output."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import Field, TypeAdapter, ValidationError

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.direct import add_direct_route, daemon_of, json_body
from taogpud.api.models import JobRequestModel
from taogpud.api.peer import peer_of
from taogpud.daemon.state import DaemonState
from taogpud.errors import OutputNotFound
from taogpud.jobs.access import check_access, view_of
from taogpud.jobs.records import JobRecord, JobState, Peer

router = APIRouter(tags=["jobs"])

MAX_WAIT_S = wire.MAX_WAIT_S  # one long-poll; clients loop for longer waits
JSON = "application/json"
WAIT_S = TypeAdapter(Annotated[float, Field(ge=0, le=MAX_WAIT_S)])
WAIT_S_PARAMETER = {  # the query parameter as OpenAPI shows it (submit parses it itself)
    "name": "wait_s",
    "in": "query",
    "required": False,
    "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
    "description": "answer once the job finished, or after this many seconds",
}


async def _job_request(request: Request) -> wire.JobRequest:
    return (await json_body(request, JobRequestModel)).to_wire()


def _wait_s(request: Request) -> float:
    """`wait_s` from the query, validated as FastAPI would and with its error, but without
    its parameter machinery: measured in-process, the submit route took 40–60 µs less
    without it (with the job routes matched first, api/app.py)."""
    raw = _query_value(request, "wait_s")
    if raw is None:
        return 0.0
    try:
        return WAIT_S.validate_python(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("query", "wait_s")} for e in exc.errors(include_url=False)]
        ) from None


def _query_value(request: Request, name: str) -> str | None:
    """The value of `name` in the query string (the last, as Starlette's `query_params`
    gives it), read with the standard library: `query_params` builds a multi-dict of the
    whole query for one value."""
    query = request.scope["query_string"]
    found = None
    if query:
        for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if key == name:
                found = value
    return found


async def _wait(daemon: DaemonState, job_id: str, wait_s: float) -> None:
    """Until the job finished, wait_s passed, or the server began to stop (end_waits)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s) as deadline:
            daemon.waits.add(deadline)
            try:
                await daemon.store.finished(job_id)  # bounded by this deadline alone
            finally:
                daemon.waits.discard(deadline)


def end_waits(daemon: DaemonState) -> None:
    """The server is stopping: every request still waiting for a job is answered now, with
    the job as it is (queued jobs stay queued for the next start)."""
    now = asyncio.get_running_loop().time()
    for deadline in list(daemon.waits):
        deadline.reschedule(now)


def _job_response(daemon: DaemonState, job: JobRecord) -> Response:
    """The job as it stands, committed first (JobStore.tell)."""
    return daemon.store.tell(lambda: Response(job.model_dump_json(), media_type=JSON))


async def submit(request: Request) -> Response:
    # Every job comes this way: the query and body are validated in one pydantic call each
    # instead of through FastAPI's parameter and body machinery.
    daemon = daemon_of(request)
    wait_s = _wait_s(request)
    job = daemon.scheduler.submit(await _job_request(request), peer_of(request))
    if wait_s:
        await _wait(daemon, job.id, wait_s)
    record = daemon.scheduler.commit(job.id)  # stored before its id is returned
    return Response(record, status_code=201, media_type=JSON)


def add_submit_route(app: FastAPI) -> None:
    """POST /v1/jobs, a direct route (api/direct.py): every job comes this way."""
    add_direct_route(
        app,
        wire.SUBMIT_JOB,
        submit,
        JobRequestModel,
        status_code=201,
        response_model=JobRecord,
        tags=["jobs"],
        parameters=[WAIT_S_PARAMETER],
    )


# Everyone sees every job; another user's without what it holds (access.view_of).


@router.get(wire.LIST_JOBS.path, response_model=list[JobRecord])
async def list_jobs(
    request: Request,
    daemon: Daemon,
    status: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=wire.MAX_LIST_LIMIT)] = 100,
) -> Response:
    peer = peer_of(request)
    return daemon.store.tell(lambda: _jobs_response(daemon, peer, status, limit))


def _jobs_response(
    daemon: DaemonState, peer: Peer, status: JobState | None, limit: int
) -> Response:
    jobs = [view_of(job, peer) for job in daemon.store.recent(status, limit)]
    body = b"[" + b",".join(job.model_dump_json().encode() for job in jobs) + b"]"
    return Response(body, media_type=JSON)


@router.get(wire.GET_JOB.path, response_model=JobRecord)
async def get_job(job_id: str, request: Request, daemon: Daemon) -> Response:
    return _job_response(daemon, view_of(daemon.scheduler.get(job_id), peer_of(request)))


@router.get(wire.WAIT_JOB.path, response_model=JobRecord)
async def wait_job(
    job_id: str,
    request: Request,
    daemon: Daemon,
    timeout_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 30.0,
) -> Response:
    job = daemon.scheduler.get(job_id)
    await _wait(daemon, job_id, timeout_s)
    return _job_response(daemon, view_of(job, peer_of(request)))


@router.post(wire.CANCEL_JOB.path, response_model=JobRecord)
async def cancel_job(job_id: str, request: Request, daemon: Daemon) -> Response:
    job = daemon.scheduler.cancel(job_id, peer_of(request))
    await daemon.store.wait(job_id, 10.0)  # a running job stops at its next check
    return _job_response(daemon, job)


class OutputFileResponse(FileResponse):
    """Starlette reads a file in 64 KiB pieces, each through a worker thread: a 512 MiB
    output was 8,192 thread hops and 0.33–0.57 GiB/s here. In 1 MiB pieces it ran 1.37 GiB/s,
    as fast as a raw socket into new memory (bench/run.py, data path); 4 MiB was no faster.
    (uvicorn offers no `http.response.pathsend`, so Starlette cannot sendfile.)"""

    chunk_size = 1 << 20


@router.get(
    wire.JOB_OUTPUT.path,
    responses={200: {"content": {"application/octet-stream": {}}}},
    response_class=FileResponse,  # OutputFileResponse, as OpenAPI sees it
)
async def download_output(
    job_id: str, name: str, request: Request, daemon: Daemon
) -> OutputFileResponse:
    job = daemon.scheduler.get(job_id)
    check_access(job, peer_of(request), "read the outputs of")
    if name not in {output.name for output in job.outputs}:  # also keeps `name` in its folder
        kept = ", ".join(o.name for o in job.outputs) or "none"
        raise OutputNotFound(
            f"job {job_id} has no output named {name!r} (kept: {kept})",
            "submit with keep_outputs (taogpuctl submit --output DIR) to keep outputs",
        )
    path = daemon.scheduler.outputs_dir / job.id / f"{name}.npy"
    if not path.is_file():
        raise OutputNotFound(f"the file of output {name!r} is gone", "its job is past retention")
    return OutputFileResponse(path, media_type="application/octet-stream")
