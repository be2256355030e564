"""A real taogpud for the benchmarks, started by the harness the tests use (taogpud.testing).

A benchmark's daemon never restarts: once it stops, its home and the arrays it kept in
/dev/shm for a restart are removed.

The CPU pair of the tests: 2 CPU devices, one warm worker process each with 2 slots,
`max_concurrent_tasks = 8`, logging as shipped (info, one trace line per request), placed
`least_loaded`: the shape of Ray's peer (bench/peers/ray_local.py), whose lone client calls
one warm actor and whose client i calls actor i mod 2. Under `round_robin` a lone client's
jobs alternate between the two workers, each of which then runs cold; bench/dispatch.py
keeps a row of that placement, so what it costs stays in the report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from taogpud import testing
from taogpud.client import Client
from taogpud.testing import RunningDaemon, deep_merge

BENCH_CONFIG: dict[str, Any] = {
    "scheduling": {"max_concurrent_tasks": 8, "strategy": "least_loaded"}
}
ROUND_ROBIN: dict[str, Any] = {"scheduling": {"strategy": "round_robin"}}  # the guide's choice
HOME_PREFIX = "tgd-bench-"
READY_POLL_S = 0.005


@contextlib.contextmanager
def running(
    settings: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[RunningDaemon]:
    """A ready daemon on the bench's CPU pair with these overrides; stopped and swept after."""
    merged = deep_merge(BENCH_CONFIG, config or {})
    with testing.running(settings, merged, env, prefix=HOME_PREFIX) as daemon:
        yield daemon


@contextlib.contextmanager
def timed_start() -> Iterator[tuple[float, RunningDaemon]]:
    """Start a daemon and poll its health every 5 ms: (seconds to ready, the daemon)."""
    home = testing.new_home(HOME_PREFIX)
    try:
        started = time.monotonic()
        daemon = testing.start_daemon(home, None, BENCH_CONFIG, wait_ready=False)
        try:
            testing.wait_for_ready(daemon, poll_s=READY_POLL_S)
            yield time.monotonic() - started, daemon
        finally:
            daemon.stop()
    finally:
        testing.remove_home(home)


__all__ = ["ROUND_ROBIN", "Client", "RunningDaemon", "running", "timed_start"]
