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
