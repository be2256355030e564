"""What the daemon and its clients both speak on the control socket (API v1), stdlib only.

One module both sides import, as pueue's `pueue_lib/message`: the Python client and taogpuctl
read it without pydantic, FastAPI or Starlette (a `taogpuctl status` imports none of them),
and the core (scheduler, reload, the shm server, the doctor) works on these types, never on
the API's. The API validates what arrives with pydantic (taogpud/api/models.py, whose bounds
come from here) and hands the core these immutable records.

The records are NamedTuples, not frozen dataclasses: every `taogpuctl` start defines them, and
a dataclass builds its methods by compiling source at import, which cost ~2 ms a class here
against ~0.3 ms for a NamedTuple (5 classes; bench/cli_start.py measures the start).

    JobState, FINISHED_STATES   a job's states, and which of them are final
    Route and the routes        the paths the app serves and the client calls
    limits                      body sizes, priority and retry bounds, the longest long-poll
    NPY_MAGIC, npy_header       an array's body (POST /v1/arrays): a .npy image, its header
    ErrorBody                   the one error shape: {code, message, hint}
    JobRequest                  a job as submitted (POST /v1/jobs, the .shm socket)
    ChangeView, ReloadView      a reload's report (POST /v1/config/reload, GET /v1/config/status)
    JobJson, StatusJson, …      the answers as the client reads them (typed views, TypedDicts)
"""

# No `from __future__ import annotations` here: NamedTuple and TypedDict compile each string
# annotation as the class is built, which cost ~0.8 ms at every start with the typed views
# below (0.68 ms against 1.42 to build this module, min of 200, issue 36).
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple, Required, TypedDict
from urllib.parse import quote, urlencode

# --- job states ----------------------------------------------------------------------------


class JobState(StrEnum):
    queued = "queued"  # accepted, waiting for a slot
    running = "running"  # sent to a worker
    succeeded = "succeeded"  # the task returned
    failed = "failed"  # the task raised, ran out of memory, or its worker died
    cancelled = "cancelled"  # cancelled by a client, queued or running
    timed_out = "timed_out"  # ran past its timeout_s
    interrupted = "interrupted"  # the daemon stopped before the job could finish

    @property
    def finished(self) -> bool:
        return self not in (JobState.queued, JobState.running)


FINISHED_STATES = frozenset(state.value for state in JobState if state.finished)


# --- routes --------------------------------------------------------------------------------


class Route(NamedTuple):
    """One endpoint: its method and its path as the app declares it (`{name}` segments)."""

    method: str
    path: str

    def url(self, query: Mapping[str, object] | None = None, **segments: str) -> str:
        """The path with each `{name}` filled in, quoted so that an id or a name cannot reach
        another route, and the query (if any) appended."""
        path = self.path
        if segments:
            path = path.format_map({name: quote(v, safe="") for name, v in segments.items()})
        return f"{path}?{urlencode(query)}" if query else path


HEALTH = Route("GET", "/v1/health")
INFO = Route("GET", "/v1/info")
STATUS = Route("GET", "/v1/status")
DEVICES = Route("GET", "/v1/devices")
TASKS = Route("GET", "/v1/tasks")
METRICS = Route("GET", "/metrics")
OPENAPI = Route("GET", "/v1/openapi.json")
UPLOAD_ARRAY = Route("POST", "/v1/arrays")
SUBMIT_JOB = Route("POST", "/v1/jobs")
LIST_JOBS = Route("GET", "/v1/jobs")
GET_JOB = Route("GET", "/v1/jobs/{job_id}")
WAIT_JOB = Route("GET", "/v1/jobs/{job_id}/wait")
CANCEL_JOB = Route("POST", "/v1/jobs/{job_id}/cancel")
JOB_OUTPUT = Route("GET", "/v1/jobs/{job_id}/outputs/{name}")
JOB_EVENTS = Route("GET", "/v1/jobs/{job_id}/events")
TRACE = Route("GET", "/v1/trace")
CONFIG = Route("GET", "/v1/config")
CONFIG_STATUS = Route("GET", "/v1/config/status")
RELOAD_CONFIG = Route("POST", "/v1/config/reload")
CHANNEL_PING = Route("POST", "/v1/channel/ping")
DOCTOR = Route("GET", "/v1/doctor")
RELAY_TOKEN = Route("POST", "/v1/relay/token")
RELAY_REVOKE = Route("DELETE", "/v1/relay/token")
RELAY_STATUS = Route("GET", "/v1/relay/status")
MCP_CALL = Route("POST", "/v1/mcp/calls")  # `taogpuctl mcp` tells of a tool call: its trace line
SUBMIT_PROGRAM = Route("POST", "/v1/programs")
PROGRAM_LEASE = Route("GET", "/v1/programs/{job_id}/lease")
PROGRAM_STARTED = Route("POST", "/v1/programs/{job_id}/started")
PROGRAM_EXITED = Route("POST", "/v1/programs/{job_id}/exited")
PROGRAM_LOG_APPEND = Route("POST", "/v1/programs/{job_id}/log")
PROGRAM_LOG = Route("GET", "/v1/programs/{job_id}/log")

# Every route the app serves itself (api/*.py and relay/routes.py declare theirs from these).
ROUTES = (
    HEALTH, INFO, STATUS, DEVICES, TASKS, METRICS, OPENAPI, UPLOAD_ARRAY,
    SUBMIT_JOB, LIST_JOBS, GET_JOB, WAIT_JOB, CANCEL_JOB, JOB_OUTPUT, JOB_EVENTS, TRACE,
    CONFIG, CONFIG_STATUS, RELOAD_CONFIG, CHANNEL_PING, DOCTOR,
    RELAY_TOKEN, RELAY_REVOKE, RELAY_STATUS, MCP_CALL,
    SUBMIT_PROGRAM, PROGRAM_LEASE, PROGRAM_STARTED, PROGRAM_EXITED,
    PROGRAM_LOG_APPEND, PROGRAM_LOG,
)  # fmt: skip

# The relay (taogpud.relay) answers every path under this prefix on the Unix socket, in
# front of the app: /relay/v1/models → {provider.baseUrl}/v1/models.
RELAY_PREFIX = "/relay"
RELAY_MODELS = Route("GET", RELAY_PREFIX + "/v1/models")


# --- limits --------------------------------------------------------------------------------

MAX_JSON_BODY_BYTES = 1 << 20  # any request body but an array upload's
MAX_WAIT_S = 60.0  # one long-poll (submit's wait_s, a job's wait timeout_s); clients loop
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # higher runs first
MAX_AFFINITY_CHARS = 200
MAX_JOB_TIMEOUT_S = 7 * 86400.0  # a job's own timeout_s
MAX_RETRIES = 10  # a job's max_retries (runs again after a worker crash or a restart)
MAX_LIST_LIMIT = 10_000  # GET /v1/jobs?limit=
MCP_TOOL_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"  # a tool name an mcp.call line holds
MAX_ARGV_ITEMS = 4096  # a program's argv (POST /v1/programs)
MAX_PROGRAM_GPUS = 64

# A program's lease as its starter follows it (GET /v1/programs/{id}/lease?after=PHASE).
LEASE_PHASES = ("queued", "granted", "stopping", "ended")


# --- an array's body: a .npy image -------------------------------------------------------------

NPY_MAGIC = b"\x93NUMPY"


def npy_header(shape: tuple[int, ...], dtype_str: str) -> bytes:
    """A .npy v1 header padded to 64 bytes, as numpy writes it."""
    shape_text = f"({shape[0]},)" if len(shape) == 1 else f"{tuple(shape)}"
    text = f"{{'descr': {dtype_str!r}, 'fortran_order': False, 'shape': {shape_text}, }}"
    pad = 64 - (10 + len(text) + 1) % 64
    body = (text + " " * pad + "\n").encode("latin1")
    return NPY_MAGIC + b"\x01\x00" + len(body).to_bytes(2, "little") + body


# --- the error body --------------------------------------------------------------------------


class ErrorBody(NamedTuple):
    """The one JSON error shape of the API and of job failures: {code, message, hint}."""

    code: str
    message: str
    hint: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "hint": self.hint}

    @classmethod
    def from_json(cls, parsed: Any) -> "ErrorBody | None":
        """The shape read back from a decoded error response, also when a framework wrapped
        it as {"detail": {...}}; None when the body holds no such shape."""
        if isinstance(parsed, dict) and isinstance(parsed.get("detail"), dict):
            parsed = parsed["detail"]
        if not isinstance(parsed, dict) or not isinstance(parsed.get("code"), str):
            return None
        return cls(parsed["code"], str(parsed.get("message") or ""), str(parsed.get("hint") or ""))


# --- requests and reports ----------------------------------------------------------------------


class JobRequest(NamedTuple):
    """A job as submitted, validated at the edge (api/models.py) before the core sees it.
    params and inputs have no default: a NamedTuple's would be one dict shared by all."""

    task: str  # a registered task name, see GET /v1/tasks
    params: dict[str, Any]
    inputs: dict[str, str]  # input name → array id from POST /v1/arrays
    device: int | None = None  # pin to this device index
    affinity: str | None = None  # jobs of one key stay on one device
    priority: int = 0  # higher runs first, PRIORITY_MIN..PRIORITY_MAX
    timeout_s: float | None = None  # at most MAX_JOB_TIMEOUT_S; None: the daemon's default
    keep_outputs: bool = False  # keep the output arrays for download
    max_retries: int = 0  # run again after a worker crash or daemon restart, ≤ MAX_RETRIES


class ProgramRequest(NamedTuple):
    """A user's own program, to run under a lease (POST /v1/programs, docs/programs.md)."""

    argv: list[str]  # what its starter runs; the daemon never does
    cwd: str  # where it runs (shown to its owner only)
    name: str | None = None
    gpus: int = 1  # devices at once, all or none
    device: int | None = None  # this device index only (with gpus 1)
    mem_bytes: int | None = None  # its memory reservation; None: each device's whole cap
    share: bool = False  # one slot of a device, not the whole device
    affinity: str | None = None
    priority: int = 0
    timeout_s: float | None = None


class ChangeView(NamedTuple):
    key: str  # "config.toml: scheduling.max_concurrent_tasks"
    old: Any
    new: Any


class ReloadView(NamedTuple):
    ok: bool
    at: float | None = None  # unix time the reload finished; None: none since start
    trigger: str | None = None  # "watch" | "SIGHUP" | "api", or requests joined: "watch+SIGHUP"
    generation: int | None = None  # the generation in force after it
    changes: tuple[ChangeView, ...] = ()
    restarted_workers: bool = False
    errors: tuple[dict[str, str], ...] = ()  # config.problem.Problem.as_dict()
    warnings: tuple[dict[str, str], ...] = ()


# --- answers, as a client reads them -----------------------------------------------------------
# Typed views of the JSON the API answers: stdlib TypedDicts, plain dicts at run time (the JSON
# is unchanged), so that mypy checks every key the client's callers read. Each names the API's
# model it mirrors; tests/test_wire.py holds their keys equal.


class JobErrorJson(TypedDict):  # taogpud.jobs.records.JobErrorView
    code: str
    message: str
    hint: str


class OutputJson(TypedDict):  # taogpud.jobs.records.OutputView
    name: str
    shape: list[int]
    dtype: str
    nbytes: int
    offset: int | None
    written: str | None  # "in_place" | "copy" | "d2h"


class PeerJson(TypedDict):  # taogpud.jobs.records.Peer
    pid: int | None
    uid: int | None
    gid: int | None


class JobJson(TypedDict):  # taogpud.jobs.records.JobRecord: what GET /v1/jobs/{id} answers
    id: str
    task: str
    params: dict[str, Any]
    inputs: dict[str, str]
    status: str  # a JobState's value
    priority: int
    timeout_s: float | None
    affinity: str | None
    requested_device: int | None
    keep_outputs: bool
    max_retries: int
    attempts: int
    peer: PeerJson
    estimate_bytes: int
    backend: str | None
    device: str | None
    device_index: int | None
    device_uuid: str | None
    compute_capability: str | None
    fallback: bool
    fallback_reason: str | None
    worker_pid: int | None
    node_id: str | None
    node_hostname: str | None
    evidence: dict[str, Any]
    created_at: float
    started_at: float | None
    finished_at: float | None
    queue_ms: float | None
    run_ms: float | None
    timings: dict[str, float]
    result: dict[str, Any] | None
    outputs: list[OutputJson]
    error: JobErrorJson | None
    memory: dict[str, Any] | None
    program: dict[str, Any] | None  # taogpud.jobs.records.ProgramView's fields


class WorkerJson(TypedDict):  # taogpud.api.models.WorkerView
    device: str
    index: int
    pid: int | None
    state: str  # "starting" | "warm" | "dead"
    running: int
    slots: int
    jobs_done: int
    restarts: int
    warmup_ms: float | None
    node: str | None
    problem: str | None


class ArraysJson(TypedDict):  # taogpud.api.models.ArraysView
    budget_bytes: int
    used_bytes: int
    user_quota_bytes: int
    your_pending_bytes: int
    reserved_bytes: int
    your_reserved_bytes: int
    eviction: str


class DoorJson(TypedDict):  # taogpud.api.models.DoorView
    name: str
    kind: str
    address: str
    inode: int
    open: int
    refused: int


class StatusJson(TypedDict):  # taogpud.api.models.StatusView: GET /v1/status
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
    workers: list[WorkerJson]
    executor: str
    executor_problem: str | None
    arrays: ArraysJson | None
    log_write_failures: int
    store_write_failure: str | None
    doors: list[DoorJson]


class DeviceJson(TypedDict, total=False):  # one entry of GET /v1/devices (api/system.py)
    device: Required[str]
    index: Required[int]
    worker_state: Required[str]
    fallback: Required[bool]
    # what a warm worker found (taogpud.backends.base.DeviceInfo.as_dict), and its extras
    backend: str
    name: str
    uuid: str | None
    compute_capability: str | None
    memory_total_bytes: int
    memory_cap_bytes: int
    warmup_ms: float


class ArrayJson(TypedDict):  # taogpud.api.models.ArrayView: POST /v1/arrays
    id: str
    shape: list[int]
    dtype: str
    nbytes: int


class HealthJson(TypedDict):  # taogpud.api.models.HealthView: GET /v1/health
    ok: bool
    state: str  # "starting" | "ready" | "draining"


class LeaseJson(TypedDict):  # taogpud.api.models.LeaseView: GET /v1/programs/{id}/lease
    phase: str  # one of LEASE_PHASES
    queue_position: int | None  # 1: it starts next; None: not queued
    job: JobJson


class LogPiece(TypedDict):  # taogpud.api.models.LogView, its data_b64 decoded by the client
    data: bytes
    next: int
    ended: bool


class ChangeJson(TypedDict):  # ChangeView above, as JSON
    key: str
    old: Any
    new: Any


class ReloadJson(TypedDict):  # ReloadView above (api.models.ReloadModel): POST /v1/config/reload
    ok: bool
    at: float | None
    trigger: str | None
    generation: int | None
    changes: list[ChangeJson]
    restarted_workers: bool
    errors: list[dict[str, str]]
    warnings: list[dict[str, str]]


class ConfigStatusJson(TypedDict):  # taogpud.api.models.ConfigStatusView
    generation: int
    digest: str
    last_reload: ReloadJson


class TaskJson(TypedDict):  # one entry of GET /v1/tasks (taogpud.tasks.base.Task.catalog_entry)
    name: str
    description: str
    params: dict[str, Any]  # the params' JSON schema
    inputs: list[str]
    backends: list[str]


class CheckJson(TypedDict):  # taogpud.api.models.CheckView: one doctor check
    name: str
    status: str  # "pass" | "warn" | "fail" | "skip"
    detail: str
    hint: str


class DoctorJson(TypedDict):  # taogpud.api.models.DoctorView: GET /v1/doctor
    ok: bool
    checks: list[CheckJson]
    daemon: dict[str, Any]  # who answered: version, pid, backend, fallback, key_source, paths, …


class PingJson(TypedDict):  # taogpud.provider.channel.PingResult: POST /v1/channel/ping
    ok: bool
    status: str  # "ok" | "no_key" | "rejected_key" | …
    detail: str
    hint: str
    role: str
    model: str
    answered_model: str | None
    latency_ms: float | None
    elapsed_ms: float
    attempts: int
    http_status: int | None
    url: str
    key_source: str


class RelayUseJson(TypedDict):  # one row of the relay's use (taogpud.relay.usage.UseTable.rows)
    uid: int | None
    model: str
    status: int
    requests: int
    input_tokens: int
    output_tokens: int


class RelayStatusJson(TypedDict):  # GET /v1/relay/status (taogpud/relay/routes.py)
    enabled: bool
    listen: str | None  # the TCP address it listens on now
    configured_listen: str  # as config.toml gives it ("": the Unix socket only)
    unix_prefix: str
    channel: str
    key_source: str
    key_header: str
    limits: dict[str, Any]
    models: dict[str, Any]
    has_token: bool
    token_fingerprint: str | None
    use: list[RelayUseJson]


class RelayTokenJson(TypedDict):  # POST /v1/relay/token: the caller's new token
    uid: int
    token: str
    listen: str | None


class RelayRevokedJson(TypedDict):  # DELETE /v1/relay/token
    uid: int
    revoked: bool
