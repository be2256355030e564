"""Who is calling: SO_PEERCRED of the Unix-socket connection, put into each request's scope.

ASGI gives an application no socket, so the HTTP protocol class (api/protocol.py) reads
the credentials once per connection and adds them to every request it parses.
"""

from __future__ import annotations

import socket
import struct

from starlette.requests import Request

from taogpud.jobs import Peer

SCOPE_KEY = "taogpud.peer"


def read_peer(sock: socket.socket | None) -> Peer:
    if sock is None or sock.family != socket.AF_UNIX:
        return Peer()
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def peer_of(request: Request) -> Peer:
    peer = request.scope.get("extensions", {}).get(SCOPE_KEY)
    return peer if isinstance(peer, Peer) else Peer()
