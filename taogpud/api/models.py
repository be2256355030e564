"""The wire types of the control API (v1). The job view is `taogpud.jobs.JobRecord`.

Routes (all JSON unless said; errors are always {code, message, hint}):

    GET  /v1/health                       HealthView
    GET  /v1/info                         InfoView
    GET  /v1/status                       StatusView
    GET  /v1/devices                      list[dict]   (DeviceInfo.as_dict(), per worker)
    GET  /v1/tasks                        list[dict]   (Task.catalog_entry())
    POST /v1/arrays        body: .npy     ArrayView    (application/octet-stream; an input for jobs)
    POST /v1/jobs?wait_s=S body: JobRequest → JobRecord  (201; wait_s: until done, at most S)
    GET  /v1/jobs?status=&limit=          list[JobRecord]  newest first
    GET  /v1/jobs/{id}                    JobRecord
    GET  /v1/jobs/{id}/wait?timeout_s=S   JobRecord    (when finished, or its current state after S)
    POST /v1/jobs/{id}/cancel             JobRecord
    GET  /v1/jobs/{id}/outputs/{name}     .npy bytes   (application/octet-stream)
    GET  /v1/config                       the effective config, redacted
    GET  /v1/config/status                ConfigStatusView
    POST /v1/channel/ping?model=&timeout_s=  channel.PingResult  (the guide's ping; ok says how)
    GET  /v1/doctor?ping=&probe=&timeout_s=  DoctorView   (the daemon-side checks; ok: none failed)
    GET  /v1/openapi.json                 the OpenAPI document
    GET  /metrics                         Prometheus text
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

# What the core speaks too (the scheduler, the shm server, reload): defined in taogpud.wire,
# named here for the API's own modules.
from taogpud.wire import ChangeView, JobRequest, ReloadView

__all__ = [
    "ArrayView",
    "ArraysView",
    "ChangeView",
    "CheckView",
    "ConfigStatusView",
    "DoctorView",
    "HealthView",
    "InfoView",
    "JobRequest",
    "ReloadView",
    "StatusView",
    "WorkerView",
]


class ArrayView(BaseModel):
    id: str
    shape: list[int]
    dtype: str
    nbytes: int


class HealthView(BaseModel):
    ok: bool
    state: str  # "starting" | "ready" | "draining"


class WorkerView(BaseModel):
    device: str
    index: int
    pid: int | None
    state: str  # "starting" | "warm" | "dead"
    running: int
    slots: int
    jobs_done: int
    restarts: int
    warmup_ms: float | None
    node: str | None = None  # executor "ray": the hostname of the actor's node
    problem: str | None = None  # a worker that is not warm: why (its warm-up failure or death)


class ArraysView(BaseModel):
    """The bounds on uploads (taogpud/arrays.py), as one caller sees them."""

    budget_bytes: int  # all arrays together
    used_bytes: int
    user_quota_bytes: int  # each user's pending arrays (used by no queued or running job)
    your_pending_bytes: int  # the caller's pending arrays
    eviction: str  # the order in which an upload makes room


class StatusView(BaseModel):
    state: str
    backend: str
    fallback: bool
    fallback_reason: str | None
    running: int
    queued: int
    max_concurrent_tasks: int
    queue_limit: int
    strategy: str
    gpu_affinity: bool
    config_generation: int
    jobs_total: int
    workers: list[WorkerView]
    executor: str = "local"  # where the workers live: "local" | "ray"
    executor_problem: str | None = None  # e.g. a Ray cluster that does not answer
    arrays: ArraysView | None = None
    log_write_failures: int = 0  # log lines lost to a dead, full or failing stdout
    store_write_failure: str | None = None  # why the job store cannot be written now


class InfoView(BaseModel):
    version: str
    backend: str
    fallback: bool
    devices: list[dict[str, Any]]
    config_digest: str
    config_generation: int
    settings_path: str | None
    config_path: str | None
    key_source: str
    pid: int


class ConfigStatusView(BaseModel):
    generation: int
    digest: str
    last_reload: ReloadView


class CheckView(BaseModel):
    """One doctor check (taogpud.doctor.Check)."""

    name: str
    status: Literal["pass", "warn", "fail", "skip"]
    detail: str
    hint: str = ""


class DoctorView(BaseModel):
    ok: bool  # no check failed
    checks: list[CheckView]
    daemon: dict[str, Any]  # who answered: version, pid, backend, fallback, key_source, paths, …
