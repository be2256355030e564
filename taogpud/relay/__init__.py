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

    from taogpud.daemon.state import DaemonState


def mount(app: FastAPI, state: DaemonState) -> None:
    """Put the relay in front of the API app (/relay/...) and its routes in it (/v1/relay/...);
    the Relay itself is app.state.relay, for the TCP listener to share."""
    from taogpud.observability import metrics
    from taogpud.relay.forward import Relay, UnixRelay
    from taogpud.relay.metrics import RelayCollector
    from taogpud.relay.routes import router
    from taogpud.relay.tokens import FILE_NAME, TokenStore

    store_path = state.store.path
    tokens = TokenStore(None if store_path is None else store_path.parent / FILE_NAME)
    relay = Relay(lambda: state.status.snapshot, tokens)
    app.state.relay = relay
    app.include_router(router)
    app.add_middleware(UnixRelay, relay=relay)
    metrics.EXTRA_COLLECTORS["relay"] = RelayCollector(relay.use)
