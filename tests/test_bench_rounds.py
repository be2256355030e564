"""The bench's dispatch rows, measured in rounds: every system once per round, in turn, and
each row pooled over the rounds (bench/stats.py `pool_rounds`, bench/dispatch.py).

Before, each system ran all its repeats back to back, minutes from the next: a host that
grew busier part-way through a run slowed the systems measured then, and a target that is
a ratio of two systems said more about when each ran than about either.
"""

from __future__ import annotations

import pytest

from bench.dispatch import round_order
from bench.stats import DispatchRow, Spread, pool_rounds


def row(system: str, jobs_per_s: float, p50_ms: float, clients: int = 1) -> DispatchRow:
    p99_ms = p50_ms * 3
    return DispatchRow(
        system,
        clients,
        100,
        Spread(jobs_per_s, jobs_per_s, jobs_per_s),
        Spread(p50_ms, p50_ms, p50_ms),
        Spread(p99_ms, p99_ms, p99_ms),
        note="a note",
    )


def test_each_round_is_one_repeat_of_the_pooled_row() -> None:
    rounds = [
        [row("ours", 900, 1.2), row("ours", 2000, 3.0, clients=8), row("ray", 1300, 0.7)],
        [row("ray", 1200, 0.8), row("ours", 1500, 0.6), row("ours", 2400, 2.9, clients=8)],
        [row("ours", 1400, 0.7), row("ours", 2300, 3.2, clients=8), row("ray", 1250, 0.75)],
    ]
    pooled = pool_rounds(rounds)
    assert [(r.system, r.clients) for r in pooled] == [("ours", 1), ("ours", 8), ("ray", 1)]
    ours = pooled[0]
    assert ours.jobs_per_s == Spread(1400, 900, 1500)
    assert ours.p50_ms == Spread(0.7, 0.6, 1.2)
    assert ours.p99_ms is not None
    assert (ours.p99_ms.median, ours.p99_ms.low, ours.p99_ms.high) == pytest.approx((2.1, 1.8, 3.6))
    assert (ours.jobs, ours.note, ours.error) == (100, "a note", "")
    assert pooled[2].p50_ms == Spread(0.75, 0.7, 0.8)


def test_a_round_that_failed_is_named_and_the_others_still_count() -> None:
    failed = DispatchRow("ray", 1, error="ray.init timed out")
    pooled = pool_rounds([[row("ray", 1000, 0.9)], [failed], [row("ray", 1100, 0.8)]])
    assert len(pooled) == 1
    assert pooled[0].jobs_per_s == Spread(1050, 1000, 1100)
    assert pooled[0].note == "a note; 1 of 3 rounds not measured: ray.init timed out"
    assert pooled[0].error == ""


def test_a_system_that_failed_in_every_round_stays_an_error_row() -> None:
    failed = DispatchRow("dask", 1, error="no module named 'distributed'")
    pooled = pool_rounds([[failed], [failed]])
    assert pooled == [failed]


def test_the_order_turns_round_each_round() -> None:
    systems = ["echo", "taogpud", "pool", "dask", "ray"]
    assert round_order(systems, 0) == systems
    assert round_order(systems, 1) == list(reversed(systems))
    assert round_order(systems, 2) == systems
    # over two rounds taogpud and Ray sit, on average, as far from the run's start
    first, second = round_order(systems, 0), round_order(systems, 1)
    mean = {s: (first.index(s) + second.index(s)) / 2 for s in systems}
    assert mean["taogpud"] == mean["ray"] == mean["echo"]
