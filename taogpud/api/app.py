"""The FastAPI application: routers, the one error shape; its edge (api/edge.py) holds the
body limits and the request trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from taogpud import __version__, wire
from taogpud.api import agents, arrays, channel, config, doctor, jobs, programs, system
from taogpud.api import trace as trace_api
from taogpud.api.edge import CLIENT_GONE, ApiEdge
from taogpud.daemon.state import DaemonState
from taogpud.errors import ErrorBody, TaogpudError
from taogpud.host.unix_socket import peer_in
from taogpud.i18n import accepted_language
from taogpud.observability.logging import get_logger
from taogpud.relay import mount as relay_mount

if TYPE_CHECKING:
    from taogpud.relay.forward import Relay

log = get_logger("taogpud.api")

HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def create_app(state: DaemonState, relay: Relay, metrics: CollectorRegistry) -> FastAPI:
    """The API over services built and handed in by the composition step (daemon/compose.py).
    They are put in app.state here and nowhere else, for the request dependencies to read
    (api/deps.py, the relay's routes); nothing reads them back from outside a request."""
    app = FastAPI(
        title="taogpud",
        version=__version__,
        openapi_url=wire.OPENAPI.path,
        docs_url=None,
        redoc_url=None,
        # No OpenTelemetry here (the job and request traces are the record): off, FastAPI
        # asks no provider at each request whether it is configured.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.daemon, app.state.metrics = state, metrics
    jobs.add_submit_route(app)  # every job comes this way: the first route matched
    programs.add_program_routes(app)  # a program's submit and reports (api/direct.py)
    for module in (jobs, programs, system, arrays, config, channel, doctor, trace_api, agents):
        app.include_router(module.router)
    app.add_exception_handler(TaogpudError, _taogpud_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(ApiEdge, state=state.limits)  # body limits and the request trace, one layer
    relay_mount(app, relay)  # /relay/... (the AI channel, taogpud.relay) and /v1/relay/...
    return app


def error_response(status: int, body: ErrorBody) -> JSONResponse:
    return JSONResponse(body.as_dict(), status_code=status)


async def _taogpud_error(request: Request, exc: Exception) -> JSONResponse:
    """The error in the one shape; its message and hint in the request's Accept-Language."""
    assert isinstance(exc, TaogpudError)
    language = accepted_language(request.headers.get("accept-language"))
    return error_response(exc.http_status, exc.body(language))


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
