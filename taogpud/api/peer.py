"""Who is calling, for a route handler: the SO_PEERCRED the connection recorded.

The reading and the recording are on the standard library alone (taogpud/host/unix_socket.py);
this is the Starlette-typed face the API's handlers call.
"""

from __future__ import annotations

from starlette.requests import Request

from taogpud.host.unix_socket import peer_in
from taogpud.jobs.records import Peer


def peer_of(request: Request) -> Peer:
    return Peer.of(peer_in(request.scope))
