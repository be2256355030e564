"""The HTTP protocol the daemon serves with: uvicorn's httptools protocol, plus two things
ASGI cannot give an application.

- Who is calling: SO_PEERCRED, read once per connection (api/peer.py), put into the scope of
  every request the connection carries.
- A body taken as it arrives: an array upload hands the rest of its body to a callback that
  writes each piece straight into the array's shared-memory image. Through ASGI, uvicorn
  appends each piece to a buffer, copies that into a message, and pauses and resumes reading
  around every 64 KiB: for a 512 MiB upload that was most of the daemon's CPU (bench/run.py,
  "Where the time goes"). With a Content-Length, the rest of the body does not go through
  the HTTP parser at all: a buffered protocol reads it from the socket into one reused
  buffer (uvloop would make a new bytes object of every read, and httptools another of
  every piece), then the parser starts afresh for the connection's next request.
- A small response in one write: uvicorn writes the head and the body of a response
  separately, two system calls here and often two reads and two wake-ups for the client.
  The job route (api/hot.py) gathers them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from taogpud.api.peer import SCOPE_KEY, read_peer

BODY_KEY = "taogpud.body"  # scope["extensions"][BODY_KEY]: this request's BodyTap
WRITES_KEY = "taogpud.writes"  # scope["extensions"][WRITES_KEY]: the connection's GatheredWrites
Sink = Callable[[bytes | memoryview], None]  # must not keep the piece: its buffer is reused
BODY_BUFFER_BYTES = 1 << 20


class BodyTap:
    """Lets a request's handler take the rest of its body as it arrives."""

    def __init__(self, protocol: DaemonHttpProtocol) -> None:
        self._protocol = protocol

    @contextlib.contextmanager
    def diverted(self, sink: Sink) -> Iterator[None]:
        """Within the block every new piece of the body goes to `sink`, starting with what
        uvicorn had buffered since the handler last read; the handler keeps reading its
        ASGI receive (now empty pieces) to learn when the body is complete."""
        self._protocol.divert_body(sink)
        try:
            yield
        finally:
            self._protocol.divert_body(None)


class GatheredWrites:
    """Stands in for the connection's transport: within `gathered()` its writes are held and
    leave as one when the block ends; everything else goes straight to the transport."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._transport.write(data)
        else:
            self._held.append(data)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                self._transport.write(b"".join(held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class DaemonHttpProtocol(HttpToolsProtocol):
    _body_sink: Sink | None = None
    _body_seen = 0  # body bytes of this request the parser has passed on
    _body_reader: _BodyReader | None = None  # reading the rest of a body, past the parser

    def connection_made(self, transport: Any) -> None:
        self.taogpud_peer = read_peer(transport.get_extra_info("socket"))
        super().connection_made(transport)
        self.taogpud_writes = GatheredWrites(transport)
        self.transport = cast(Any, self.taogpud_writes)  # what its request cycles write to

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_sink, self._body_seen = None, 0
        extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
        extensions[SCOPE_KEY] = self.taogpud_peer
        extensions[BODY_KEY] = BodyTap(self)
        extensions[WRITES_KEY] = self.taogpud_writes

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        sink = self._body_sink
        if sink is None or self.cycle.response_complete:
            super().on_body(body)
        else:
            sink(body)

    def divert_body(self, sink: Sink | None) -> None:
        self._body_sink = sink
        if sink is None:
            if self._body_reader is not None:  # the handler left before the body ended
                self._body_reader.abandon()
            return
        buffered = bytes(self.cycle.body)
        self.cycle.body = bytearray()
        if buffered:
            sink(buffered)
        remaining = self._body_remaining()
        if remaining:  # the rest bypasses the parser, which starts afresh once it is read
            self._body_reader = _BodyReader(self, remaining, sink)
            self.transport.set_protocol(self._body_reader)
        self.flow.resume_reading()  # paused when that buffer passed uvicorn's high-water mark

    def _body_remaining(self) -> int:
        """Body bytes still to come, by Content-Length; 0 when there is none (chunked: the
        parser frames it) or the parser has seen it all."""
        if self.cycle.more_body is False:
            return 0
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                return max(int(value) - self._body_seen, 0)
        return 0

    def body_taken(self) -> None:
        """_BodyReader read the last byte: what the parser would say at the body's end."""
        self._body_reader = None
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn does
        self.transport.set_protocol(self)
        self.on_message_complete()


class _BodyReader(asyncio.BufferedProtocol):
    """The connection's protocol while the rest of a body is read: exactly `remaining` bytes
    into one reused buffer, each piece to the sink; then the HTTP protocol again."""

    def __init__(self, http: DaemonHttpProtocol, remaining: int, sink: Sink) -> None:
        self._http = http
        self._remaining = remaining
        self._sink: Sink | None = sink
        self._buffer = memoryview(bytearray(min(remaining, BODY_BUFFER_BYTES)))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer[: self._remaining]  # never a byte of the next request

    def buffer_updated(self, nbytes: int) -> None:
        self._remaining -= nbytes
        if self._sink is None:  # abandoned: the connection is closing
            return
        self._sink(self._buffer[:nbytes])
        if not self._remaining:
            self._http.body_taken()

    def abandon(self) -> None:
        """The handler is gone mid-body (cancelled at shutdown): its sink, which writes to a
        file it has closed, is never called again, and the connection, whose next bytes are
        the rest of that body, is closed."""
        self._sink = None
        self._http.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._http.connection_lost(exc)  # the handler sees the client hang up

    def pause_writing(self) -> None:
        self._http.pause_writing()

    def resume_writing(self) -> None:
        self._http.resume_writing()
