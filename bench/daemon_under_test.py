"""A real taogpud for the benchmarks, started the way the tests start one (tests/conftest.py).

A stopped daemon keeps its uploads in /dev/shm for its next start on the same state
directory; a benchmark's never restarts, so they are removed when it stops.

The CPU pair of the tests: 2 CPU devices, one warm worker process each with 2 slots,
`max_concurrent_tasks = 8`, logging as shipped (info, one trace line per request).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import RunningDaemon, deep_merge, start_daemon  # noqa: E402

from taogpud.client import Client  # noqa: E402
from taogpud.pool import shm  # noqa: E402

BENCH_CONFIG: dict[str, Any] = {"scheduling": {"max_concurrent_tasks": 8}}
READY_POLL_S = 0.005


@contextlib.contextmanager
def running(
    settings: dict[str, Any] | None = None, config: dict[str, Any] | None = None
) -> Iterator[RunningDaemon]:
    with _home() as home:
        daemon = start_daemon(home, settings, deep_merge(BENCH_CONFIG, config or {}))
        try:
            yield daemon
        finally:
            stop(daemon)


def stop(daemon: RunningDaemon) -> None:
    """Stop it and drop the arrays it kept in /dev/shm: nobody restarts on its state directory."""
    daemon.stop()
    shm.sweep_orphans(shm.namespace_of(daemon.home / "state"))


def time_to_ready() -> tuple[float, RunningDaemon, Path]:
    """Start a daemon and poll its health every 5 ms: (seconds to ready, daemon, its home)."""
    home = Path(tempfile.mkdtemp(prefix="tgd-bench-", dir="/tmp"))
    started = time.monotonic()
    daemon = start_daemon(home, None, BENCH_CONFIG, wait_ready=False)
    while not _healthy(daemon):
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"taogpud exited {daemon.proc.returncode}: {daemon.stderr()}")
        time.sleep(READY_POLL_S)
    return time.monotonic() - started, daemon, home


def _healthy(daemon: RunningDaemon) -> bool:
    if not daemon.socket_path.exists():
        return False
    with contextlib.suppress(OSError, ConnectionError), daemon.client(timeout_s=5) as client:
        return bool(client.health().get("ok"))
    return False


@contextlib.contextmanager
def _home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="tgd-bench-", dir="/tmp"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


__all__ = ["Client", "RunningDaemon", "running", "stop", "time_to_ready"]
