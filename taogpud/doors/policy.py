"""The daemon's doors: every listener it opens, and the connection caps they share.

    Doors          the registry: one per daemon; a listener is opened through it or not at all
    Door           one listener: name, kind ("http" | "shm"), address, its socket's inode
    ConnectionGuard  open connections per uid and in all, across every door
    Ticket         one admitted connection: released once, when it closes

The caps are shared because the resource is: every connection is a descriptor in the one
process's table. A peer with a uid (a Unix socket's SO_PEERCRED) is held to
`max_connections_per_uid`; one without (a TCP client, before its relay token is read) to
`max_connections_without_uid`, a small budget all of them share, so that nobody without a
uid can take more than that from the members. The cap in all stays below half the open-file
limit (the daemon raised its soft limit to the hard one), the rest for workers, the store
and outputs.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from taogpud.config import ServerSection
from taogpud.doors.noise import Noise
from taogpud.host.unix_socket import PeerCred

Caps = Callable[[], ServerSection]


@dataclass
class Door:
    """One listener the daemon opened."""

    name: str  # "control", "shm", "relay"
    kind: str  # what it speaks: "http" | "shm"
    address: str  # a socket path, or HOST:PORT
    inode: int  # its socket's inode: what /proc/PID/fd shows as socket:[inode]
    body_limit: Callable[[], int]  # the largest request body any of its routes takes
    open: int = 0  # connections admitted and not yet closed
    refused: int = 0  # connections refused at a cap, since the start

    def view(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "address": self.address,
            "inode": self.inode,
            "open": self.open,
            "refused": self.refused,
        }


@dataclass
class Ticket:
    """One admitted connection; `release()` gives its place back (once)."""

    guard: ConnectionGuard
    door: Door
    peer: PeerCred
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.guard.release(self)


class ConnectionGuard:
    """Open connections by uid (None: no uid), against the caps the live config sets."""

    def __init__(self, caps: Caps, fd_limit: int, noise: Noise) -> None:
        self.caps = caps
        self.noise = noise
        self._fd_cap = max(fd_limit // 2, 1)  # the rest for workers, the store, outputs
        self._open: Counter[int | None] = Counter()
        self.total = 0

    def admit(self, peer: PeerCred, door: Door) -> Ticket | None:
        """A ticket, or None (logged as a summary) when a cap is reached."""
        caps = self.caps()
        total_cap = min(caps.max_connections, self._fd_cap)
        own_cap = caps.max_connections_per_uid
        if peer.uid is None:
            own_cap = caps.max_connections_without_uid
        if self.total >= total_cap or self._open[peer.uid] >= own_cap:
            door.refused += 1
            cap = "in_all" if self.total >= total_cap else "per_uid"
            self.noise.note(
                "warning", "door.connection_refused", door=door.name, uid=peer.uid, cap=cap
            )
            return None
        self._open[peer.uid] += 1
        self.total += 1
        door.open += 1
        return Ticket(self, door, peer)

    def claim(self, ticket: Ticket, uid: int) -> bool:
        """The connection of a peer without a uid is now known to be `uid`'s (the relay read
        its token): it leaves the shared budget for the uid's own; False at the uid's cap."""
        if ticket.peer.uid is not None:
            return ticket.peer.uid == uid
        if self._open[uid] >= self.caps().max_connections_per_uid:
            return False
        self._open[None] -= 1
        if self._open[None] <= 0:
            del self._open[None]
        self._open[uid] += 1
        ticket.peer = PeerCred(uid=uid)
        return True

    def release(self, ticket: Ticket) -> None:
        uid = ticket.peer.uid
        self._open[uid] -= 1
        if self._open[uid] <= 0:
            del self._open[uid]
        self.total -= 1
        ticket.door.open -= 1


class Doors:
    """Every listener of one daemon, and the policy they share."""

    def __init__(self, caps: Caps, fd_limit: int) -> None:
        self.caps = caps
        self.noise = Noise()
        self.guard = ConnectionGuard(caps, fd_limit, self.noise)
        self.listed: list[Door] = []

    def open(
        self,
        name: str,
        kind: str,
        sock: socket.socket,
        body_limit: Callable[[], int],
        address: str | None = None,
    ) -> Door:
        """Register a listener: each kind's serving (doors/http.py, doors/stream.py) calls this
        before it serves a single connection, so nothing listens outside the registry.
        `address`: the path clients use, where the socket was bound under another name."""
        inode = os.fstat(sock.fileno()).st_ino
        door = Door(name, kind, address or address_of(sock), inode, body_limit)
        self.listed.append(door)
        return door

    def close(self, door: Door) -> None:
        if door in self.listed:
            self.listed.remove(door)

    def views(self) -> list[dict[str, object]]:
        return [door.view() for door in self.listed]


def address_of(sock: socket.socket) -> str:
    name = sock.getsockname()
    if isinstance(name, tuple):
        host, port = name[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return name.decode() if isinstance(name, bytes) else str(name)
