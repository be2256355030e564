"""How a Client reaches the daemon: one exchange at a time, behind one small interface.

As httpx's transports (`BaseTransport.handle_request`, with `MockTransport` beside the real
one), a transport does one request and hands back the answer; everything else (routes, JSON,
the error shape, waiting) is the Client's.

    Transport            request(method, path, body, content_type, timeout_s) -> (status, body)
      UnixHTTPConnection   client/http.py: HTTP/1.1 over the daemon's Unix socket (the default)
      MockTransport        a handler(Request) -> Response in this process, for tests of code
                           that uses the client

What a transport raises, and what the Client makes of it:

    ConnectionError      refused, hung up            DaemonUnreachable
    OSError              missing, denied, timed out  DaemonUnreachable
    MalformedResponse    an answer that is not HTTP  ApiError("bad_response")

A status of 400 or more is an answer, not an exception: the Client reads the error shape
({code, message, hint}) from its body.
"""

from __future__ import annotations

import json as stdlib_json
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl

# A transport raises it (drawn in taogpud/errors.py); `as` re-exports it for transports.
from taogpud.errors import MalformedResponse as MalformedResponse  # noqa: PLC0414

Part = bytes | bytearray | memoryview
RequestBody = Part | Sequence[Part] | None  # a sequence is sent part by part, uncopied


class Transport(Protocol):
    def request(
        self, method: str, path: str, body: RequestBody, content_type: str, timeout_s: float
    ) -> tuple[int, bytes]:
        """One exchange: `path` holds the query; `timeout_s` bounds the wait for the answer."""
        ...

    def close(self) -> None:
        """Let go of any connection; the next request may open a new one."""
        ...


class Request:
    """A request as a MockTransport's handler sees it: the body joined into bytes."""

    __slots__ = ("body", "content_type", "method", "path")

    def __init__(self, method: str, path: str, body: bytes = b"", content_type: str = "") -> None:
        self.method = method
        self.path = path  # as sent: "/v1/jobs?wait_s=1.000"
        self.body = body
        self.content_type = content_type  # "" when there is no body

    @classmethod
    def sent(cls, method: str, path: str, body: RequestBody, content_type: str) -> Request:
        """The request a transport was asked to send, its body joined."""
        if body is None:
            return cls(method, path)
        joined = bytes(body) if isinstance(body, bytes | bytearray | memoryview) else b"".join(body)
        return cls(method, path, joined, content_type)

    @property
    def route(self) -> str:
        """The path without its query: "/v1/jobs"."""
        return self.path.partition("?")[0]

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.path.partition("?")[2]))

    def json(self) -> Any:
        return stdlib_json.loads(self.body)

    def __repr__(self) -> str:
        return f"Request({self.method!r}, {self.path!r}, {len(self.body)} bytes)"


class Response:
    """What a handler answers: a status and a body, given as bytes or as `json=`."""

    __slots__ = ("body", "status")

    def __init__(self, status: int = 200, body: bytes = b"", *, json: Any = None) -> None:
        self.status = status
        self.body = body if json is None else stdlib_json.dumps(json).encode()

    def __repr__(self) -> str:
        return f"Response({self.status}, {len(self.body)} bytes)"


Handler = Callable[[Request], Response]


class MockTransport:
    """Answers every request with `handler(request)`, in this process; nothing is opened.

    The handler raises what a socket would to play a daemon that is not there:
    ConnectionRefusedError (nothing listening), TimeoutError (silent), FileNotFoundError
    (no socket); the Client turns each into DaemonUnreachable as it does for the real one."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def request(
        self, method: str, path: str, body: RequestBody, content_type: str, timeout_s: float
    ) -> tuple[int, bytes]:
        response = self.handler(Request.sent(method, path, body, content_type))
        return response.status, response.body

    def close(self) -> None:
        """Nothing to let go of."""
