"""The API's pydantic views and request models (v1); what the core takes is taogpud.wire's.

The job view is `taogpud.jobs.records.JobRecord`. The paths are taogpud.wire's routes.

Routes (all JSON unless said; errors are always {code, message, hint}):

    GET  /v1/health                       HealthView
    GET  /v1/info                         InfoView
    GET  /v1/status                       StatusView
    GET  /v1/devices                      list[dict]   (DeviceInfo.as_dict(), per worker)
    GET  /v1/tasks                        list[dict]   (Task.catalog_entry())
    POST /v1/arrays        body: .npy     ArrayView    (application/octet-stream; an input for jobs)
    POST /v1/jobs?wait_s=S body: JobRequestModel → JobRecord  (201; wait_s: until done, at most S)
    GET  /v1/jobs?status=&limit=          list[JobRecord]  newest first
    GET  /v1/jobs/{id}                    JobRecord
    GET  /v1/jobs/{id}/wait?timeout_s=S   JobRecord    (when finished, or its current state after S)
    POST /v1/jobs/{id}/cancel             JobRecord
    POST /v1/programs      body: ProgramRequestModel → JobRecord  (201; docs/programs.md)
    GET  /v1/programs/{id}/lease?after=PHASE&wait_s=S  LeaseView  (once its phase is not PHASE)
    POST /v1/programs/{id}/started body: {pid}          JobRecord  (the pid checked, followed)
    POST /v1/programs/{id}/exited  body: ProgramExitModel → JobRecord  (the job ends)
    POST /v1/programs/{id}/log     body: bytes       204  (a detached program's output)
    GET  /v1/programs/{id}/log?offset=N&wait_s=S     LogView  (its log from N)
    GET  /v1/jobs/{id}/outputs/{name}     .npy bytes   (application/octet-stream)
    GET  /v1/config                       the effective config, redacted
    GET  /v1/config/status                ConfigStatusView
    POST /v1/channel/ping?model=&timeout_s=  channel.PingResult  (the guide's ping; ok says how)
    GET  /v1/doctor?ping=&probe=&timeout_s=  DoctorView   (the daemon-side checks; ok: none failed)
    POST /v1/mcp/calls     body: McpCallModel → McpCallView  (one `mcp.call` trace line)
    GET  /v1/openapi.json                 the OpenAPI document
    GET  /metrics                         Prometheus text
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from taogpud import wire
from taogpud.errors import RequestError

__all__ = [
    "ArrayView",
    "ArraysView",
    "ChangeModel",
    "CheckView",
    "ConfigStatusView",
    "DoctorView",
    "HealthView",
    "InfoView",
    "JobRequestModel",
    "LeaseView",
    "LogView",
    "McpCallModel",
    "McpCallView",
    "ProgramExitModel",
    "ProgramRequestModel",
    "ProgramStartedModel",
    "ReloadModel",
    "StatusView",
    "WorkerView",
    "job_request_from",
]


class JobRequestModel(BaseModel):
    """What POST /v1/jobs (and the .shm socket's submit) takes, validated; the core gets
    `to_wire()`, a taogpud.wire.JobRequest. The bounds are the wire's limits."""

    model_config = ConfigDict(title="JobRequest")

    task: str = Field(description="a registered task name, see GET /v1/tasks")
    params: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(
        default_factory=dict, description="input name → array id from POST /v1/arrays"
    )
    device: int | None = Field(default=None, ge=0, description="pin to this device index")
    affinity: str | None = Field(
        default=None,
        max_length=wire.MAX_AFFINITY_CHARS,
        description="jobs of one key stay on one device",
    )
    priority: int = Field(
        default=0, ge=wire.PRIORITY_MIN, le=wire.PRIORITY_MAX, description="higher runs first"
    )
    timeout_s: float | None = Field(default=None, gt=0, le=wire.MAX_JOB_TIMEOUT_S)
    keep_outputs: bool = Field(default=False, description="keep the output arrays for download")
    max_retries: int = Field(
        default=0,
        ge=0,
        le=wire.MAX_RETRIES,
        description="run again after a worker crash or daemon restart",
    )

    def to_wire(self) -> wire.JobRequest:
        return wire.JobRequest(**{name: getattr(self, name) for name in _JOB_REQUEST_FIELDS})


_JOB_REQUEST_FIELDS = wire.JobRequest._fields


def job_request_from(fields: dict[str, Any]) -> wire.JobRequest:
    """A job request from a decoded message (the .shm socket's submit); its first problem
    as a RequestError ("priority: Input should be ..."), as the HTTP route words it."""
    try:
        return JobRequestModel.model_validate(fields).to_wire()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RequestError(
            f"{where}: {first['msg']}", "see GET /v1/openapi.json, JobRequest"
        ) from None


class ProgramRequestModel(BaseModel):
    """What POST /v1/programs takes: a user's own program to run under a lease; the core gets
    `to_wire()`, a taogpud.wire.ProgramRequest."""

    model_config = ConfigDict(title="ProgramRequest", extra="forbid")

    argv: list[str] = Field(min_length=1, max_length=wire.MAX_ARGV_ITEMS)
    cwd: str = Field(min_length=1, description="the directory it runs in (its owner sees it)")
    name: str | None = Field(default=None, max_length=200)
    gpus: int = Field(default=1, ge=1, le=wire.MAX_PROGRAM_GPUS, description="devices at once")
    device: int | None = Field(default=None, ge=0, description="this device index only")
    mem_bytes: int | None = Field(
        default=None, gt=0, description="its memory reservation; none: each device's whole cap"
    )
    share: bool = Field(default=False, description="one slot of a device, not the whole one")
    affinity: str | None = Field(default=None, max_length=wire.MAX_AFFINITY_CHARS)
    priority: int = Field(default=0, ge=wire.PRIORITY_MIN, le=wire.PRIORITY_MAX)
    timeout_s: float | None = Field(default=None, gt=0, le=wire.MAX_JOB_TIMEOUT_S)

    @model_validator(mode="after")
    def _one_device_or_many(self) -> ProgramRequestModel:
        if self.device is not None and self.gpus > 1:
            raise ValueError("device names one device: give either device or gpus > 1")
        return self

    def to_wire(self) -> wire.ProgramRequest:
        return wire.ProgramRequest(**{name: getattr(self, name) for name in _PROGRAM_FIELDS})


_PROGRAM_FIELDS = wire.ProgramRequest._fields


class ProgramStartedModel(BaseModel):
    model_config = ConfigDict(title="ProgramStarted", extra="forbid")

    pid: int = Field(gt=1, description="the program's pid: the caller's own descendant")


class ProgramExitModel(BaseModel):
    """How the program ended, from its starter (its parent)."""

    model_config = ConfigDict(title="ProgramExit", extra="forbid")

    exit_code: int | None = Field(default=None, ge=0, le=255)
    signal: str | None = Field(default=None, max_length=20, pattern=r"^SIG[A-Z0-9+]+$")
    cancelled: bool = Field(default=False, description="its starter stopped it (Ctrl-C)")
    not_started: str | None = Field(default=None, max_length=2000, description="why exec failed")
    pid: int | None = Field(
        default=None,
        gt=1,
        description="the program's pid, when its start was not reported: checked as /started "
        "checks it (the process, a zombie now, is the caller's own descendant)",
    )


class LeaseView(BaseModel):
    """A program's lease as its starter follows it."""

    phase: Literal["queued", "granted", "stopping", "ended"]
    queue_position: int | None = None  # 1: it starts next; None: not queued
    job: dict[str, Any]


class LogView(BaseModel):
    """A piece of a detached program's log (GET /v1/programs/{id}/log)."""

    data_b64: str  # the bytes, base64: a program's output need not be text
    next: int  # the offset to ask from next
    ended: bool  # the job ended and this is the end of its log


class ChangeModel(BaseModel):
    """wire.ChangeView as the API answers it."""

    model_config = ConfigDict(title="ChangeView")

    key: str  # "config.toml: scheduling.max_concurrent_tasks"
    old: Any
    new: Any


class ReloadModel(BaseModel):
    """wire.ReloadView as the API answers it."""

    model_config = ConfigDict(title="ReloadView")

    ok: bool
    at: float | None = None  # unix time the reload finished; None: none since start
    trigger: str | None = None  # "watch" | "SIGHUP" | "api", or requests joined: "watch+SIGHUP"
    generation: int | None = None  # the generation in force after it
    changes: list[ChangeModel] = Field(default_factory=list)
    restarted_workers: bool = False
    errors: list[dict[str, str]] = Field(default_factory=list)
    warnings: list[dict[str, str]] = Field(default_factory=list)

    @classmethod
    def of(cls, view: wire.ReloadView) -> ReloadModel:
        fields = view._asdict()
        fields["changes"] = [change._asdict() for change in view.changes]
        return cls.model_validate(fields)


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
    """The bounds on uploads (taogpud/arrayfiles/store.py), as one caller sees them."""

    budget_bytes: int  # all arrays together
    used_bytes: int
    user_quota_bytes: int  # each user's pending arrays (used by no queued or running job)
    your_pending_bytes: int  # the caller's pending arrays
    reserved_bytes: int  # uploads still in progress (their declared sizes), in the budget
    your_reserved_bytes: int  # the caller's uploads in progress, in their quota
    eviction: str  # the order in which an upload makes room


class DoorView(BaseModel):
    """One listener of the daemon, held to the connection policy (taogpud/doors)."""

    name: str  # "control", "shm", "relay"
    kind: str  # what it speaks: "http" | "shm"
    address: str  # a socket path, or HOST:PORT
    inode: int  # its socket's inode (/proc/PID/fd shows socket:[inode])
    open: int  # connections open now
    refused: int  # connections refused at a cap since the start


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
    doors: list[DoorView] = []  # every listener the daemon opened


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
    last_reload: ReloadModel


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


class McpCallModel(BaseModel):
    """One MCP tool call, as `taogpuctl mcp` tells of it (POST /v1/mcp/calls)."""

    model_config = ConfigDict(title="McpCall", extra="forbid")

    tool: str = Field(pattern=wire.MCP_TOOL_PATTERN, description="the tool's name, e.g. run_task")
    ok: bool = Field(description="false: the call ended in a tool error")
    job_id: str | None = Field(
        default=None, min_length=1, max_length=64, description="the job it ran or named"
    )
    error_code: str | None = Field(
        default=None, pattern=r"^[a-z0-9_]{1,64}$", description="the tool error's code"
    )


class McpCallView(BaseModel):
    event: Literal["mcp.call"] = "mcp.call"
    uid: int | None = Field(description="the caller, from SO_PEERCRED")
    job_id: str | None = Field(description="the job, when it is one the caller may act on")
