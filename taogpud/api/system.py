"""The daemon itself: health, info, status, devices, the task catalog, metrics."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Request, Response

from taogpud import __version__, tasks, wire
from taogpud.api.deps import Daemon, Metrics
from taogpud.api.models import (
    ArraysView,
    DoorView,
    HealthView,
    InfoView,
    StatusView,
    WorkerView,
)
from taogpud.api.peer import peer_of
from taogpud.daemon.state import DaemonState, Phase
from taogpud.observability.logging import write_failures
from taogpud.observability.metrics import render_metrics

router = APIRouter(tags=["daemon"])


@router.get(wire.HEALTH.path, response_model=HealthView)
async def health(daemon: Daemon) -> HealthView:
    return HealthView(ok=daemon.status.phase is Phase.ready, state=daemon.status.phase.value)


@router.get(wire.INFO.path, response_model=InfoView)
async def info(daemon: Daemon) -> InfoView:
    snapshot = daemon.status.snapshot
    return InfoView(
        version=__version__,
        backend=daemon.status.backend,
        fallback=daemon.status.fallback,
        devices=devices_of(daemon),
        config_digest=snapshot.digest,
        config_generation=daemon.status.generation,
        settings_path=str(snapshot.settings_path) if snapshot.settings_path else None,
        config_path=str(snapshot.config_path) if snapshot.config_path else None,
        key_source=snapshot.key_source,
        pid=os.getpid(),
    )


@router.get(wire.STATUS.path, response_model=StatusView)
async def status(request: Request, daemon: Daemon) -> StatusView:
    view = status_of(daemon)
    view.arrays = ArraysView(**daemon.arrays.view(peer_of(request)))
    return view


@router.get(wire.DEVICES.path)
async def devices(daemon: Daemon) -> list[dict[str, Any]]:
    return devices_of(daemon)


@router.get(wire.TASKS.path)
async def task_catalog() -> list[dict[str, Any]]:
    return [task.catalog_entry() for task in tasks.all_tasks()]


@router.get(wire.METRICS.path, response_class=Response)
async def metrics(registry: Metrics) -> Response:
    body, content_type = render_metrics(registry)
    return Response(body, media_type=content_type)


def status_of(daemon: DaemonState) -> StatusView:
    policy = daemon.scheduler.policy
    return StatusView(
        state=daemon.status.phase.value,
        backend=daemon.status.backend,
        fallback=daemon.status.fallback,
        fallback_reason=daemon.status.fallback_reason,
        running=daemon.scheduler.running_total,
        queued=daemon.scheduler.queued,
        max_concurrent_tasks=policy.max_concurrent_tasks,
        queue_limit=policy.queue_limit,
        strategy=policy.strategy,
        gpu_affinity=policy.gpu_affinity,
        config_generation=daemon.status.generation,
        jobs_total=daemon.scheduler.jobs_total,
        workers=[_worker_view(w) for w in daemon.pool.workers],
        executor=daemon.pool.executor,
        executor_problem=daemon.pool.problem(),
        log_write_failures=write_failures(),
        store_write_failure=daemon.store.write_failure,
        doors=[DoorView.model_validate(view) for view in daemon.doors.views()],
    )


def _worker_view(worker: Any) -> WorkerView:
    return WorkerView(
        device=worker.label,
        index=worker.spec.index,
        pid=worker.pid,
        state=worker.state.value,
        running=len(worker.running),
        slots=worker.spec.stream_count,
        jobs_done=worker.jobs_done,
        restarts=worker.restarts,
        warmup_ms=worker.info.warmup_ms if worker.info else None,
        node=worker.info.extra.get("hostname") if worker.info else None,
        problem=_problem_of(worker),
    )


def _problem_of(worker: Any) -> str | None:
    if worker.state.value == "warm":
        return None
    if worker.warm_failure:
        return str(worker.warm_failure)
    return str(worker.exit_description()) if worker.state.value == "dead" else None


def devices_of(daemon: DaemonState) -> list[dict[str, Any]]:
    found = []
    for worker in daemon.pool.workers:
        entry = (
            worker.info.as_dict()
            if worker.info
            else {"device": worker.label, "index": worker.spec.index}
        )
        entry["worker_state"] = worker.state.value
        entry["fallback"] = worker.spec.fallback_reason is not None
        found.append(entry)
    return found
