"""The FastAPI application: routers, the one error shape, body limits, the request trace."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taogpud import __version__, relay, wire
from taogpud.api import arrays, channel, config, doctor, jobs, system
from taogpud.api import trace as trace_api
from taogpud.api.peer import peer_in
from taogpud.daemon.state import DaemonState
from taogpud.errors import BodyTooLarge, ErrorBody, TaogpudError
from taogpud.logging import get_logger, request_trace_enabled

log = get_logger("taogpud.api")

HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def create_app(state: DaemonState) -> FastAPI:
    app = FastAPI(
        title="taogpud",
        version=__version__,
        openapi_url=wire.OPENAPI.path,
        docs_url=None,
        redoc_url=None,
    )
    app.state.daemon = state
    for module in (jobs, system, arrays, config, channel, doctor, trace_api):  # jobs first
        app.include_router(module.router)
    app.add_exception_handler(TaogpudError, _taogpud_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(BodyLimit, state=state)
    app.add_middleware(RequestTrace)
    relay.mount(app, state)  # /relay/... (the AI channel, taogpud.relay) and /v1/relay/...
    return app


def error_response(status: int, body: ErrorBody) -> JSONResponse:
    return JSONResponse(body.as_dict(), status_code=status)


async def _taogpud_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TaogpudError)
    return error_response(exc.http_status, exc.body())


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [_describe(error) for error in exc.errors()]
    content_type = request.headers.get("content-type", "")
    has_body = request.headers.get("content-length", "0") != "0"
    if has_body and "json" not in content_type and "octet" not in content_type:
        problems.insert(0, f"the body must be JSON sent as application/json (got {content_type!r})")
    body = ErrorBody(
        "invalid_request",
        "; ".join(problems),
        "see GET /v1/openapi.json for the request shapes",
    )
    return error_response(422 if any("body" in p for p in problems) else 400, body)


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    return f"{where}: {error.get('msg', 'invalid')}"


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(
        exc.status_code, ErrorBody(code, message, "the routes are in GET /v1/openapi.json")
    )


CLIENT_GONE = 499  # as nginx logs it: the client closed the connection before the answer


async def _client_gone(request: Request, _: Exception) -> Response:
    """The client hung up mid-body: nothing to answer and nothing wrong here, one info line.
    (Left to the catch-all handler it was an error with a traceback, and uvicorn's second.)"""
    uid = peer_in(request.scope).uid
    log.info("api.client_gone", method=request.method, path=request.url.path, uid=uid)
    return Response(status_code=CLIENT_GONE)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return internal_error(request.url.path, exc)


def internal_error(path: str, exc: Exception) -> JSONResponse:
    """A bug: logged with its traceback (call from the except block), answered as a 500."""
    log.exception("api.unexpected_error", path=path)
    body = ErrorBody(
        "internal_error",
        f"{type(exc).__name__}: {exc}",
        "this is a bug in taogpud; the log has the traceback",
    )
    return error_response(500, body)


class BodyLimit:
    """Refuse bodies past the limit before reading them: JSON routes small, array uploads large.

    Not FastAPI's max_body_size: when Content-Length is over its limit it replaces any
    response with a plain-text 413, so the error would lose the {code, message, hint} shape.
    """

    def __init__(self, app: ASGIApp, state: DaemonState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = (
            self.state.max_upload_bytes
            if scope["path"] == "/v1/arrays"
            else self.state.max_json_bytes
        )
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            body = ErrorBody(
                "body_too_large",
                f"the request body has {declared} bytes; the limit for {scope['path']} is {limit}",
                "send less, or upload arrays through POST /v1/arrays",
            )
            await error_response(413, body)(scope, receive, send)
            return
        await self.app(scope, _counting(receive, limit), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _counting(receive: Receive, limit: int) -> Receive:
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


class RequestTrace:
    """One JSON line per API request when logging.requestTrace is on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not request_trace_enabled():
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            if status != CLIENT_GONE:  # api.client_gone said it: one line for a hang-up
                log.info(
                    "api.request",
                    method=scope["method"],
                    path=scope["path"],
                    status=status,
                    duration_ms=round((time.perf_counter() - started) * 1e3, 3),
                    uid=peer_in(scope).uid,
                )
