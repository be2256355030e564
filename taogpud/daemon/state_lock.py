"""One daemon per state directory: an exclusive flock on <state dir>/taogpud.lock, held for
the daemon's lifetime.

Two daemons on one state directory share one job store and one outputs folder: the second
used to take the live store's "database is locked" for damage, move it aside and prune the
first one's kept outputs. The lock is taken before anything else touches the directory, and
the kernel drops it when the process ends, however it ends (kill -9 included), so there is
never a stale lock to clean up. The file says who holds it (pid and socket), for the one
line a second daemon prints before it exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

LOCK_NAME = "taogpud.lock"


class StateDirLocked(Exception):
    """Another live process holds the state directory."""


def lock_state_dir(state_dir: Path, socket_path: Path | None) -> int:
    """Take the lock (never waiting) and note who holds it; returns the descriptor to keep
    open. Raises StateDirLocked naming the holder's pid and socket."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: DESIGN, issue 17
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)  # workers never hold it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StateDirLocked(_refusal(state_dir, holder)) from None
    except BaseException:
        os.close(fd)
        raise
    note = {"pid": os.getpid(), "socket": str(socket_path) if socket_path else None}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(note).encode() + b"\n", 0)
    return fd


def _holder(fd: int) -> dict[str, object]:
    with contextlib.suppress(OSError, ValueError):
        note = json.loads(os.pread(fd, 4096, 0) or b"{}")
        if isinstance(note, dict):
            return note
    return {}


def _refusal(state_dir: Path, holder: dict[str, object]) -> str:
    pid = holder.get("pid", "unknown")
    serving = f", serving {holder['socket']}" if holder.get("socket") else ""
    return (
        f"the state directory {state_dir} is in use by taogpud pid {pid}{serving}; "
        "one daemon per state directory (stop that one, or give this one another --state-dir)"
    )
