"""The door policy for a listener that speaks the daemon's own framing (the `.shm` socket):
accepted here, held to the same caps as the HTTP doors, then handed to its protocol.

- Accepting: out of descriptors (EMFILE, ENFILE) or memory, the listener stops reading for
  a while (ACCEPT_BACKOFF_S, doubling to ACCEPT_BACKOFF_MAX_S) instead of being woken again
  at once by the connection still waiting; the failures are counted into one summary line
  per interval (door.accept_failed). A listener woken in a tight loop wrote 2.3 million
  lines in 25 s.
- Caps: a connection over one gets `refusal` (the protocol's own error message) and is
  closed at once.
- Time: `Deadline` is the protocol's clock: the first message within head_timeout_s of
  the connection, and any message begun within body_timeout_s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

from taogpud.doors.http import too_many
from taogpud.doors.policy import Door, Doors, Ticket
from taogpud.errors import ErrorBody
from taogpud.host.unix_socket import read_peer

ACCEPT_BACKOFF_S = 0.05
ACCEPT_BACKOFF_MAX_S = 1.0
ACCEPTS_PER_WAKE = 64  # a flood is taken in batches, each a turn of the loop

Serve = Callable[[socket.socket, Ticket], None]
Refusal = Callable[[ErrorBody], bytes]


class StreamDoor:
    """One listener: accepts, admits, and hands each connection to `serve` with its ticket."""

    def __init__(
        self, doors: Doors, door: Door, sock: socket.socket, serve: Serve, refusal: Refusal
    ) -> None:
        self.doors, self.door, self.sock = doors, door, sock
        self.serve, self.refusal = serve, refusal
        self._backoff_s = ACCEPT_BACKOFF_S
        self._loop = asyncio.get_running_loop()
        self._resuming: asyncio.TimerHandle | None = None
        self._loop.add_reader(sock.fileno(), self._accept)

    def close(self) -> None:
        if self._resuming is not None:
            self._resuming.cancel()
        else:
            self._loop.remove_reader(self.sock.fileno())
        self.doors.close(self.door)
        self.sock.close()

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors or memory: wait, then try again
                self._back_off(exc)
                return
            self._backoff_s = ACCEPT_BACKOFF_S
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        peer = read_peer(conn)
        ticket = self.doors.guard.admit(peer, self.door)
        if ticket is None:
            conn.setblocking(False)
            with contextlib.suppress(OSError):  # a peer gone already needs no reason
                conn.send(self.refusal(too_many(peer.uid)))
            conn.close()
            return
        self.serve(conn, ticket)

    def _back_off(self, exc: OSError) -> None:
        self.doors.noise.note(
            "warning", "door.accept_failed", door=self.door.name, error=exc.strerror or str(exc)
        )
        self._loop.remove_reader(self.sock.fileno())
        self._resuming = self._loop.call_later(self._backoff_s, self._resume)
        self._backoff_s = min(self._backoff_s * 2, ACCEPT_BACKOFF_MAX_S)

    def _resume(self) -> None:
        self._resuming = None
        self._loop.add_reader(self.sock.fileno(), self._accept)


def stream_door(
    doors: Doors,
    name: str,
    sock: socket.socket,
    address: str,
    body_limit: Callable[[], int],
    serve: Serve,
    refusal: Refusal,
) -> StreamDoor:
    """Register `sock` as a door and start accepting on it."""
    door = doors.open(name, "shm", sock, body_limit, address)
    return StreamDoor(doors, door, sock, serve, refusal)


class Deadline:
    """One connection's clock: `on_expiry` runs unless the deadline is met (cancelled) first."""

    def __init__(self, on_expiry: Callable[[str], None]) -> None:
        self._on_expiry = on_expiry
        self._timer: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def arm(self, seconds: float, what: str) -> None:
        self.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(float(seconds), self._expired, what)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, what: str) -> None:
        self._timer = None
        self._on_expiry(what)
