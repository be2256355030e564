"""The API's edge: one pure ASGI middleware for what every request passes through.

- Body limits: a body past its route's limit is refused before it is read (JSON routes
  small, array uploads large), in the one error shape. Not FastAPI's `max_body_size`: when
  Content-Length is over it, it answers a plain-text 413, without {code, message, hint}. A
  body that declares its length is held to it by the HTTP parser, so only a chunked body,
  which declares none, is counted as it comes.
- The request trace: one `api.request` line per request when logging.requestTrace is on
  (at debug for an answered request, at info for a refused one: answered ones outnumbered
  the job lines in the journal), written after the answer, in one write with its job's own
  lines (trace.deferred).
- The moment to write trace lines: when the last request in hand has been answered, the
  daemon has nothing else to do until the next one comes, so the pending lines go then
  (trace.flush), while the client reads its answer. Left to trace's timer alone (1 ms after
  the first line) they were written in the middle of the next job in a sequential client's
  run: before its route ran (one job in ten) or between its result and its answer (one in
  five), marks in each process said. Under load a request is always in hand, and the timer
  batches them as before.

One layer, not two (RequestTrace and BodyLimit were each a middleware): every layer is a
coroutine and a call per request, and under 8 clients the daemon's event loop is the
bottleneck (docs/performance.md).
"""

from __future__ import annotations

import time
from typing import Protocol

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taogpud import wire
from taogpud.errors import BodyTooLarge, ErrorBody
from taogpud.host.unix_socket import peer_in
from taogpud.observability import trace
from taogpud.observability.logging import enabled, request_trace_enabled

CLIENT_GONE = 499  # as nginx logs it: the client closed the connection before the answer
UPLOAD_PATH = wire.UPLOAD_ARRAY.path


class BodyLimits(Protocol):
    """The request body caps (the daemon's Limits, daemon/state.py), read at each request."""

    @property
    def max_json_bytes(self) -> int: ...

    @property
    def max_upload_bytes(self) -> int: ...


class ApiEdge:
    """Body limits and the request trace, in front of the FastAPI app."""

    def __init__(self, app: ASGIApp, state: BodyLimits) -> None:
        self.app = app
        self.state = state
        self.in_hand = 0  # requests taken and not yet answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_hand += 1
        traced = request_trace_enabled()
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._limited(scope, receive, send_with_status if traced else send)
        finally:
            self.in_hand -= 1
            level = "info" if status >= 400 else "debug"  # answered: a debug line
            # Not made at all below the level: dropped by filter_level, it cost 3 of a
            # program's 0.9 ms (8 submitters of `true`, bench/results/programs.md).
            if traced and status != CLIENT_GONE and enabled(level):  # api.client_gone said it
                trace.deferred(
                    level,
                    "api.request",
                    method=scope["method"],
                    path=scope["path"],
                    status=status,
                    duration_ms=round((time.perf_counter() - started) * 1e3, 3),
                    uid=peer_in(scope).uid,
                )
            if not self.in_hand:  # nothing to do until the next request: the lines' moment
                trace.flush()

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with the body held to the route's limit."""
        path = scope["path"]
        limit = self.state.max_upload_bytes if path == UPLOAD_PATH else self.state.max_json_bytes
        declared = content_length(scope)
        if declared is None:
            await self.app(scope, counting(receive, limit), send)
        elif declared > limit:
            await _refuse(scope, receive, send, declared, limit)
        else:
            await self.app(scope, receive, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, declared: int, limit: int) -> None:
    body = ErrorBody(
        "body_too_large",
        f"the request body has {declared} bytes; the limit for {scope['path']} is {limit}",
        "send less, or upload arrays through POST /v1/arrays",
    )
    await JSONResponse(body.as_dict(), status_code=413)(scope, receive, send)


def content_length(scope: Scope) -> int | None:
    """The declared body length; None for none (chunked) or one that is not a number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def counting(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise BodyTooLarge(  # a chunked body, which declares no length to refuse it by
                f"the request body passed the limit of {limit} bytes",
                "send less, or upload arrays through POST /v1/arrays",
            )
        return message

    return wrapped
