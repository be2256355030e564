"""Where things live: system mode (root, systemd) or user mode (anyone else)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SOCKET_NAME = "taogpud.sock"
SYSTEM_SOCKET = Path("/run/taogpud") / SOCKET_NAME  # taogpud.socket's, or the root daemon's


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
        return SYSTEM_SOCKET
    return user_socket(env)


def user_socket(environ: Mapping[str, str] | None = None) -> Path:
    """Where a user's own daemon (`taogpud` run by them) binds: under $XDG_RUNTIME_DIR."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR") or f"/tmp/taogpud-{os.geteuid()}"
    return Path(runtime) / "taogpud" / SOCKET_NAME


def client_sockets(environ: Mapping[str, str] | None = None) -> tuple[Path, list[Path]]:
    """The socket a client uses, and every one it considered, in order.

    $TAOGPUD_SOCKET alone when set; else a user daemon's socket if one exists (a user's own
    daemon wins over the host's); else the system socket, which serves every member of group
    taogpu. Root has no user daemon: its daemon is the system one.
    """
    env = os.environ if environ is None else environ
    if env.get("TAOGPUD_SOCKET"):
        chosen = Path(env["TAOGPUD_SOCKET"])
        return chosen, [chosen]
    if not user_mode():
        return SYSTEM_SOCKET, [SYSTEM_SOCKET]
    own = user_socket(env)
    return (own if own.exists() else SYSTEM_SOCKET), [own, SYSTEM_SOCKET]


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$STATE_DIRECTORY (systemd), /var/lib/taogpud for root, else $XDG_STATE_HOME/taogpud."""
    env = os.environ if environ is None else environ
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"])
    if not user_mode():
        return Path("/var/lib/taogpud")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "taogpud"


def kernel_cache_env(state_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """CUPY_CACHE_DIR and CUDA_CACHE_PATH for the workers, in a directory the daemon owns, so
    a restart finds its kernels compiled: values already set (the systemd units set both under
    CacheDirectory=) are kept; else $CACHE_DIRECTORY, else <state dir>/cache."""
    env = os.environ if environ is None else environ
    root = Path(env["CACHE_DIRECTORY"]) if env.get("CACHE_DIRECTORY") else state_dir / "cache"
    return {
        "CUPY_CACHE_DIR": env.get("CUPY_CACHE_DIR") or str(root / "cupy"),
        "CUDA_CACHE_PATH": env.get("CUDA_CACHE_PATH") or str(root / "nv"),
        "POCL_CACHE_DIR": env.get("POCL_CACHE_DIR") or str(root / "pocl"),  # opencl on PoCL
    }
