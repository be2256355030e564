"""taogpud through its public Python client: `Client.submit("noop", wait_s=30)`."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator

from bench.daemon_under_test import Client, RunningDaemon
from bench.load import Call, Plan, in_processes, sequential
from bench.stats import DispatchRow

NAME = "taogpud, Python client"


def measure(
    daemon: RunningDaemon, plan: Plan, clients: int, concurrent: Plan, name: str = NAME
) -> tuple[list[DispatchRow], dict[str, float]]:
    path = str(daemon.socket_path)
    with open_caller(path) as call:
        one = sequential(call, plan)
    breakdown = where_time_goes(daemon)
    many = in_processes(open_caller, [(path,)] * clients, concurrent)
    note = "Client.submit('noop', wait_s=30)"
    rows = [DispatchRow.from_runs(name, 1, one, note), DispatchRow.from_runs(name, clients, many)]
    return rows, breakdown


@contextlib.contextmanager
def open_caller(socket_path: str) -> Iterator[Call]:
    with Client(socket_path) as client:

        def call() -> None:
            job = client.submit("noop", wait_s=30)
            if job["status"] != "succeeded":
                raise RuntimeError(f"noop job did not succeed: {job}")

        yield call


def where_time_goes(daemon: RunningDaemon) -> dict[str, float]:
    """Medians from the daemon's own traces: request in the server, queue, task in the worker."""
    requests = [
        event["duration_ms"]
        for event in daemon.events("api.request")
        if event.get("path") == "/v1/jobs" and "duration_ms" in event
    ]
    done = daemon.events("job.succeeded")
    nan = float("nan")
    return {
        "server_request_ms": statistics.median(requests) if requests else nan,
        "queue_ms": statistics.median(e["queue_ms"] for e in done) if done else nan,
        "worker_run_ms": statistics.median(e["run_ms"] for e in done) if done else nan,
    }
