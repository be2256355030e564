"""Footprint: taogpud start → ready (health ok), and idle RSS of the daemon and each worker."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.daemon_under_test import timed_start
from bench.procs import rss_mib
from bench.stats import Spread

IDLE_S = 1.0


@dataclass(frozen=True)
class Footprint:
    ready_s: Spread
    daemon_rss_mib: Spread
    worker_rss_mib: dict[str, Spread]  # by worker label, e.g. cpu:0
    workers: int


def measure(repeats: int) -> Footprint:
    ready, daemon_rss, worker_rss = [], [], {}
    for _ in range(repeats):
        with timed_start() as (seconds, daemon):
            ready.append(seconds)
            time.sleep(IDLE_S)
            daemon_rss.append(rss_mib(daemon.proc.pid))
            with daemon.client() as client:
                for worker in client.status()["workers"]:
                    worker_rss.setdefault(worker["device"], []).append(rss_mib(worker["pid"]))
    return Footprint(
        Spread.of(ready),
        Spread.of(daemon_rss),
        {label: Spread.of(values) for label, values in worker_rss.items()},
        len(worker_rss),
    )
