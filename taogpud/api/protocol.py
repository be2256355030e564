"""The HTTP protocol the daemon serves with: uvicorn's httptools protocol, passed with
uvicorn's public `http=` option, plus who is calling and the bounds every client is held to.

- Who is calling: SO_PEERCRED, read once in `connection_made` (unix_socket.py) and added to
  the app state that uvicorn copies into every request's scope (`scope["state"]`, the ASGI
  lifespan-state extension); handlers read it with `peer_of(request)`.
- Connections, per uid and in all (config `[server]`): one over a cap is answered 503 and
  closed at once, before uvicorn ever sees it, and logged with its uid at most every
  REFUSAL_LOG_EVERY_S per uid. uvicorn's own `limit_concurrency` cannot do this: it answers
  503 per request and keeps the connection, and its file descriptor, open. The daemon
  raised its soft RLIMIT_NOFILE to the hard limit at start, and the cap in all stays
  below half of it.
- Request heads: MAX_HEAD_BYTES in all and MAX_LINE_BYTES a line, or a 431 and the
  connection closes; a head not complete within `server.head_timeout_s` of its first byte
  (or of the connection) closes the connection. httptools has no head limit of its own
  (h11's is `h11_max_incomplete_event_size`; uvicorn's httptools path has none), so this
  class counts: in `data_received` the parser is fed no more of an unfinished head than
  its room, so no oversized head is ever buffered, and each line is measured as the
  parser hands it over (`on_url`, `on_header`). The bytes of a pipelined head that starts
  inside the same read as the request before it are not counted: one read at most.
- Between requests, uvicorn's `timeout_keep_alive` closes an idle connection.
- One write per answer: uvicorn's head and body writes are joined, and sent as soon as the
  body is written (OneWritePerTurn).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from taogpud.config import ServerSection
from taogpud.errors import ErrorBody
from taogpud.jobs import Peer
from taogpud.logging import get_logger
from taogpud.unix_socket import PEER_KEY, read_peer

log = get_logger("taogpud.api")

MAX_HEAD_BYTES = 64 * 1024
MAX_LINE_BYTES = 8 * 1024
REFUSAL_LOG_EVERY_S = 10.0


class HeadTooLarge(Exception):
    """Raised from a parser callback: the parser stops, and uvicorn asks for its 400."""


class ConnectionGuard:
    """Open connections by uid, against the caps the live config sets."""

    def __init__(self, caps: Callable[[], ServerSection], fd_limit: int) -> None:
        self.caps = caps
        self._fd_cap = max(fd_limit // 2, 1)  # the rest for workers, the store, outputs
        self._open: Counter[int | None] = Counter()
        self.total = 0
        self._refused: Counter[int | None] = Counter()  # since the uid's last log line
        self._logged_at: dict[int | None, float] = {}

    def admit(self, peer: Peer) -> bool:
        caps = self.caps()
        total_cap = min(caps.max_connections, self._fd_cap)
        if self.total >= total_cap or self._open[peer.uid] >= caps.max_connections_per_uid:
            self._log_refusal(peer, caps.max_connections_per_uid, total_cap)
            return False
        self._open[peer.uid] += 1
        self.total += 1
        return True

    def release(self, peer: Peer) -> None:
        self._open[peer.uid] -= 1
        if self._open[peer.uid] <= 0:
            del self._open[peer.uid]
        self.total -= 1

    def _log_refusal(self, peer: Peer, per_uid_cap: int, total_cap: int) -> None:
        self._refused[peer.uid] += 1
        now = time.monotonic()
        if now - self._logged_at.get(peer.uid, -REFUSAL_LOG_EVERY_S) < REFUSAL_LOG_EVERY_S:
            return
        self._logged_at[peer.uid] = now
        log.warning(
            "api.connection_refused",
            uid=peer.uid,
            pid=peer.pid,
            open_for_uid=self._open[peer.uid],
            open_total=self.total,
            max_connections_per_uid=per_uid_cap,
            max_connections=total_cap,
            refused=self._refused.pop(peer.uid),  # this one and those not logged before it
        )


class DaemonHttpProtocol(HttpToolsProtocol):
    guard: ConnectionGuard  # set by serving(): one per server

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
        self._peer: Peer | None = None  # None: refused, or gone
        self._head_open = True  # a request head is being read (or awaited)
        self._head_seen = 0
        self._url_seen = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_refusal: str | None = None

    # -- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        peer = read_peer(transport.get_extra_info("socket"))
        if not self.guard.admit(peer):
            transport.write(_answer(503, _too_many(peer)))
            transport.close()
            return
        self._peer = peer
        self._connection_state[PEER_KEY] = peer
        # A stand-in with the transport's whole interface (writes joined, the rest its own).
        super().connection_made(cast(asyncio.Transport, OneWritePerTurn(transport)))
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is None:  # refused in connection_made: uvicorn never saw it
            return
        self.guard.release(self._peer)
        self._peer = None
        self._stop_head_timer()
        super().connection_lost(exc)

    # -- the head's size --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._peer is None:
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
        if self.transport.is_closing():
            return
        if self._head_open:
            self._refuse_head(f"the request head passed {MAX_HEAD_BYTES} bytes")
            return
        super().data_received(data[room:])

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._url_seen = 0
        if self._head_timer is None:  # a keep-alive connection's next request
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        self._url_seen += len(url)
        if self._url_seen > MAX_LINE_BYTES:
            self._head_refusal = f"the request line passed {MAX_LINE_BYTES} bytes"
            raise HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 4 > MAX_LINE_BYTES:  # "name: value\r\n"
            self._head_refusal = (
                f"the header {name[:64].decode('latin-1')!r} passed {MAX_LINE_BYTES} bytes"
            )
            raise HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open, self._head_seen = True, 0

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer when the parser stops: a 431 when a callback here stopped it."""
        if self._head_refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse_head(self._head_refusal)

    def _refuse_head(self, why: str) -> None:
        body = ErrorBody(
            "head_too_large",
            f"{why} (limits: {MAX_HEAD_BYTES} bytes in all, {MAX_LINE_BYTES} a line)",
            "send fewer or shorter headers; data goes in the body",
        )
        self.transport.write(_answer(431, body))
        self.transport.close()

    # -- the head's time --------------------------------------------------------------------

    def _start_head_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self._head_timeout_s(), self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout_s(self) -> float:
        return float(self.guard.caps().head_timeout_s)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            uid = self._peer.uid if self._peer else None
            log.info("api.head_timeout", uid=uid, head_timeout_s=self._head_timeout_s())
            self.transport.close()


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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
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


def serving(caps: Callable[[], ServerSection], fd_limit: int) -> type[DaemonHttpProtocol]:
    """The protocol class for uvicorn's `http=`: its connections share one guard."""
    return type(
        "DaemonHttpProtocol", (DaemonHttpProtocol,), {"guard": ConnectionGuard(caps, fd_limit)}
    )


def _too_many(peer: Peer) -> ErrorBody:
    return ErrorBody(
        "too_many_connections",
        f"uid {peer.uid} has as many connections open as the daemon allows (or the daemon "
        "has as many as it takes in all)",
        "close idle connections; the limits are [server] in config.toml",
    )


def _answer(status: int, body: ErrorBody) -> bytes:
    """A whole answer, written before the connection closes."""
    reason = {431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}[status]
    content = orjson.dumps(body.as_dict())
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        reason,
        len(content),
    )
    return head + b"connection: close\r\n\r\n" + content
