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
- The job route without a task: a well-formed `POST /v1/jobs` is held back from uvicorn's
  task per request, and once its body is whole `JobSubmits` (api/hot.py) serves it from
  here, answering in one write; anything it does not take starts its task as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from taogpud.api.peer import SCOPE_KEY, read_peer

if TYPE_CHECKING:  # api/hot.py builds on the app, whose upload route builds on this module
    from taogpud.api.hot import JobSubmits, WaitingAnswer

BODY_KEY = "taogpud.body"  # scope["extensions"][BODY_KEY]: this request's BodyTap
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


class DaemonHttpProtocol(HttpToolsProtocol):
    job_submits: JobSubmits | None = None  # set by serving_jobs(): None serves all by ASGI
    _body_sink: Sink | None = None
    _body_seen = 0  # body bytes of this request the parser has passed on
    _body_reader: _BodyReader | None = None  # reading the rest of a body, past the parser
    _held: RequestResponseCycle | None = None  # a job submit whose body is still coming
    _waiting: WaitingAnswer | None = None  # a job submit's answer still to come

    def connection_made(self, transport: Any) -> None:
        self.taogpud_peer = read_peer(transport.get_extra_info("socket"))
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_sink, self._body_seen = None, 0
        extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
        extensions[SCOPE_KEY] = self.taogpud_peer
        extensions[BODY_KEY] = BodyTap(self)

    # -- the job route ----------------------------------------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn calls this when a request's head is read (or when a pipelined one gets
        its turn): a submit the job route takes is held until its body is whole."""
        submits = self.job_submits
        if submits is None or not submits.takes(cycle):
            super()._start_asgi_task(cycle, app)
        elif cycle.more_body:
            self._held = cycle
        else:
            self._serve_job(submits, cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle, self._held = self._held, None
        if cycle is not None and self.job_submits is not None:
            self._serve_job(self.job_submits, cycle, self.app)

    def _serve_job(self, submits: JobSubmits, cycle: RequestResponseCycle, app: Any) -> None:
        to_framework = functools.partial(HttpToolsProtocol._start_asgi_task, self, cycle, app)
        self._waiting = submits.serve(cycle, to_framework)

    def shutdown(self) -> None:
        """The server is stopping: a submit still waiting for its job is answered now, with
        the job as it is (queued jobs stay queued for the next start), then closed."""
        super().shutdown()
        if self._waiting is not None:
            self._waiting.give()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiting is not None:
            self._waiting.drop()  # the job runs on; nobody is left to answer
        super().connection_lost(exc)

    # -- bodies taken as they arrive --------------------------------------------------------

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


def serving_jobs(submits: JobSubmits) -> type[DaemonHttpProtocol]:
    """The protocol class for uvicorn's `http=`, its connections serving the job route."""
    return type("JobServingHttpProtocol", (DaemonHttpProtocol,), {"job_submits": submits})
