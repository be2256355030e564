"""The dispatch targets, each as a ratio of two numbers measured in the same run.

A GPU job takes milliseconds, so dispatch is a floor, not a race (issue 18, point 5):

- the tiny-job p50 (1 client, the Python client) below Ray's warm actor's in the same run;
- 8 clients at least 1.5× Ray's warm actor with 8 clients, in the same run;
- 8 clients at least 8× dask's LocalCluster with 8 clients, in the same run;

all on public server APIs. Each says met or missed from the run (or, when most repeats of
one of its numbers were disturbed, that the run cannot say). The upload target moved to the
data-path issue; the report still shows the data path's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.datapath import SizeResult
from bench.peers import dask_local, taogpud_client
from bench.stats import DispatchRow, Spread

RAY_ACTOR = "Ray local, a warm actor"
RAY_CLIENTS_FACTOR, DASK_CLIENTS_FACTOR = 1.5, 8.0


@dataclass(frozen=True)
class Target:
    goal: str
    measured: str
    ratio: float | None  # measured against the goal: ≥ 1 is met
    note: str = ""
    unsettled: str = ""  # why the repeats do not bear a verdict (see _unsettled)

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "not measured"
        if self.unsettled:
            return "not settled: run again on a quieter host"
        return "met" if self.ratio >= 1 else "missed"


def evaluate(rows: list[DispatchRow], sizes: list[SizeResult], clients: int) -> list[Target]:
    """`sizes` is taken for the report's sake; no target reads it now."""
    ray_one, ray_many = _row(rows, RAY_ACTOR, 1), _row(rows, RAY_ACTOR, clients)
    many = _row(rows, taogpud_client.NAME, clients)
    return [
        _p50(_row(rows, taogpud_client.NAME, 1), ray_one),
        _versus(many, ray_many, RAY_CLIENTS_FACTOR, RAY_ACTOR),
        _versus(many, _row(rows, dask_local.NAME, clients), DASK_CLIENTS_FACTOR, "dask local"),
    ]


def _row(rows: list[DispatchRow], system: str, clients: int) -> DispatchRow | None:
    for row in rows:
        if row.system == system and row.clients == clients and row.jobs_per_s is not None:
            return row
    return None


def _p50(seq: DispatchRow | None, ray: DispatchRow | None) -> Target:
    goal = f"p50 tiny-job latency below {RAY_ACTOR}'s in the same run (1 client, Python client)"
    if seq is None or ray is None or seq.p50_ms is None or ray.p50_ms is None:
        return Target(goal, "—", None)
    ours, theirs = seq.p50_ms.median, ray.p50_ms.median
    return Target(
        goal,
        f"p50 {ours:.3f} vs {theirs:.3f} ms",
        theirs / ours,
        f"{ours / theirs:.2f}× Ray's",
        _unsettled(("taogpud's p50", seq.p50_ms, "ms"), ("Ray's p50", ray.p50_ms, "ms")),
    )


def _versus(
    many: DispatchRow | None, peer: DispatchRow | None, factor: float, label: str
) -> Target:
    clients = many.clients if many else "many"
    goal = f"{clients} clients ≥ {factor:g}× {label} with as many, in the same run"
    if many is None or peer is None or many.jobs_per_s is None or peer.jobs_per_s is None:
        return Target(goal, "—", None)
    ours, theirs = many.jobs_per_s.median, peer.jobs_per_s.median
    measured = f"{ours:,.0f} vs {theirs:,.0f} jobs/s ({peer.system}): {ours / theirs:.2f}×"
    unsettled = _unsettled(
        ("taogpud", many.jobs_per_s, "jobs/s"), (peer.system, peer.jobs_per_s, "jobs/s")
    )
    return Target(goal, measured, ours / theirs / factor, unsettled=unsettled)


def _unsettled(*spreads: tuple[str, Spread, str]) -> str:
    """Why a ratio bears no verdict: the median of one of its numbers is less than half its
    best repeat (a busy host), or "" when they all held. Rates are better high, ms low."""
    return "; ".join(
        f"{name} ran a median of {spread.median:,.3g} {unit}, its repeats "
        f"{spread.low:,.3g}–{spread.high:,.3g}"
        for name, spread, unit in spreads
        if not spread.steady(higher_is_better=unit != "ms")
    )
