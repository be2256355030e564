"""The daemon's Unix sockets, on the standard library alone: bound safely, and who is calling.

- `bind_unix_socket`: 0660, group taogpu where that group exists, renamed into place once
  listening (nobody sees the path with the wrong mode), never stolen from a live daemon.
- `read_peer`: SO_PEERCRED of one connection, a `PeerCred`. The API's HTTP protocol class
  reads it once per connection and adds it to the app state uvicorn copies into every
  request's `scope["state"]` (ASGI gives an application no socket); `peer_in(scope)` reads it
  back. A job's submitter (jobs.records.Peer, the API's model) is built from it there.

A leaf: the daemon, the `.shm` socket, the relay and the API all use it, and it imports
nothing of theirs (test_layers.py: the standard library alone).
"""

from __future__ import annotations

import contextlib
import grp
import os
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

SOCKET_GROUP = "taogpu"
BACKLOG = 1024
MAX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL
PEER_KEY = "taogpud_peer"  # scope["state"][PEER_KEY]


class PeerCred(NamedTuple):
    """Who is at the other end of a connection (SO_PEERCRED); None each where the socket is
    not a Unix one."""

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None


def bind_unix_socket(path: Path) -> socket.socket:
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise OSError(
            f"socket path {path} is longer than {MAX_PATH_BYTES} bytes; choose a shorter --socket"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    # Bind under a temporary name and rename once listening: whoever sees the path can
    # connect, and nobody sees it with the wrong mode.
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(staging))
    staging.chmod(0o660)
    with contextlib.suppress(KeyError, PermissionError):
        os.chown(staging, -1, grp.getgrnam(SOCKET_GROUP).gr_gid)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    staging.rename(path)
    return sock


def _remove_stale(path: Path) -> None:
    """Remove a socket file a dead daemon left; refuse if a live one answers on it."""
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise OSError(
        f"another taogpud is already serving on {path}; stop it first or use another --socket"
    )


def read_peer(sock: socket.socket | None) -> PeerCred:
    if sock is None or sock.family != socket.AF_UNIX:
        return PeerCred()
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid=pid, uid=uid, gid=gid)


def peer_in(scope: Mapping[str, Any]) -> PeerCred:
    """The caller recorded in an ASGI scope's state; an unknown PeerCred() if none was."""
    peer = scope.get("state", {}).get(PEER_KEY)
    return peer if isinstance(peer, PeerCred) else PeerCred()
