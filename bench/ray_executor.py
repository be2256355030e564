"""Tiny-job dispatch through the Ray executor vs the local one, in the same run (issue 10).

    python -m bench.ray_executor [--quick] [--repeats 3]

Two daemons in turn on the tests' CPU pair (2 devices, 2 slots each, max_concurrent_tasks 8):
`executor = "local"` (spawned workers) and `executor = "ray"` (two actors on a private local
Ray with 2 logical GPUs, started by the daemon; RAY_TMPDIR in a temp dir, auth off, ended with
the daemon's ray.shutdown()). For each: `noop` through the public client, 1 client back to back
and 8 client processes; the daemon's own medians (queue, run in the worker); and a 64 MiB
`vector_add` (two 32 MiB inputs uploaded once, output kept) submit → result, which carries the
data path: /dev/shm on "local", the object store and the daemon's output write on "ray".
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.daemon_under_test import RunningDaemon, running
from bench.load import Plan
from bench.peers import taogpud_client
from bench.stats import DispatchRow, Spread

CLIENTS = 8
COUNTS = (1000, 150)  # jobs per repeat: 1 client sequential, each of the 8 clients
QUICK_DIVISOR = 5
BIG_FLOATS = 8 << 20  # 32 MiB of float32 per input
BIG_RUNS = 5
RAY_LOCAL = {
    "scheduling": {"executor": "ray"},
    "ray": {"address": "local", "local_num_gpus": 2, "local_num_cpus": 2},
}


@dataclass
class ExecutorResult:
    executor: str
    rows: list[DispatchRow] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)
    start_s: float = 0.0  # daemon start → ready (Ray's start included)
    big_ms: Spread | None = None  # 64 MiB vector_add, submit → result
    error: str = ""


def measure(repeats: int = 3, quick: bool = False) -> list[ExecutorResult]:
    divisor = QUICK_DIVISOR if quick else 1
    sequential, per_client = (max(1, n // divisor) for n in COUNTS)
    one = Plan(sequential, repeats, max(1, sequential // 4))
    many = Plan(per_client, repeats, max(1, per_client // 4))
    return [_measure_one(name, one, many) for name in ("local", "ray")]


def _measure_one(executor: str, one: Plan, many: Plan) -> ExecutorResult:
    result = ExecutorResult(executor)
    try:
        with _daemon(executor) as (daemon, start_s):
            result.start_s = start_s
            name = f'taogpud, executor "{executor}"'
            result.rows, result.breakdown = taogpud_client.measure(daemon, one, CLIENTS, many, name)
            result.big_ms = _big_job(daemon, one.repeats)
    except Exception as exc:  # ray not installed, a cluster that would not start: say so
        result.error = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
    return result


@contextlib.contextmanager
def _daemon(executor: str) -> Iterator[tuple[RunningDaemon, float]]:
    if executor == "local":
        started = time.monotonic()
        with running() as daemon:
            yield daemon, time.monotonic() - started
        return
    ray_root = Path(tempfile.mkdtemp(prefix="tgd-ray-", dir="/tmp"))
    env = {"RAY_TMPDIR": str(ray_root), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        started = time.monotonic()
        with running(config=RAY_LOCAL, env=env) as daemon:
            yield daemon, time.monotonic() - started
    finally:
        shutil.rmtree(ray_root, ignore_errors=True)


def _big_job(daemon: RunningDaemon, repeats: int) -> Spread:
    import numpy as np

    a = np.arange(BIG_FLOATS, dtype=np.float32)
    with daemon.client() as client:
        inputs = {"a": client.upload_array(a)["id"], "b": client.upload_array(a)["id"]}
        medians = []
        for _ in range(repeats):
            times = []
            for _ in range(BIG_RUNS):
                started = time.perf_counter()
                job = client.run("vector_add", inputs=inputs, keep_outputs=True, wait_s=120)
                times.append((time.perf_counter() - started) * 1e3)
                if job["status"] != "succeeded":
                    raise RuntimeError(f"vector_add failed: {job['error']}")
            medians.append(statistics.median(times))
    return Spread.of(medians)


def report_lines(results: list[ExecutorResult]) -> list[str]:
    """The report's section: one table, then the Ray/local ratios."""
    lines = [
        "## Ray executor vs local (issue 10)",
        "",
        "The same daemon and CPU pair, workers as spawned processes (`local`) or as two Ray "
        "actors on a local Ray with 2 logical GPUs (`ray`), measured one after the other in "
        "this run; medians of the repeats (min–max). `python -m bench.ray_executor`.",
        "",
        "| executor | ready after s | 1 client jobs/s | p50 ms | 8 clients jobs/s | "
        "queue ms | run in worker ms | 64 MiB vector_add ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        lines.append(_row(result))
    lines += ["", *_ratios(results)]
    return lines


def _row(result: ExecutorResult) -> str:
    if result.error:
        return f"| {result.executor} | not measured: {result.error} |||||||"
    single, multi = result.rows
    parts = [
        result.executor,
        f"{result.start_s:.1f}",
        _text(single.jobs_per_s),
        _text(single.p50_ms, ".2f"),
        _text(multi.jobs_per_s),
        f"{result.breakdown.get('queue_ms', float('nan')):.2f}",
        f"{result.breakdown.get('worker_run_ms', float('nan')):.2f}",
        _text(result.big_ms, ".1f"),
    ]
    return "| " + " | ".join(parts) + " |"


def _ratios(results: list[ExecutorResult]) -> list[str]:
    by_name = {r.executor: r for r in results if not r.error}
    if set(by_name) != {"local", "ray"}:
        return ["Ratios: not measured (one executor failed)."]
    local, ray = by_name["local"], by_name["ray"]

    def ratio(get: Any) -> str:
        return f"{get(ray) / get(local):.2f}"

    return [
        "Ray / local: 1 client jobs/s "
        + ratio(lambda r: r.rows[0].jobs_per_s.median)
        + ", p50 latency "
        + ratio(lambda r: r.rows[0].p50_ms.median)
        + ", 8 clients jobs/s "
        + ratio(lambda r: r.rows[1].jobs_per_s.median)
        + ", 64 MiB vector_add latency "
        + ratio(lambda r: r.big_ms.median)
        + "."
    ]


def _text(spread: Spread | None, spec: str = ",.0f") -> str:
    return "–" if spread is None else spread.text(spec)


def ray_executor_section(repeats: int, quick: bool) -> list[str]:
    """Measure both executors and word the report's section (bench/run.py's hook)."""
    return report_lines(measure(repeats, quick))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of the jobs")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per measurement")
    args = parser.parse_args()
    print("\n".join(ray_executor_section(args.repeats, args.quick)))


if __name__ == "__main__":
    main()
