"""Prometheus metrics, computed from the daemon's state when scraped (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from taogpud.state import DaemonState


class DaemonCollector:
    def __init__(self, daemon: DaemonState) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        scheduler = self.daemon.scheduler
        yield _gauge("taogpud_jobs_running", "jobs running now", scheduler.running_total)
        yield _gauge("taogpud_jobs_queued", "jobs waiting for a slot", scheduler.queued)
        yield _gauge(
            "taogpud_max_concurrent_tasks", "the global cap", scheduler.policy.max_concurrent_tasks
        )
        yield _gauge(
            "taogpud_config_generation", "config generation in force", self.daemon.generation
        )
        finished = CounterMetricFamily(
            "taogpud_jobs_finished", "finished jobs", labels=["task", "backend", "status"]
        )
        for (task, backend, status), count in scheduler.finished_counts.items():
            finished.add_metric([task, backend, status], count)
        yield finished
        workers = GaugeMetricFamily(
            "taogpud_worker_up", "1 if the worker is warm", labels=["device"]
        )
        for worker in self.daemon.pool.workers:
            workers.add_metric([worker.label], 1.0 if worker.state.value == "warm" else 0.0)
        yield workers


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


# Collectors of the daemon's other rooms (the relay's), by name: a new one replaces the old.
EXTRA_COLLECTORS: dict[str, Collector] = {}


def render_metrics(daemon: DaemonState) -> tuple[bytes, str]:
    registry = CollectorRegistry()
    registry.register(DaemonCollector(daemon))
    for collector in EXTRA_COLLECTORS.values():
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST
