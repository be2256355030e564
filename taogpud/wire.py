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
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple
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
    def from_json(cls, parsed: Any) -> ErrorBody | None:
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
