"""Numbers over repeated runs: one load run's latencies, and the median with min–max of repeats."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile by rank (no interpolation): p99 of 200 samples is the 198th."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# A median further than this from the best repeat says more about the host than about what
# was measured: a 512 MiB raw-socket row once ran a median of 1.90 GiB/s, its best 5.70.
STEADY_WITHIN = 2.0


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements with their min and max."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        collected = list(values)
        return cls(statistics.median(collected), min(collected), max(collected))

    def text(self, spec: str = ",.0f") -> str:
        return f"{self.median:{spec}} ({self.low:{spec}}–{self.high:{spec}})"

    def steady(self, higher_is_better: bool = True, within: float = STEADY_WITHIN) -> bool:
        """Whether the median can be trusted: within `within` × the best repeat. One bad
        repeat of three leaves the median alone; two of them drag it down with them."""
        if higher_is_better:
            return self.median * within >= self.high
        return self.median <= within * self.low


@dataclass(frozen=True)
class LoadRun:
    """One repeat of a load: every job's submit → result latency, and the wall time of all."""

    latencies_s: list[float]
    wall_s: float

    @property
    def jobs_per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_s, 0.50) * 1e3

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_s, 0.99) * 1e3


@dataclass(frozen=True)
class DispatchRow:
    """One system under one load, over the repeats; `error` when it could not be measured."""

    system: str
    clients: int
    jobs: int = 0  # per repeat
    jobs_per_s: Spread | None = None
    p50_ms: Spread | None = None
    p99_ms: Spread | None = None
    note: str = ""
    error: str = ""

    @classmethod
    def from_runs(
        cls, system: str, clients: int, runs: list[LoadRun], note: str = ""
    ) -> DispatchRow:
        return cls(
            system,
            clients,
            len(runs[0].latencies_s),
            Spread.of(run.jobs_per_s for run in runs),
            Spread.of(run.p50_ms for run in runs),
            Spread.of(run.p99_ms for run in runs),
            note,
        )


def pool_rounds(rounds: list[list[DispatchRow]]) -> list[DispatchRow]:
    """One row per system and client count from rows measured in rounds, in the order first
    seen: each round's median is one repeat of the pooled row (its median, min and max).

    A round in which a system could not be measured is named in the row's note and the
    others still count; a system never measured keeps its first error row."""
    by_key: dict[tuple[str, int], list[DispatchRow]] = {}
    for measured in rounds:
        for row in measured:
            by_key.setdefault((row.system, row.clients), []).append(row)
    return [_pooled(rows, len(rounds)) for rows in by_key.values()]


def _pooled(rows: list[DispatchRow], rounds: int) -> DispatchRow:
    measured = [row for row in rows if _measured(row)]
    if not measured:
        return rows[0]
    first, note = measured[0], measured[0].note
    if len(measured) < rounds:
        errors = [row.error for row in rows if not _measured(row) and row.error]
        missing = f"{rounds - len(measured)} of {rounds} rounds not measured"
        missing += f": {errors[0]}" if errors else ""
        note = f"{note}; {missing}" if note else missing
    return DispatchRow(
        first.system,
        first.clients,
        first.jobs,
        _medians(row.jobs_per_s for row in measured),
        _medians(row.p50_ms for row in measured),
        _medians(row.p99_ms for row in measured),
        note,
    )


def _measured(row: DispatchRow) -> bool:
    return not row.error and row.jobs_per_s is not None and row.p50_ms is not None


def _medians(spreads: Iterable[Spread | None]) -> Spread | None:
    medians = [spread.median for spread in spreads if spread is not None]
    return Spread.of(medians) if medians else None
