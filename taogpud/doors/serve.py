"""Serving HTTP on a door: the one way every HTTP listener of the daemon is started and
stopped (the control socket, daemon/lifecycle.py; the relay's TCP port, relay/listen.py).

A uvicorn server per socket, on the running event loop (uvloop's, when installed), through
the door's protocol class (doors/http.py: the caps, head and body limits of every listener),
without uvicorn's own signal handling (the daemon owns SIGTERM and SIGINT) or its lifespan,
log config and access log (the API's edge writes the request trace). `serve_http` returns
once uvicorn says it is serving, and raises what stopped it if it could not.

The `.shm` socket does not start this way: it speaks the daemon's own framing, so it is a
stream door (doors/stream.py), accepting on the loop with no server task to wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from taogpud.doors.http import http_protocol
from taogpud.doors.policy import Doors

STARTED_POLL_S = 0.005  # uvicorn has no event for "started", only the flag
GRACEFUL_SHUTDOWN_S = 5


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpListener:
    """One uvicorn server serving one socket; `stop` closes it and waits for its task."""

    def __init__(self, server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
        self.server = server
        self.serving = serving

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.serving


async def serve_http(
    app: Any,
    doors: Doors,
    door_name: str,
    sock: socket.socket,
    body_limit: Callable[[], int],
    address: str | None = None,
    **options: Any,
) -> HttpListener:
    """Serve `app` on `sock`, opened through `doors` as `door_name`; `options` are uvicorn's
    (timeout_keep_alive, server_header)."""
    config = uvicorn.Config(
        app,
        http=http_protocol(doors, door_name, sock, body_limit, address),
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nothing proxies a local socket; X-Forwarded-* mean nothing
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        **options,
    )
    server = _Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(STARTED_POLL_S)
    if serving.done():
        serving.result()  # raises what stopped the server
    return HttpListener(server, serving)
