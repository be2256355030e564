"""PNG charts for the report (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import datapath
from bench.datapath import SizeResult
from bench.stats import DispatchRow, Spread

BAR_HEIGHT = 0.38


def draw_all(
    folder: Path, rows: list[DispatchRow], sizes: list[SizeResult], clients: int
) -> list[tuple[str, str]]:
    """Write the charts into `folder`; (file name, caption) for each."""
    import matplotlib

    matplotlib.use("Agg")
    measured = [row for row in rows if row.jobs_per_s is not None]
    charts = [
        ("dispatch_throughput.png", "tiny jobs per second, 1 and 8 clients", _throughput),
        ("dispatch_latency.png", "tiny-job latency, 1 client: p50 and p99", _latency),
    ]
    written = []
    for file, caption, draw in charts:
        draw(folder / file, measured, clients)
        written.append((file, caption))
    if sizes:
        _datapath(folder / "datapath.png", sizes)
        written.append(("datapath.png", "data path throughput, GiB/s"))
    return written


def _systems(rows: list[DispatchRow]) -> list[str]:
    return list(dict.fromkeys(row.system for row in rows))


def _errors(spreads: list[Spread | None]) -> list[list[float]]:
    return [
        [s.median - s.low if s else 0.0 for s in spreads],
        [s.high - s.median if s else 0.0 for s in spreads],
    ]


def _throughput(path: Path, rows: list[DispatchRow], clients: int) -> None:
    import matplotlib.pyplot as plt

    systems = _systems(rows)
    figure, axes = plt.subplots(figsize=(10, 0.55 * len(systems) + 1.5))
    for offset, count in ((-BAR_HEIGHT / 2, 1), (BAR_HEIGHT / 2, clients)):
        spreads = [_find(rows, system, count, "jobs_per_s") for system in systems]
        values = [s.median if s else 0.0 for s in spreads]
        positions = [n + offset for n in range(len(systems))]
        axes.barh(
            positions,
            values,
            BAR_HEIGHT,
            xerr=_errors(spreads),
            label="1 client" if count == 1 else f"{count} clients",
        )
    _finish(axes, systems, "jobs/s (log scale; bars: median, whiskers: min–max)")
    _save(figure, path)


def _latency(path: Path, rows: list[DispatchRow], clients: int) -> None:
    import matplotlib.pyplot as plt

    systems = [s for s in _systems(rows) if _find(rows, s, 1, "p50_ms")]
    figure, axes = plt.subplots(figsize=(10, 0.45 * len(systems) + 1.5))
    p50 = [_find(rows, s, 1, "p50_ms") for s in systems]
    p99 = [_find(rows, s, 1, "p99_ms") for s in systems]
    positions = list(range(len(systems)))
    axes.barh(positions, [s.median if s else 0.0 for s in p50], 0.6, xerr=_errors(p50), label="p50")
    axes.scatter([s.median if s else 0.0 for s in p99], positions, marker="|", s=200,
                 color="black", label="p99", zorder=3)  # fmt: skip
    axes.axvline(0.5, color="red", linestyle="--", linewidth=1, label="target p50 0.5 ms")
    _finish(axes, systems, "ms per job, 1 client (log scale)")
    _save(figure, path)


def _datapath(path: Path, sizes: list[SizeResult]) -> None:
    import matplotlib.pyplot as plt

    methods = list(datapath.METHODS)
    figure, axes = plt.subplots(figsize=(10, 0.7 * len(methods) + 1.5))
    height = 0.8 / len(sizes)
    for n, size in enumerate(sizes):
        spreads: list[Spread | None] = [size.gib_per_s[m] for m in methods]
        positions = [i + (n - (len(sizes) - 1) / 2) * height for i in range(len(methods))]
        axes.barh(positions, [s.median if s else 0.0 for s in spreads], height,
                  xerr=_errors(spreads), label=f"{size.size_mib} MiB")  # fmt: skip
    axes.set_yticks(range(len(methods)), methods)
    axes.invert_yaxis()
    axes.set_xlabel("GiB/s (median, whiskers: min–max)")
    axes.legend(loc="lower right")
    axes.grid(axis="x", alpha=0.3)
    _save(figure, path)


def _find(rows: list[DispatchRow], system: str, clients: int, metric: str) -> Spread | None:
    for row in rows:
        if row.system == system and row.clients == clients:
            found: Spread | None = getattr(row, metric)
            return found
    return None


def _finish(axes: Any, systems: list[str], label: str) -> None:
    axes.set_yticks(range(len(systems)), systems)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlabel(label)
    axes.legend(loc="lower right")
    axes.grid(axis="x", alpha=0.3, which="both")


def _save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
