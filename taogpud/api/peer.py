"""Who is calling: SO_PEERCRED of the Unix-socket connection, in each request's scope state.

ASGI gives an application no socket, so the HTTP protocol class (api/protocol.py) reads
the credentials once per connection and adds them to the app state uvicorn copies into
every request's `scope["state"]`.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from taogpud.jobs import Peer

PEER_KEY = "taogpud_peer"  # scope["state"][PEER_KEY]


def read_peer(sock: socket.socket | None) -> Peer:
    if sock is None or sock.family != socket.AF_UNIX:
        return Peer()
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def peer_in(scope: Mapping[str, Any]) -> Peer:
    peer = scope.get("state", {}).get(PEER_KEY)
    return peer if isinstance(peer, Peer) else Peer()


def peer_of(request: Request) -> Peer:
    return peer_in(request.scope)
