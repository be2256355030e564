"""Ray local (`ray.init(num_cpus=2)`): a warm actor, and plain tasks.

Ray 2.60 turns token auth on and keeps its state under ~/.ray and /tmp/ray: the run uses
its own RAY_TMPDIR with auth off, connects extra client processes to that cluster by its
GCS address, and shuts down in a finally block. Never `ray stop`: it ends every Ray process
on the machine, other people's too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bench.load import Call, Plan, in_processes, sequential
from bench.peers.tiny import noop
from bench.procs import descendants, kill_all, rss_mib, with_marker
from bench.stats import DispatchRow

NAMESPACE = "taogpud-bench"
ACTORS = 2  # one per CPU, like taogpud's two workers
IDLE_S = 1.0
NAMES = {"actor": "Ray local, a warm actor", "task": "Ray local, plain tasks"}
CLIENT_NOTES = {
    "actor": "client i calls actor i mod 2",
    "task": "each client process is a Ray job, and a Ray worker serves one job: "
    "8 jobs on 2 CPUs trade workers",
}


class Noop:
    def run(self) -> None:
        return noop()


def measure(
    plan: Plan, clients: int, concurrent: Plan, kinds: tuple[str, ...] = tuple(NAMES)
) -> tuple[list[DispatchRow], dict[str, float]]:
    temp_root = tempfile.mkdtemp(prefix="tgd-ray-", dir="/tmp")
    os.environ.update(RAY_TMPDIR=temp_root, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    try:
        return _measure(plan, clients, concurrent, kinds)
    finally:
        kill_all(with_marker(temp_root))  # anything ray.shutdown() left behind
        shutil.rmtree(temp_root, ignore_errors=True)


def measure_actor(
    plan: Plan, clients: int, concurrent: Plan
) -> tuple[list[DispatchRow], dict[str, float]]:
    """The warm actor's rows alone (bench/refactor_guard.py: plain tasks are no target)."""
    return measure(plan, clients, concurrent, ("actor",))


def _measure(
    plan: Plan, clients: int, concurrent: Plan, kinds: tuple[str, ...]
) -> tuple[list[DispatchRow], dict[str, float]]:
    import ray

    started = time.monotonic()
    ray.init(
        num_cpus=2,
        namespace=NAMESPACE,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    try:
        address = ray.get_runtime_context().gcs_address
        actors = [ray.remote(Noop).options(name=f"noop-{n}").remote() for n in range(ACTORS)]
        ray.get([actor.run.remote() for actor in actors])
        footprint = {"start_s": time.monotonic() - started}
        time.sleep(IDLE_S)
        footprint["idle_rss_mib"] = sum(map(rss_mib, [os.getpid(), *descendants(os.getpid())]))
        rows = []
        for kind in kinds:
            name = NAMES[kind]
            with open_caller(None, kind, 0) as call:
                one = sequential(call, plan)
            many = in_processes(
                open_caller, [(address, kind, n) for n in range(clients)], concurrent
            )
            rows += [
                DispatchRow.from_runs(name, 1, one),
                DispatchRow.from_runs(name, clients, many, CLIENT_NOTES[kind]),
            ]
        return rows, footprint
    finally:
        ray.shutdown()


@contextlib.contextmanager
def open_caller(address: str | None, kind: str, slot: int) -> Iterator[Call]:
    import ray

    if address is not None:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    try:
        if kind == "actor":
            actor: Any = ray.get_actor(f"noop-{slot % ACTORS}")
            yield lambda: ray.get(actor.run.remote())
        else:
            task: Any = ray.remote(noop)
            yield lambda: ray.get(task.remote())
    finally:
        if address is not None:
            ray.shutdown()
