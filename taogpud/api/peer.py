"""Who is calling: SO_PEERCRED of the Unix-socket connection, put into each request's scope.

ASGI gives an application no socket, so the HTTP protocol class reads the
credentials once per connection and adds them to every request it parses.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, cast

from starlette.requests import Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from taogpud.jobs import Peer

SCOPE_KEY = "taogpud.peer"


def read_peer(sock: socket.socket | None) -> Peer:
    if sock is None or sock.family != socket.AF_UNIX:
        return Peer()
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid=pid, uid=uid, gid=gid)


class PeerCredProtocol(HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:
        self.taogpud_peer = read_peer(transport.get_extra_info("socket"))
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
        extensions[SCOPE_KEY] = self.taogpud_peer


def peer_of(request: Request) -> Peer:
    peer = request.scope.get("extensions", {}).get(SCOPE_KEY)
    return peer if isinstance(peer, Peer) else Peer()
