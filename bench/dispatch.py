"""Tiny-job dispatch, submit → result: taogpud and every peer, 1 client and 8 clients.

Each peer runs in a fresh spawned process (its imports, threads and cluster end with it);
taogpud runs as a real daemon reached through its socket, as in the tests.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.daemon_under_test import ROUND_ROBIN, running
from bench.load import Plan, isolated
from bench.peers import (
    dask_local,
    echo,
    process_per_job,
    process_pool,
    ray_local,
    taogpuctl,
    taogpud_client,
)
from bench.stats import DispatchRow

CLIENTS = 8
QUICK_DIVISOR = 5
# Jobs per repeat: (1 client sequential, each of the 8 clients). Slow systems get fewer.
COUNTS = {
    "echo": (5000, 1000),
    "taogpud": (2000, 500),
    "taogpuctl": (10, 2),
    "pool": (2000, 250),
    "per_job": (20, 3),
    "dask": (300, 60),
    "ray": (1000, 100),
}
# The A/B row: the same daemon with request traces off and job traces below the level.
QUIET_LOGS = {"logging": {"requestTrace": False, "level": "warning"}}
QUIET_NAME = "taogpud, Python client, request/job traces off (A/B)"
# The guide's placement: a lone client's jobs alternate between the two workers.
ROUND_ROBIN_NAME = "taogpud, Python client, round_robin (A/B)"


@dataclass
class DispatchResult:
    rows: list[DispatchRow] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)  # from the daemon's traces
    peer_footprints: dict[str, dict[str, float]] = field(default_factory=dict)  # start, RSS


def plans(kind: str, repeats: int, quick: bool) -> tuple[Plan, Plan]:
    divisor = QUICK_DIVISOR if quick else 1
    sequential, per_client = (max(1, n // divisor) for n in COUNTS[kind])
    return (
        Plan(sequential, repeats, max(1, sequential // 4)),
        Plan(per_client, repeats, max(1, per_client // 4)),
    )


def measure(repeats: int, quick: bool) -> DispatchResult:
    result = DispatchResult()
    _peer(result, "bare asyncio echo", echo.measure, plans("echo", repeats, quick))
    _taogpud(result, repeats, quick)
    _peer(result, process_pool.NAME, process_pool.measure, plans("pool", repeats, quick))
    _peer(result, "process per job", process_per_job.measure, plans("per_job", repeats, quick))
    _peer(result, dask_local.NAME, dask_local.measure, plans("dask", repeats, quick))
    _peer(result, "Ray local", ray_local.measure, plans("ray", repeats, quick))
    return result


def _taogpud(result: DispatchResult, repeats: int, quick: bool) -> None:
    one, many = plans("taogpud", repeats, quick)
    with running() as daemon:
        rows, result.breakdown = taogpud_client.measure(daemon, one, CLIENTS, many)
        result.rows += rows
        print(*(_line(row) for row in rows), sep="\n", flush=True)
        cli_one, cli_many = plans("taogpuctl", repeats, quick)
        socket_path = str(daemon.socket_path)
        _peer(
            result,
            taogpuctl.NAME,
            lambda: taogpuctl.measure(socket_path, cli_one, CLIENTS, cli_many),
        )
    for name, settings, config in (
        (QUIET_NAME, QUIET_LOGS, None),
        (ROUND_ROBIN_NAME, None, ROUND_ROBIN),
    ):
        with running(settings, config) as daemon:
            rows, _ = taogpud_client.measure(daemon, one, CLIENTS, many, name)
        result.rows += rows
        print(*(_line(row) for row in rows), sep="\n", flush=True)


def _peer(
    result: DispatchResult,
    name: str,
    measure: Callable[..., Any],
    plan_pair: tuple[Plan, Plan] | None = None,
) -> None:
    """Measure one peer (isolated when it has plans); a failure becomes a row saying why."""
    try:
        if plan_pair is None:
            found = measure()
        else:
            found = isolated(measure, plan_pair[0], CLIENTS, plan_pair[1])
    except Exception as exc:  # a missing extra, a cluster that would not start: say so, go on
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        traceback.print_exc()
        result.rows.append(DispatchRow(name, 1, error=detail))
        return
    rows, footprint = found if isinstance(found, tuple) else (found, None)
    if footprint is not None:
        result.peer_footprints[name] = footprint
    result.rows += rows
    print(*(_line(row) for row in rows), sep="\n", flush=True)


def _line(row: DispatchRow) -> str:
    if row.error or row.jobs_per_s is None or row.p50_ms is None:
        return f"{row.system}: not measured: {row.error}"
    return (
        f"{row.system}, {row.clients} client(s): {row.jobs_per_s.text()} jobs/s, "
        f"p50 {row.p50_ms.text('.3f')} ms"
    )
