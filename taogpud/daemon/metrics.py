"""The daemon's Prometheus collector: the scheduler's counts, the config generation, the
workers, the job time histograms (observability/metrics.py has the names and the registry).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from taogpud.daemon.state import DaemonState
from taogpud.observability.metrics import gauge


class DaemonCollector:
    def __init__(self, daemon: DaemonState) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        scheduler = self.daemon.scheduler
        yield gauge("taogpud_jobs_running", "jobs running now", scheduler.running_total)
        yield gauge("taogpud_jobs_queued", "jobs waiting for a slot", scheduler.queued)
        yield gauge(
            "taogpud_max_concurrent_tasks", "the global cap", scheduler.policy.max_concurrent_tasks
        )
        yield gauge(
            "taogpud_config_generation", "config generation in force", self.daemon.status.generation
        )
        finished = CounterMetricFamily(
            "taogpud_jobs_finished", "finished jobs", labels=["task", "backend", "status"]
        )
        for (task, backend, status), count in scheduler.finished_counts.items():
            finished.add_metric([task, backend, status], count)
        yield finished
        verdicts = CounterMetricFamily(
            "taogpud_program_verdicts",
            "what NVML showed of programs: gpu_memory_exceeded, never_used_gpu, unassigned_gpu",
            labels=["code"],
        )
        for code, count in scheduler.programs.verdicts.items():
            verdicts.add_metric([code], count)
        yield verdicts
        workers = GaugeMetricFamily(
            "taogpud_worker_up", "1 if the worker is warm", labels=["device"]
        )
        for worker in self.daemon.pool.workers:
            workers.add_metric([worker.label], 1.0 if worker.state.value == "warm" else 0.0)
        yield workers
        yield from scheduler.job_times.families()
