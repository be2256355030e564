"""One daemon per state directory: an exclusive flock on <state dir>/taogpud.lock, held for
the daemon's lifetime.

Two daemons on one state directory share one job store and one outputs folder: the second
used to take the live store's "database is locked" for damage, move it aside and prune the
first one's kept outputs. The lock is taken before anything else touches the directory, and
the kernel drops it when the process ends, however it ends (kill -9 included), so there is
never a stale lock to clean up. The file says who holds it (pid and socket), for the one
line a second daemon prints before it exits.

A state directory this daemon cannot use, because another user owns it or what is in it (a
run by hand as root before the service), is refused with the owner and the exact `chown`:
StateDirNotOurs, a permanent failure that systemd does not retry. Root itself refuses a
directory another user owns, so a run by hand never leaves root's files in the service's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
from pathlib import Path

from taogpud.errors import StateDirLocked, StateDirNotOurs

LOCK_NAME = "taogpud.lock"


def lock_state_dir(state_dir: Path, socket_path: Path | None) -> int:
    """Take the lock (never waiting) and note who holds it; returns the descriptor to keep
    open. Raises StateDirLocked naming the holder's pid and socket, StateDirNotOurs naming
    the owner of what this user cannot (or, as root, should not) write."""
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: DESIGN, issue 17
        _refuse_anothers(state_dir)
        fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except PermissionError as exc:
        raise StateDirNotOurs(not_ours(state_dir, Path(exc.filename or state_dir))) from None
    return _lock(fd, state_dir, socket_path)


def _refuse_anothers(state_dir: Path) -> None:
    """Root writes anywhere: in a directory another user owns (the service's), its files
    would be root's, which that user's daemon then cannot open."""
    if os.geteuid() == 0 and state_dir.stat().st_uid != 0:
        raise StateDirNotOurs(
            f"{state_dir} belongs to user {_owner(state_dir)}, and files root made in it "
            f"would lock that user's daemon out: run that one (`sudo systemctl start "
            f"taogpud`), or give this one its own --state-dir"
        )


def not_ours(state_dir: Path, path: Path) -> str:
    """Why `path` in `state_dir` cannot be opened, whose it is, and the fix."""
    me = _name(os.geteuid())
    return (
        f"{path} cannot be opened by user {me}: it belongs to user {_owner(path)} (a run as "
        f"that user left it): `sudo chown -R {me}: {state_dir}`"
    )


def _owner(path: Path) -> str:
    try:
        return _name(path.stat().st_uid)
    except OSError:
        return "unknown"


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _lock(fd: int, state_dir: Path, socket_path: Path | None) -> int:
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
