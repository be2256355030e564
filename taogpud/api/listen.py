"""The listening Unix socket: 0660, group taogpu where that group exists, never stolen."""

from __future__ import annotations

import contextlib
import grp
import os
import socket
from pathlib import Path

SOCKET_GROUP = "taogpu"
BACKLOG = 1024
MAX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL


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
