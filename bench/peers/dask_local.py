"""dask.distributed: a LocalCluster of 2 worker processes, one thread each."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from bench.load import Call, Plan, in_processes, sequential
from bench.peers.tiny import noop
from bench.procs import descendants, rss_mib
from bench.stats import DispatchRow

NAME = "dask.distributed LocalCluster, 2 worker processes"
IDLE_S = 1.0


def measure(
    plan: Plan, clients: int, concurrent: Plan
) -> tuple[list[DispatchRow], dict[str, float]]:
    from distributed import LocalCluster

    started = time.monotonic()
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with open_caller(cluster.scheduler_address) as call:
            call()
            footprint = {"start_s": time.monotonic() - started}
            time.sleep(IDLE_S)
            footprint["idle_rss_mib"] = sum(map(rss_mib, [os.getpid(), *descendants(os.getpid())]))
            one = sequential(call, plan)
        many = in_processes(open_caller, [(cluster.scheduler_address,)] * clients, concurrent)
    note = "client.submit(noop, pure=False).result()"
    rows = [DispatchRow.from_runs(NAME, 1, one, note), DispatchRow.from_runs(NAME, clients, many)]
    return rows, footprint


@contextlib.contextmanager
def open_caller(address: str) -> Iterator[Call]:
    from distributed import Client

    with Client(address) as client:
        yield lambda: client.submit(noop, pure=False).result()
