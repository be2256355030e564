"""The API's edge (api/edge.py), as a pure ASGI app in front of a small one: body limits and
the request trace in one layer. The daemon-level checks of both are in test_bad_inputs.py,
test_array_store.py and test_daemon.py; these say what the one layer does with each request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from starlette.types import Message, Receive, Scope, Send

from taogpud.api.edge import CLIENT_GONE, ApiEdge
from taogpud.errors import BodyTooLarge
from taogpud.host.unix_socket import PEER_KEY, PeerCred
from taogpud.observability import trace
from taogpud.observability.logging import set_level, set_request_trace

JSON_LIMIT, UPLOAD_LIMIT = 100, 10_000


@dataclass
class Limits:
    max_json_bytes: int = JSON_LIMIT
    max_upload_bytes: int = UPLOAD_LIMIT


@dataclass
class Seen:
    """What the app behind the edge was given."""

    calls: int = 0
    receive: Receive | None = None
    body: bytes = b""


def app_reading(seen: Seen, status: int = 201) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.calls += 1
        seen.receive = receive
        while True:
            message = await receive()
            seen.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def scope_for(path: str, headers: list[tuple[bytes, bytes]]) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "state": {PEER_KEY: PeerCred(pid=1, uid=1234, gid=1234)},
    }


def pieces(*chunks: bytes) -> Receive:
    """The body as the server hands it over, in these pieces (none: an empty body)."""
    chunks = chunks or (b"",)
    queue = [
        {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
        for n, chunk in enumerate(chunks)
    ]

    async def receive() -> Message:
        return queue.pop(0)

    return receive


async def serve(edge: ApiEdge, scope: Scope, receive: Receive) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await edge(scope, receive, send)
    return sent


@pytest.fixture(autouse=True)
def request_trace_on() -> Any:
    set_request_trace(True)
    yield
    set_request_trace(True)


def test_a_declared_length_over_the_limit_is_413_in_the_one_shape_unread() -> None:
    """Content-Length past the route's limit: a 413 {code, message, hint} and the app is
    never called; /v1/arrays has the upload limit, other routes the JSON one."""
    seen = Seen()
    edge = ApiEdge(app_reading(seen), Limits())
    length = str(JSON_LIMIT + 1).encode()
    sent = asyncio.run(serve(edge, scope_for("/v1/jobs", [(b"content-length", length)]), pieces()))
    assert sent[0]["status"] == 413 and seen.calls == 0
    body = json.loads(sent[1]["body"])
    assert body["code"] == "body_too_large" and str(JSON_LIMIT) in body["message"] and body["hint"]
    upload = scope_for("/v1/arrays", [(b"content-length", length)])
    sent = asyncio.run(serve(edge, upload, pieces(b"x" * (JSON_LIMIT + 1))))
    assert sent[0]["status"] == 201 and seen.calls == 1


def test_a_declared_length_within_the_limit_reaches_the_app_with_the_servers_receive() -> None:
    """The HTTP parser holds a body to the length it declares, so it is not counted again:
    the app reads from the server's own receive."""
    seen = Seen()
    receive = pieces(b'{"task": ', b'"noop"}')
    scope = scope_for("/v1/jobs", [(b"content-length", b"15")])
    asyncio.run(serve(ApiEdge(app_reading(seen), Limits()), scope, receive))
    assert seen.receive is receive and seen.body == b'{"task": "noop"}'


def test_a_chunked_body_is_counted_and_stopped_past_the_limit() -> None:
    """No declared length: the body is counted as it comes and refused once past the limit."""
    seen = Seen()
    edge = ApiEdge(app_reading(seen), Limits())
    chunks = [b"x" * 60, b"x" * 60]
    with pytest.raises(BodyTooLarge, match=f"limit of {JSON_LIMIT} bytes"):
        asyncio.run(serve(edge, scope_for("/v1/jobs", []), pieces(*chunks)))
    assert seen.calls == 1 and seen.body == chunks[0]


@pytest.fixture
def debug_level() -> Iterator[None]:
    """An answered request's line is a debug one, not even made below that level (the edge
    asks first): these tests set the level rather than inherit whatever another test left."""
    set_level("debug")
    yield
    set_level("info")


@pytest.mark.usefixtures("debug_level")
def test_the_request_line_is_written_after_the_answer_with_its_fields() -> None:
    """One api.request line per request, written after the answer, once the edge holds no
    request (with its job's lines): method, path, status, duration_ms and the caller's uid."""
    seen = Seen()
    edge = ApiEdge(app_reading(seen), Limits())
    trace.flush()  # nothing left over from another test

    async def one_request() -> None:
        await serve(edge, scope_for("/v1/jobs", []), pieces(b"{}"))

    with structlog.testing.capture_logs() as logs:
        asyncio.run(one_request())
    assert trace._pending == []  # written as the edge went idle, no timer needed
    [line] = [entry for entry in logs if entry["event"] == "api.request"]
    assert (line["method"], line["path"], line["status"], line["uid"]) == (
        "POST",
        "/v1/jobs",
        201,
        1234,
    )
    assert line["duration_ms"] >= 0


@pytest.mark.usefixtures("debug_level")
def test_lines_wait_while_another_request_is_in_hand() -> None:
    """A request answered while another is still held leaves its line to the timer, or to
    the moment the last one is answered: the daemon is busy, and lines go in batches."""
    gate = asyncio.Event()
    edge_seen = Seen()

    async def slow_or_quick(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        if scope["path"] == "/v1/slow":
            await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        edge_seen.calls += 1

    edge = ApiEdge(slow_or_quick, Limits())
    trace.flush()
    held: dict[str, Any] = {}

    async def two_requests() -> None:
        slow = asyncio.create_task(serve(edge, scope_for("/v1/slow", []), pieces(b"{}")))
        await asyncio.sleep(0)  # the slow one is in hand
        await serve(edge, scope_for("/v1/quick", []), pieces(b"{}"))
        held["after_quick"] = [fields["path"] for _, _, fields in trace._pending]
        gate.set()
        await slow
        held["after_slow"] = list(trace._pending)

    with structlog.testing.capture_logs() as logs:
        asyncio.run(two_requests())
    assert held["after_quick"] == ["/v1/quick"]  # still pending: the slow one was in hand
    assert held["after_slow"] == []  # both written once the last was answered
    paths = [entry["path"] for entry in logs if entry["event"] == "api.request"]
    assert paths == ["/v1/quick", "/v1/slow"] and edge_seen.calls == 2


def test_a_hang_up_and_a_trace_turned_off_write_no_request_line() -> None:
    """A client gone mid-body (499) has its own api.client_gone line, and requestTrace off
    writes none; the request is served the same."""
    seen = Seen()

    async def requests() -> None:
        gone = ApiEdge(app_reading(seen, CLIENT_GONE), Limits())
        await serve(gone, scope_for("/v1/jobs", []), pieces(b"{}"))
        set_request_trace(False)
        await serve(ApiEdge(app_reading(seen), Limits()), scope_for("/v1/jobs", []), pieces())
        await asyncio.sleep(0)

    with structlog.testing.capture_logs() as logs:
        asyncio.run(requests())
    assert seen.calls == 2 and [e for e in logs if e["event"] == "api.request"] == []
