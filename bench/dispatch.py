"""Tiny-job dispatch, submit → result: taogpud and every peer, 1 client and 8 clients.

Each peer runs in a fresh spawned process (its imports, threads and cluster end with it);
taogpud runs as a real daemon reached through its socket, as in the tests.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
from bench.stats import DispatchRow, pool_rounds

T = TypeVar("T")

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
# api.request lines (where_time_goes reads the server's time from them) are written at
# level debug since issue 35; the bench always measured with them written.
TRACED_LOGS = {"logging": {"level": "debug"}}
QUIET_LOGS = {"logging": {"requestTrace": False, "level": "warning"}}
QUIET_NAME = "taogpud, Python client, request/job traces off (A/B)"
# The guide's placement: a lone client's jobs alternate between the two workers.
ROUND_ROBIN_NAME = "taogpud, Python client, round_robin (A/B)"


@dataclass
class DispatchResult:
    rows: list[DispatchRow] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)  # the first round's daemon's traces
    peer_footprints: dict[str, dict[str, float]] = field(default_factory=dict)  # start, RSS


# One system's part of a round: its rows (1 client and 8), each over one repeat.
Measure = Callable[[DispatchResult, bool], list[DispatchRow]]


def plans(kind: str, repeats: int, quick: bool) -> tuple[Plan, Plan]:
    divisor = QUICK_DIVISOR if quick else 1
    sequential, per_client = (max(1, n // divisor) for n in COUNTS[kind])
    return (
        Plan(sequential, repeats, max(1, sequential // 4)),
        Plan(per_client, repeats, max(1, per_client // 4)),
    )


def measure(repeats: int, quick: bool, systems: Sequence[Measure] | None = None) -> DispatchResult:
    """`repeats` rounds: in each, every system runs once, in turn, the order reversed every
    other round; each row is then pooled over the rounds, a round's number one repeat.

    The targets are ratios of two systems (taogpud's p50 against Ray's warm actor's, ...),
    and this host is shared: measured all repeats at a time, the systems ran minutes apart,
    and a host that grew busier in between slowed one side of a ratio only. In rounds, each
    system meets the same stretches of the run (and each round starts every system anew).
    `systems`: these instead of all of SYSTEMS (bench/refactor_guard.py measures two)."""
    result = DispatchResult()
    rounds = []
    for number in range(repeats):
        print(f"-- round {number + 1} of {repeats}", flush=True)
        rounds.append(
            [
                row
                for system in round_order(systems or SYSTEMS, number)
                for row in system(result, quick)
            ]
        )
    result.rows = pool_rounds(rounds)
    return result


def round_order(systems: Sequence[T], number: int) -> list[T]:
    """The systems in round `number`'s order: as listed, then reversed, and so on, so that
    over two rounds each system stands as far from the start as any other."""
    return list(systems) if number % 2 == 0 else list(reversed(systems))


def _taogpud(result: DispatchResult, quick: bool) -> list[DispatchRow]:
    one, many = plans("taogpud", 1, quick)
    with running(TRACED_LOGS) as daemon:
        rows, breakdown = taogpud_client.measure(daemon, one, CLIENTS, many)
        result.breakdown = result.breakdown or breakdown
        print_rows(rows)
        cli_one, cli_many = plans("taogpuctl", 1, quick)
        socket_path = str(daemon.socket_path)
        rows += _peer(
            result,
            taogpuctl.NAME,
            lambda: taogpuctl.measure(socket_path, cli_one, CLIENTS, cli_many),
        )
    for name, settings, config in (
        (QUIET_NAME, QUIET_LOGS, None),
        (ROUND_ROBIN_NAME, None, ROUND_ROBIN),
    ):
        with running(settings, config) as daemon:
            variant, _ = taogpud_client.measure(daemon, one, CLIENTS, many, name)
        print_rows(variant)
        rows += variant
    return rows


def isolated_peer(name: str, measure: Callable[..., Any], kind: str) -> Measure:
    """A peer measured in a fresh spawned process, one repeat of its plans."""
    return lambda result, quick: _peer(result, name, measure, plans(kind, 1, quick))


def _peer(
    result: DispatchResult,
    name: str,
    measure: Callable[..., Any],
    plan_pair: tuple[Plan, Plan] | None = None,
) -> list[DispatchRow]:
    """Measure one peer (isolated when it has plans); a failure becomes a row saying why."""
    try:
        if plan_pair is None:
            found = measure()
        else:
            found = isolated(measure, plan_pair[0], CLIENTS, plan_pair[1])
    except Exception as exc:  # a missing extra, a cluster that would not start: say so, go on
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        traceback.print_exc()
        return [DispatchRow(name, 1, error=detail)]
    rows, footprint = found if isinstance(found, tuple) else (found, None)
    if footprint is not None:
        result.peer_footprints.setdefault(name, footprint)  # its first start
    print_rows(rows)
    return list(rows)


def print_rows(rows: list[DispatchRow]) -> None:
    print(*(_line(row) for row in rows), sep="\n", flush=True)


# A round, in its first order: the floor, taogpud, then the peers.
SYSTEMS: list[Measure] = [
    isolated_peer("bare asyncio echo", echo.measure, "echo"),
    _taogpud,
    isolated_peer(process_pool.NAME, process_pool.measure, "pool"),
    isolated_peer("process per job", process_per_job.measure, "per_job"),
    isolated_peer(dask_local.NAME, dask_local.measure, "dask"),
    isolated_peer("Ray local", ray_local.measure, "ray"),
]


def _line(row: DispatchRow) -> str:
    if row.error or row.jobs_per_s is None or row.p50_ms is None:
        return f"{row.system}: not measured: {row.error}"
    return (
        f"{row.system}, {row.clients} client(s): {row.jobs_per_s.text()} jobs/s, "
        f"p50 {row.p50_ms.text('.3f')} ms"
    )
