"""The one channel (issue 21): AI tools reach the provider through taogpud, which holds the key.

    tool ──/relay/v1/... on the Unix socket (SO_PEERCRED)──┐
    tool ──127.0.0.1:PORT + relay token (TCP)──────────────┴─► Relay ──► provider.baseUrl
                                                                (key set, aliases resolved)

Modules, each a leaf of the one below it:

    tokens.py    per-user relay tokens, kept hashed in the state directory
    limits.py    per-user limits (concurrent, per minute, tokens per day)
    usage.py     the token usage a provider reports (JSON `usage`, or the stream's events)
    upstream.py  one forwarded request: headers, aliases, retries, deadlines
    forward.py   the ASGI side: who may call, the stream to the client, the trace line
    listen.py    the loopback TCP listener (bound here, or passed by taogpud-relay.socket)
    tools.py     what `taogpuctl relay env --tool X` prints (client side: no daemon imports)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from taogpud.relay.forward import Relay


def mount(app: FastAPI, relay: Relay) -> None:
    """Put the relay in front of the API app (/relay/...) and its routes in it (/v1/relay/...).
    The relay is built by the daemon's composition step (daemon/compose.py), which hands the
    same one to the TCP listener; the routes read it from app.state.relay, put there here."""
    from taogpud.relay.forward import UnixRelay
    from taogpud.relay.routes import router

    app.state.relay = relay
    app.include_router(router)
    app.add_middleware(UnixRelay, relay=relay)
