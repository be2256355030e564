"""The HTTP side of the door policy: uvicorn's httptools protocol, passed with uvicorn's
public `http=` option, holding every request on every HTTP door (the control socket, the
relay's TCP port) to the same bounds, before the application sees a byte of it.

- Who is calling: SO_PEERCRED, read once in `connection_made` (unix_socket.py) and added to
  the app state that uvicorn copies into every request's scope (`scope["state"]`, the ASGI
  lifespan-state extension); handlers read it with `peer_of(request)`. A TCP peer has none.
- Connections (doors/policy.py): one over a cap is answered 503 and closed at once, before
  uvicorn ever sees it. uvicorn's own `limit_concurrency` cannot do this: it answers 503 per
  request and keeps the connection, and its file descriptor, open.
- Request heads: MAX_HEAD_BYTES in all and MAX_LINE_BYTES a line, or a 431 and the
  connection closes; a head not complete within `server.head_timeout_s` of its first byte
  (or of the connection) closes the connection. httptools has no head limit of its own
  (h11's is `h11_max_incomplete_event_size`; uvicorn's httptools path has none), so this
  class counts: in `data_received` the parser is fed no more of an unfinished head than
  its room, so no oversized head is ever buffered, and each line is measured as the
  parser hands it over (`on_url`, `on_header`). The bytes of a pipelined head that starts
  inside the same read as the request before it are not counted: one read at most.
  Two `Host` headers: 400 (which one would a proxy in front have read?).
- Request bodies: a Content-Length over the door's body limit is answered 413 when the head
  ends, before the application runs or a byte of the body is read; a chunked body is counted
  as it comes and cut at the limit; a body not whole within `server.body_timeout_s` of its
  head is answered 408 (or, once an answer has begun, cut). Finer limits per route stay the
  application's (api/edge.py); uvicorn buffers no more than its high-water mark of a body
  the application has not asked for.
- Between requests, uvicorn's `timeout_keep_alive` closes an idle connection.
- Each refusal is counted and logged as a summary (doors/noise.py), never a line each.
- One write per answer: uvicorn's head and body writes are joined, and sent as soon as the
  body is written (OneWritePerTurn).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, cast

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from taogpud.doors.policy import Door, Doors, Ticket
from taogpud.errors import ErrorBody, Refused
from taogpud.host.unix_socket import PEER_KEY, read_peer

MAX_HEAD_BYTES = 64 * 1024
MAX_LINE_BYTES = 8 * 1024
TICKET_KEY = "taogpud_door_ticket"  # scope["state"][TICKET_KEY]: the connection's place
REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class DoorHttpProtocol(HttpToolsProtocol):
    doors: Doors  # set by http_protocol(): one class per door
    door: Door

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # This connection's own copy: uvicorn copies it into each request's scope.
        self._connection_state = dict(app_state)
        super().__init__(config, server_state, self._connection_state, _loop)
        self._ticket: Ticket | None = None  # None: refused, or gone
        self._head_open = True  # a request head is being read (or awaited)
        self._head_seen = 0
        self._url_seen = 0
        self._hosts = 0
        self._declared: int | None = None  # the head's Content-Length
        self._body_seen = 0
        self._written_at_head = 0
        self._timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, ErrorBody] | None = None  # said when the parser stops
        self._cut = False  # answered by the door itself: the parser's callbacks do nothing

    # -- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        peer = read_peer(transport.get_extra_info("socket"))
        self._ticket = self.doors.guard.admit(peer, self.door)
        if self._ticket is None:
            transport.write(answer(503, too_many(peer.uid)))
            transport.close()
            return
        self._connection_state[PEER_KEY] = peer
        self._connection_state[TICKET_KEY] = self._ticket
        # A stand-in with the transport's whole interface (writes joined, the rest its own).
        super().connection_made(cast(asyncio.Transport, OneWritePerTurn(transport)))
        self._start_timer(self._caps().head_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ticket is None:  # refused in connection_made: uvicorn never saw it
            return
        self._ticket.release()
        self._ticket = None
        self._stop_timer()
        super().connection_lost(exc)

    def _caps(self) -> Any:
        return self.doors.caps()

    def _uid(self) -> int | None:
        return self._ticket.peer.uid if self._ticket else None

    # -- the head ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._ticket is None or self._cut:
            return
        if not self._head_open:
            super().data_received(data)
            return
        room = max(MAX_HEAD_BYTES - self._head_seen, 0)
        self._head_seen += len(data)
        if len(data) <= room:
            super().data_received(data)
            return
        super().data_received(data[:room])
        if self.transport.is_closing() or self._cut:
            return
        if self._head_open:
            self._refuse(431, head_too_large(f"the request head passed {MAX_HEAD_BYTES} bytes"))
            return
        super().data_received(data[room:])

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._url_seen = self._hosts = self._body_seen = 0
        self._declared = None
        if self._timer is None:  # a keep-alive connection's next request
            self._start_timer(self._caps().head_timeout_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        self._url_seen += len(url)
        if self._url_seen > MAX_LINE_BYTES:
            self._refusal = (431, head_too_large(f"the request line passed {MAX_LINE_BYTES} bytes"))
            raise Refused
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 4 > MAX_LINE_BYTES:  # "name: value\r\n"
            what = f"the header {name[:64].decode('latin-1')!r} passed {MAX_LINE_BYTES} bytes"
            self._refusal = (431, head_too_large(what))
            raise Refused
        lower = name.lower()
        if lower == b"host":
            self._hosts += 1
        elif lower == b"content-length":
            self._declared = int(value) if value.strip().isdigit() else None
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._cut:
            return
        self._head_open = False
        self._stop_timer()
        self._written_at_head = cast(OneWritePerTurn, self.transport).written
        refusal = self._head_refusal()
        if refusal is not None:
            self._refuse(*refusal)
            return
        self._start_timer(self._caps().body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def _head_refusal(self) -> tuple[int, ErrorBody] | None:
        if self._hosts > 1:
            return 400, two_hosts(self._hosts)
        limit = self.door.body_limit()
        if self._declared is not None and self._declared > limit:
            return 413, body_too_large(f"the request body declares {self._declared} bytes", limit)
        return None

    def on_body(self, body: bytes) -> None:
        if self._cut:
            return
        self._body_seen += len(body)
        limit = self.door.body_limit()
        if self._body_seen > limit:  # a chunked body: no length to refuse it by beforehand
            self._refuse(413, body_too_large("the request body passed its limit", limit))
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._cut:
            return
        self._stop_timer()
        super().on_message_complete()
        self._head_open, self._head_seen = True, 0

    def handle_websocket_upgrade(self) -> None:
        """The connection becomes uvicorn's WebSocket protocol's: the head's and body's clocks
        stop (a session lasts), and its place is given back when that protocol's connection
        is lost (this one's connection_lost is no longer called)."""
        self._stop_timer()
        self._cut = True
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self.ws_protocol_class = _releasing(self.ws_protocol_class, ticket)
        super().handle_websocket_upgrade()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer when the parser stops: ours when a callback here stopped it."""
        if self._refusal is None:
            self.doors.noise.note("info", "door.bad_request", door=self.door.name, uid=self._uid())
            super().send_400_response(msg)
        else:
            self._refuse(*self._refusal)

    def _refuse(self, status: int, body: ErrorBody, event: str = "door.refused") -> None:
        """The door answers for itself (when nothing was answered yet) and hangs up."""
        self._cut = True
        self._stop_timer()
        self.doors.noise.note("info", event, door=self.door.name, uid=self._uid(), code=body.code)
        transport = cast(OneWritePerTurn, self.transport)
        if transport.written == self._written_at_head or self._head_open:
            transport.write(answer(status, body))
        transport.close()

    # -- the clock --------------------------------------------------------------------------

    def _start_timer(self, seconds: float, then: Any) -> None:
        self._stop_timer()
        self._timer = asyncio.get_running_loop().call_later(float(seconds), then)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.doors.noise.note("info", "door.head_timeout", door=self.door.name, uid=self._uid())
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            seconds = self._caps().body_timeout_s
            self._refuse(408, body_too_slow(seconds), "door.body_timeout")


class OneWritePerTurn:
    """The connection's transport, sending a response's head and body in one write.

    uvicorn writes a response's head and its body apart, and uvloop sends each at once: the
    Python client then read the head alone and waited again for the body. Counted with
    strace over 500 tiny jobs, its waits (poll) and reads per job went from 3.8 and 2.8 to 3
    and 2, as with one write; on a shared 2-core host each extra wait is a wake-up that may
    queue behind other work. So a write is held until the next one, which goes out with it
    at once: the head waits for its body, and the body leaves as soon as it is written, before
    the application's middleware has unwound and before the deferred trace lines of the same
    turn are rendered (api/edge.py, trace.py). A write with nothing after it in its turn (a
    head whose body comes later, the last piece of a stream) leaves at the end of the turn.
    Everything but writing and closing is the transport's own.
    """

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self.written = 0  # writes asked for: has an answer begun since a request's head?

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 100 "):  # uvicorn's own 100 Continue is no answer
            self.written += 1
        held = self._held
        if held is None:
            self._held = data
            asyncio.get_running_loop().call_soon(self._flush)
            return
        self._held = None
        if not self._transport.is_closing():
            self._transport.write(held + data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)


def _releasing(base: Any, ticket: Ticket) -> Any:
    """`base` (uvicorn's WebSocket protocol class) releasing `ticket` when its connection ends."""

    def connection_lost(self: Any, exc: Exception | None) -> None:
        ticket.release()
        base.connection_lost(self, exc)

    return type(base.__name__, (base,), {"connection_lost": connection_lost})


def claim_connection(scope: Any, uid: int) -> bool:
    """For an application that learns who a peer without a uid is (the relay, from its
    token): the connection counts against that uid from now on. False at the uid's cap."""
    ticket = scope.get("state", {}).get(TICKET_KEY)
    return not isinstance(ticket, Ticket) or ticket.guard.claim(ticket, uid)


def http_protocol(
    doors: Doors, name: str, sock: Any, body_limit: Any, address: str | None = None
) -> type[DoorHttpProtocol]:
    """The protocol class for uvicorn's `http=` on one listener, registered as a door."""
    door = doors.open(name, "http", sock, body_limit, address)
    quiet_uvicorns_parser_warning()
    return type("DoorHttpProtocol", (DoorHttpProtocol,), {"doors": doors, "door": door})


ABANDONED: contextvars.ContextVar[bool] = contextvars.ContextVar("abandoned", default=False)
UNPARSEABLE = "Invalid HTTP request received."
UNFINISHED = "ASGI callable returned without completing response."


def abandon_response() -> None:
    """The application leaves its answer unfinished on purpose (the relay, when the provider
    hung up mid-body): uvicorn closes the connection, and its error line is not needed, the
    application has said why. Set in the request's own task, which uvicorn logs from."""
    ABANDONED.set(True)


class _CountedElsewhere(logging.Filter):
    """uvicorn's lines for what the doors count or the application said already: a request
    it cannot parse (door.bad_request), an answer left unfinished on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return message != UNPARSEABLE and not (message == UNFINISHED and ABANDONED.get())


def quiet_uvicorns_parser_warning() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _CountedElsewhere) for f in logger.filters):
        logger.addFilter(_CountedElsewhere())


# -- the door's own answers, in the one error shape ------------------------------------------


def too_many(uid: int | None) -> ErrorBody:
    who = f"uid {uid}" if uid is not None else "clients without a uid (TCP, before a token)"
    return ErrorBody(
        "too_many_connections",
        f"{who} have as many connections open as the daemon allows (or the daemon "
        "has as many as it takes in all)",
        "close idle connections; the limits are [server] in config.toml",
    )


def head_too_large(why: str) -> ErrorBody:
    return ErrorBody(
        "head_too_large",
        f"{why} (limits: {MAX_HEAD_BYTES} bytes in all, {MAX_LINE_BYTES} a line)",
        "send fewer or shorter headers; data goes in the body",
    )


def two_hosts(count: int) -> ErrorBody:
    return ErrorBody(
        "duplicate_host", f"the request has {count} Host headers", "send exactly one Host header"
    )


def body_too_large(why: str, limit: int) -> ErrorBody:
    return ErrorBody(
        "body_too_large",
        f"{why}; this listener takes at most {limit} bytes",
        "send less (arrays go through POST /v1/arrays; the relay's limit is [relay] max_body_mb)",
    )


def body_too_slow(seconds: float) -> ErrorBody:
    return ErrorBody(
        "body_timeout",
        f"the request body was not whole {seconds:g} s after its head",
        "send the body at once; the limit is [server] body_timeout_s in config.toml",
    )


def answer(status: int, body: ErrorBody) -> bytes:
    """A whole answer, written before the connection closes."""
    content = orjson.dumps(body.as_dict())
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        REASONS[status],
        len(content),
    )
    return head + b"connection: close\r\n\r\n" + content
