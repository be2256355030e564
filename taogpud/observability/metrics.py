"""Prometheus metrics, computed from the daemon's state when scraped (nothing on the hot path
but JobTimes.observe: a bisect and three additions when a job finishes). Each room brings its
collector (the daemon's, daemon/metrics.py; the relay's, relay/metrics.py): this knows none
of them, and reads of a job only what `TimedJob` says.

The names (packaging/grafana/taogpud.json charts them; tests/test_metrics.py checks each of its
queries against a live scrape):

    taogpud_jobs_running, taogpud_jobs_queued, taogpud_max_concurrent_tasks,
    taogpud_config_generation                               gauges
    taogpud_jobs_finished_total{task,backend,status}        counter
    taogpud_worker_up{device}                               gauge
    taogpud_job_queue_seconds{task,backend,fallback}        histogram: created → a slot
    taogpud_job_run_seconds{task,backend,fallback}          histogram: in its slot → finished
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector


class TimedJob(Protocol):
    """What JobTimes reads of a finished job (a jobs.records.JobRecord is one)."""

    task: str
    backend: str | None
    fallback: bool
    created_at: float
    started_at: float | None
    finished_at: float | None


# Upper bounds (s). Queue: from a free slot's ~1 ms to a backlog's minutes. Run: tiny jobs
# take ~1 ms on a warm worker, GPU jobs up to their timeout.
QUEUE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RUN_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
TIME_LABELS = ["task", "backend", "fallback"]


@dataclass
class Buckets:
    """One histogram series: a count per bucket (not yet cumulative), their sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1  # le: bound ≥ value
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, jobs at or under it) as Prometheus wants them, ending with +Inf."""
        running, rows = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            rows.append((bound, float(running)))
        return rows


class JobTimes:
    """Queue and run time of the jobs that got a slot, by task, backend and fallback; the
    scheduler calls observe() as a job finishes, a scrape reads the series."""

    def __init__(self) -> None:
        self.queue: dict[tuple[str, str, str], Buckets] = {}
        self.run: dict[tuple[str, str, str], Buckets] = {}

    def observe(self, job: TimedJob) -> None:
        if job.started_at is None or job.finished_at is None:
            return  # never ran (cancelled in the queue, refused): no run, no finished wait
        key = (job.task, job.backend or "none", "true" if job.fallback else "false")
        queued_s = max(job.started_at - job.created_at, 0.0)
        self.queue.setdefault(key, Buckets(QUEUE_BUCKETS_S)).observe(queued_s)
        ran_s = max(job.finished_at - job.started_at, 0.0)
        self.run.setdefault(key, Buckets(RUN_BUCKETS_S)).observe(ran_s)

    def families(self) -> Iterator[Metric]:
        for name, documentation, series in (
            ("taogpud_job_queue_seconds", "from submitted to a slot", self.queue),
            ("taogpud_job_run_seconds", "from a slot to finished", self.run),
        ):
            family = HistogramMetricFamily(name, documentation, labels=TIME_LABELS)
            for labels, buckets in series.items():
                family.add_metric(list(labels), buckets.cumulative(), buckets.sum_s)
            yield family


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def metrics_registry(*collectors: Collector) -> CollectorRegistry:
    """The rooms' collectors (the daemon's, daemon/metrics.py; the relay's), built once at
    start (daemon/compose.py); each scrape reads them afresh."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return registry


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(registry), CONTENT_TYPE_LATEST
