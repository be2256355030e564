"""HTTP/1.1 over the daemon's Unix socket: the Python client's default transport
(client/transport.py).

A request goes out in one send (two for an array upload: the head, then the array's own
memory); the response is parsed by httptools, the C parser uvicorn runs on the daemon side.
The head is peeked first, so that a large body can then be read whole into one buffer.
Why not http.client: it parses every response head through the email package, which was
most of its ~150 µs of CPU per tiny job here (cProfile over 2,000 submits); bench/run.py
measures the difference end to end.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import NoReturn

import httptools

from taogpud.client.transport import Part, RequestBody
from taogpud.errors import MalformedResponse
from taogpud.i18n import http_tag, user_language

RECV_BYTES = 256 * 1024
ONE_SEND_BYTES = 64 * 1024  # a smaller body is joined to the head: one send, one segment
LARGE_BODY_BYTES = 1 << 20  # a body this big is read into its own buffer, not via the parser


class _Response:
    """What httptools reports while it parses one response."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.started = False
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.length: int | None = None
        self.parts: list[bytes] = []

    def on_message_begin(self) -> None:
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-length" and value.strip().isdigit():
            self.length = int(value)

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # only valid in this callback

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def large_body_follows(self) -> bool:
        return self.head_done and (self.length or 0) >= LARGE_BODY_BYTES


class UnixHTTPConnection:
    """One keep-alive HTTP/1.1 connection to a Unix socket (a client/transport.py Transport).
    Not thread-safe."""

    def __init__(self, socket_path: str, timeout_s: float) -> None:
        self.socket_path = socket_path
        self.sock: socket.socket | None = None
        self._timeout_s = timeout_s
        self._buffer = bytearray(RECV_BYTES)
        self._view = memoryview(self._buffer)
        # The user's language, for the daemon's human message and hint (codes stay English).
        tag = http_tag(user_language())
        self._language = f"Accept-Language: {tag}\r\n" if tag else ""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def request(
        self, method: str, path: str, body: RequestBody, content_type: str, timeout_s: float
    ) -> tuple[int, bytes]:
        """(status, body); a kept-alive connection the daemon closed is reopened once.

        Raises ConnectionError when the socket refused or the daemon hung up, OSError (a
        TimeoutError included) when the socket failed, MalformedResponse on garbage. The retry
        covers the idle-close race only: on a fresh connection a refused or missing socket is
        final, and a request the daemon read and then dropped without answering means the
        daemon itself went away (the reconnect then fails)."""
        if self.sock is None:
            return self._exchange(method, path, body, content_type, timeout_s)
        try:
            return self._exchange(method, path, body, content_type, timeout_s)
        except ConnectionError:
            self.close()
        return self._exchange(method, path, body, content_type, timeout_s)

    def _exchange(
        self, method: str, path: str, body: RequestBody, content_type: str, timeout_s: float
    ) -> tuple[int, bytes]:
        sock = self._connected(timeout_s)
        parts = _parts(body)
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{self._language}"
        if body is not None:
            length = sum(memoryview(part).nbytes for part in parts)
            head += f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n"
        encoded = (head + "\r\n").encode("latin-1")
        if len(parts) == 1 and memoryview(parts[0]).nbytes <= ONE_SEND_BYTES:
            sock.sendall(encoded + bytes(parts[0]))
        else:
            sock.sendall(encoded)
            for part in parts:
                sock.sendall(part)
        return self._response(sock)

    def _connected(self, timeout_s: float) -> socket.socket:
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(self.socket_path)
            except BaseException:
                sock.close()
                raise
            self.sock, self._timeout_s = sock, timeout_s
        elif timeout_s != self._timeout_s:  # settimeout is a system call: only on a change
            self.sock.settimeout(timeout_s)
            self._timeout_s = timeout_s
        return self.sock

    def _response(self, sock: socket.socket) -> tuple[int, bytes]:
        response = _Response()
        peeked = self._receive(sock, response, socket.MSG_PEEK)
        self._parse(response, peeked)
        head_end = self._buffer.find(b"\r\n\r\n", 0, peeked)
        if response.large_body_follows() and head_end >= 0:
            sock.recv_into(self._buffer, head_end + 4, socket.MSG_WAITALL)  # the head alone
            body = self._large_body(sock, response)
        else:
            sock.recv_into(self._buffer, peeked, socket.MSG_WAITALL)  # what the parser saw
            while not response.complete:
                self._parse(response, self._receive(sock, response))
            body = b"".join(response.parts)
        if not response.keep_alive:
            self.close()
        return response.parser.get_status_code(), body

    def _receive(self, sock: socket.socket, response: _Response, flags: int = 0) -> int:
        received = sock.recv_into(self._buffer, 0, flags)
        if received == 0:
            self._hung_up(response)
        return received

    def _parse(self, response: _Response, received: int) -> None:
        try:
            response.parser.feed_data(self._view[:received])
        except httptools.HttpParserError as exc:
            self.close()
            raise MalformedResponse(f"{type(exc).__name__}: {exc}") from None

    def _large_body(self, sock: socket.socket, response: _Response) -> bytes:
        """A big body, still queued on the socket (the head was peeked, then only it taken):
        read into one bytes object of its announced size. A bytearray of that size would be
        zero-filled first, which cost more than the copy itself here (270 ms for 512 MiB)."""
        assert response.length is not None
        with sock.makefile("rb") as reader:  # closing the reader leaves the socket open
            body = reader.read(response.length)
        if len(body) < response.length:
            self._hung_up(response)
        return body

    def _hung_up(self, response: _Response) -> NoReturn:
        self.close()
        if not response.started:  # the kept-alive race: the caller may reconnect once
            raise ConnectionResetError("the daemon closed the connection before answering")
        raise MalformedResponse("the connection closed in the middle of a response")


def _parts(body: RequestBody) -> Sequence[Part]:
    if body is None:
        return ()
    if isinstance(body, bytes | bytearray | memoryview):
        return (body,)
    return body
