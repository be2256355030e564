"""NDJSON streams from the daemon (GET /v1/trace, GET /v1/jobs/{id}/events), line by line.

The client's own transport (client/http.py) reads a whole response; a followed trace never
ends, so this reads one line at a time with the standard library's http.client over the
same Unix socket. Its per-response cost does not matter here: one request per command.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from typing import Any

import orjson

from taogpud.errors import ApiError, stream_error


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout_s: float | None) -> None:
        super().__init__("localhost", timeout=timeout_s)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


def stream_lines(socket_path: str, path: str, timeout_s: float | None = None) -> Iterator[Any]:
    """Each JSON line the daemon sends for `path`, parsed, until it ends the response.

    A 4xx/5xx answer raises ApiError from the error body ({code, message, hint})."""
    conn = _UnixConnection(socket_path, timeout_s)
    try:
        conn.request("GET", path, headers={"Accept": "application/x-ndjson"})
        response = conn.getresponse()
        if response.status != 200:
            raise _error(response.status, response.read())
        for raw in response:
            if raw.strip():
                yield orjson.loads(raw)
    finally:
        conn.close()


def _error(status: int, body: bytes) -> ApiError:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    return stream_error(status, parsed, body)
