"""The relay's loopback TCP listener: bound from [relay] listen, or passed by systemd.

`taogpud-relay.socket` passes its socket with FileDescriptorName=relay beside the control
socket; `inherited_socket()` takes a copy of it before systemd.listen_socket() (which serves
the Unix one and closes the rest) runs. The listener is served as every HTTP listener is
(doors/serve.py): its own uvicorn server on the same event loop as the API, serving only
TcpRelay through the door policy's protocol class (taogpud/doors): the caps, head and body
limits of every listener, with the peers of this one, which have no uid, held to the budget
of those without.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from taogpud.doors import Doors, HttpListener, serve_http
from taogpud.relay.forward import Relay, TcpRelay

FD_NAME = "relay"
SD_LISTEN_FDS_START = 3
BACKLOG = 1024


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


async def start(relay: Relay, inherited: socket.socket | None, doors: Doors) -> HttpListener | None:
    """Serve the relay on TCP when it is on and has an address; None otherwise."""
    settings = relay.settings()
    if not settings.enabled or (not settings.listen and inherited is None):
        if inherited is not None:
            inherited.close()
        return None
    sock = inherited or bind_tcp(settings.listen)
    relay.tcp_address = address_of(sock)
    return await serve_http(
        TcpRelay(relay),
        doors,
        "relay",
        sock,
        lambda: relay.settings().max_body_mb << 20,
        server_header=False,
    )


async def stop(listener: HttpListener | None, relay: Relay | None) -> None:
    if listener is not None:
        await listener.stop()
    if relay is not None:
        await relay.aclose()
