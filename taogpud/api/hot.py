"""POST /v1/jobs served in front of the framework: the one route every job takes.

Measured with py-spy on a tiny-job stream (bench/run.py's dispatch): FastAPI's middleware,
routing and dependency layers took about 29% of the daemon's CPU per job, more than the
submit itself. Here a well-formed submit goes straight from uvicorn to the scheduler.

Only the happy path is ours. Anything unusual — a query other than `wait_s`, a body that
is not JSON or fails validation — is handed to the FastAPI route in api/jobs.py with the
body replayed, so every error keeps the one shape and wording the rest of the API has, and
the route stays the documented one in the OpenAPI document.
"""

from __future__ import annotations

import contextlib
import math
import time

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taogpud import trace
from taogpud.api.app import error_response, internal_error
from taogpud.api.models import JobRequest
from taogpud.api.peer import SCOPE_KEY
from taogpud.api.protocol import WRITES_KEY, GatheredWrites
from taogpud.errors import TaogpudError
from taogpud.jobs import Peer
from taogpud.logging import request_trace_enabled
from taogpud.state import DaemonState

ROUTE = "/v1/jobs"
MAX_WAIT_S = 60.0  # the same bound the FastAPI route declares for wait_s
JSON_HEADERS = [(b"content-type", b"application/json")]


class HotPath:
    """The outermost ASGI layer: submits go to `_submit`, everything else to the app."""

    def __init__(self, app: ASGIApp, state: DaemonState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == ROUTE and scope["method"] == "POST":
            await self._submit(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        wait_s = _wait_s(scope["query_string"])
        declared = _declared_length(scope)
        if (
            wait_s is None
            or not _is_json(scope)
            or declared is None
            or declared > self.state.max_json_bytes
        ):
            await self.app(scope, receive, send)  # the framework explains what is wrong
            return
        body = await _read_body(receive)
        if body is None:  # the client hung up before its body was whole: nothing to do
            return
        try:
            request = JobRequest.model_validate_json(body)
        except ValidationError:
            await self.app(scope, _replay(body), send)
            return
        try:
            status = await self._answer(request, wait_s, scope, receive, send)
        except Exception as exc:  # the framework's last-resort handler is behind us
            status = 500
            await internal_error(ROUTE, exc)(scope, receive, send)
        if request_trace_enabled():  # after the job's own lines, which wait for the loop
            trace.deferred(
                "info",
                "api.request",
                method="POST",
                path=ROUTE,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1e3, 3),
                uid=_peer(scope).uid,
            )

    async def _answer(
        self, request: JobRequest, wait_s: float, scope: Scope, receive: Receive, send: Send
    ) -> int:
        """Submit, wait when asked, answer; returns the HTTP status sent."""
        daemon = self.state
        try:
            job = daemon.scheduler.submit(request, _peer(scope))
        except TaogpudError as exc:
            await error_response(exc.http_status, exc.body())(scope, receive, send)
            return exc.http_status
        if wait_s:
            await daemon.store.wait(job.id, wait_s)
        written = daemon.store.flush()  # stored before its id is returned
        body = (written.get(job.id) or job.model_dump_json()).encode()
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        with _one_write(scope):  # head and body leave in one write
            await send({"type": "http.response.start", "status": 201, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        return 201


def _wait_s(query: bytes) -> float | None:
    """0.0 for no wait, the seconds asked for, or None when the query is not the plain
    `wait_s=S` this path serves (the framework then explains what is wrong)."""
    if not query:
        return 0.0
    name, _, value = query.partition(b"=")
    if name != b"wait_s" or b"&" in value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and 0 <= seconds <= MAX_WAIT_S else None


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            media_type: bytes = value.split(b";")[0].strip().lower()
            return media_type == b"application/json"
    return False


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (uvicorn frames it by the Content-Length already checked), or None
    when the client hung up first: a cut-off body that happens to parse is not a job."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    """A receive that hands the framework the body this layer already read."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _one_write(scope: Scope) -> contextlib.AbstractContextManager[None]:
    """Gathers the response's writes where the daemon's own protocol serves the request."""
    writes = scope.get("extensions", {}).get(WRITES_KEY)
    return writes.gathered() if isinstance(writes, GatheredWrites) else contextlib.nullcontext()


def _peer(scope: Scope) -> Peer:
    peer = scope.get("extensions", {}).get(SCOPE_KEY)
    return peer if isinstance(peer, Peer) else Peer()
