"""Where things live: system mode (root, systemd) or user mode (anyone else)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SOCKET_NAME = "taogpud.sock"


def user_mode() -> bool:
    return os.geteuid() != 0


def default_socket(environ: Mapping[str, str] | None = None) -> Path:
    """TAOGPUD_SOCKET, else /run/taogpud/ for root, else $XDG_RUNTIME_DIR/taogpud/."""
    env = os.environ if environ is None else environ
    if env.get("TAOGPUD_SOCKET"):
        return Path(env["TAOGPUD_SOCKET"])
    if env.get("RUNTIME_DIRECTORY"):  # set by systemd's RuntimeDirectory=
        return Path(env["RUNTIME_DIRECTORY"]) / SOCKET_NAME
    if not user_mode():
        return Path("/run/taogpud") / SOCKET_NAME
    runtime = env.get("XDG_RUNTIME_DIR") or f"/tmp/taogpud-{os.geteuid()}"
    return Path(runtime) / "taogpud" / SOCKET_NAME


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$STATE_DIRECTORY (systemd), /var/lib/taogpud for root, else $XDG_STATE_HOME/taogpud."""
    env = os.environ if environ is None else environ
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"])
    if not user_mode():
        return Path("/var/lib/taogpud")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "taogpud"
