"""The relay's loopback TCP listener: bound from [relay] listen, or passed by systemd.

`taogpud-relay.socket` passes its socket with FileDescriptorName=relay beside the control
socket; `inherited_socket()` takes a copy of it before systemd.listen_socket() (which serves
the Unix one and closes the rest) runs. The listener is its own uvicorn server on the same
event loop as the API (uvloop's, when installed), serving only TcpRelay through the door
policy's protocol class (taogpud/doors): the caps, head and body limits of every listener,
with the peers of this one, which have no uid, held to the budget of those without.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator, Mapping

import uvicorn

from taogpud.doors import Doors, http_protocol
from taogpud.relay.forward import Relay, TcpRelay

FD_NAME = "relay"
SD_LISTEN_FDS_START = 3
BACKLOG = 1024


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def inherited_socket(environ: Mapping[str, str] | None = None) -> socket.socket | None:
    """A copy of the socket systemd passed under the name `relay`, if it passed one."""
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = int(env.get("LISTEN_FDS", "0") or "0")
    names = env.get("LISTEN_FDNAMES", "").split(":")
    for index, name in enumerate(names[:count]):
        if name == FD_NAME:
            sock = socket.socket(fileno=os.dup(SD_LISTEN_FDS_START + index))
            sock.set_inheritable(False)  # never into a worker
            sock.setblocking(False)
            return sock
    return None


def bind_tcp(listen: str) -> socket.socket:
    """Bind `HOST:PORT` (config checked it is loopback); port 0 takes any free one."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise OSError(
            f"the relay cannot listen on {listen} ({exc.strerror}); choose another port in "
            "[relay] listen of config.toml"
        ) from None
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RelayListener:
    def __init__(self, server: _Server, serving: asyncio.Task[None]) -> None:
        self.server = server
        self.serving = serving

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.serving


async def start(
    relay: Relay, inherited: socket.socket | None, doors: Doors
) -> RelayListener | None:
    """Serve the relay on TCP when it is on and has an address; None otherwise."""
    settings = relay.settings()
    if not settings.enabled or (not settings.listen and inherited is None):
        if inherited is not None:
            inherited.close()
        return None
    sock = inherited or bind_tcp(settings.listen)
    relay.tcp_address = address_of(sock)
    config = uvicorn.Config(
        TcpRelay(relay),
        http=http_protocol(doors, "relay", sock, lambda: relay.settings().max_body_mb << 20),
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nothing proxies a loopback listener; X-Forwarded-* mean nothing
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if serving.done():
        serving.result()
    return RelayListener(server, serving)


async def stop(listener: RelayListener | None, relay: Relay | None) -> None:
    if listener is not None:
        await listener.stop()
    if relay is not None:
        await relay.aclose()
