"""Every exception of taogpud, drawn once, and the one place that maps them to API error codes
(the daemon's answers) and back (what the client makes of an answer).

What the daemon answers with (its `code` and HTTP status are the API's, docs/api.md):

    TaogpudError                   code                   HTTP  meaning
    ├── ConfigError                config_invalid          400  a config file or key is wrong
    ├── BackendUnavailable         backend_unavailable     503  the backend cannot start
    │   └── HostCannotRun          backend_unavailable     503  nor ever will here (no driver/CuPy)
    ├── ArrayStoreFull             array_store_full        507  no room for another array
    ├── ArrayTooLarge              array_too_large         413  an array past the quota or budget
    ├── StateDiskFull              state_disk_full         507  the job store cannot be written
    ├── RegionError                bad_region              400  a client's memory is not as vetted
    ├── RequestError               invalid_request         400  a request is malformed
    │   ├── UnknownTask            unknown_task            404  no task of that name is registered
    │   ├── InvalidParams          invalid_params          422  params do not match the task's model
    │   │   └── KernelCompileError kernel_compile_failed   422  a kernel's source does not compile
    │   ├── MissingInput           missing_input           404  an input array id is not known
    │   ├── TaskDisabled           task_disabled           403  the config turns this task off
    │   ├── UnsupportedTask        unsupported_task        422  no body for this backend
    │   ├── UnsupportedExecutor    unsupported_executor    422  programs run locally only
    │   ├── NotMemfd               not_memfd               400  the descriptor is no memfd
    │   ├── NotSealed              not_sealed              400  the memfd lacks the seals it needs
    │   ├── RegionOutside          region_outside_memory   400  a region passes the memory's end
    │   ├── RegionMismatch         region_mismatch         400  a region's shape or dtype is wrong
    │   ├── RegionNotAllocated     region_not_allocated    400  a region past the bytes allocated
    │   ├── MemoryQuota            memory_quota_exceeded   507  the uid holds its quota of memory
    │   └── TooManyInFlight        too_many_in_flight      429  a connection's jobs at their cap
    ├── JobNotFound                job_not_found           404  no job with that id
    ├── OutputNotFound             output_not_found        404  the job kept no output of that name
    ├── NotPermitted               forbidden               403  the caller may not touch this job
    ├── Conflict                   conflict                409  not in this state (started twice)
    │   └── LeaseRevoked           lease_revoked           409  a start told after its lease ended
    ├── Rejected                   too_large               413  the job can never fit a device
    ├── BodyTooLarge               body_too_large          413  a request body passed its limit
    ├── QueueFull                  queue_full              429  the bounded queue is full; retry
    ├── Draining                   draining                503  the daemon is stopping; no new jobs
    └── BadSummary                 bad_summary             500  a task's summary is not plain JSON

Inside the daemon, never answered as they are (each caught where its meaning is known):

    JobCancelled                   a task body's job was cancelled or timed out (tasks re-export it)
    BadArray (ValueError)          an uploaded body is not a .npy image this daemon can use
    DeviceMemoryCapExceeded        an OpenCL allocation past the device's cap (a MemoryError:
      (MemoryError)                the job fails `out_of_device_memory`)
    StateDirLocked                 another live process holds the state directory
    StateDirNotOurs                the state directory belongs to another user
    Refused                        a parser callback's: the connection's request is refused (400)

The relay's, each answered in the one error shape (relay/forward.py):

    RelayError                     an answer the relay gives itself: status, error body, Retry-After
    UpstreamFailed                 no response head from the provider: the status and code to answer
    NoWebSocket                    the provider gave no WebSocket: the status and code to answer
    ClientGone                     the client hung up before its request's body was whole

What the client raises (taogpud.client re-exports them; the functions at the end of this
module turn a failed exchange into one of them, so the client maps no code itself):

    DaemonUnreachable              the socket is missing, refused, not ours, hung up or silent
    └── NotInGroup                 the socket belongs to a group this user is not in (taogpu)
    ApiError                       the daemon answered an error: any code drawn above, a job's
                                   failure, `bad_response`, or `http_<status>` outside the shape
    MalformedResponse              a transport's: an answer that is not HTTP (→ ApiError)

What taogpuctl raises (the MCP server, which speaks for it, too): one line, a hint, and
taogpuctl's exit code (the EXIT_ constants here; taogpud.cli's docstring has their table):

    CliError                       a failure explained in one line, its exit code (default 2)
    └── AmbiguousId                a job id prefix more than one job's id starts with (exit 2)
    NotHot                         cli/hot.py's: the argv is not the hot path's, typer reads it

The harness's (taogpud.testing re-exports it), an AssertionError so a test reads it as one:

    HarnessError (AssertionError)  a daemon did not start, stop or say what was waited for in time

Job failures are not exceptions of the daemon: they are `JobErrorView` values
recorded on the job (`out_of_device_memory`, `task_failed`, `worker_crashed`,
`timed_out`, `cancelled`, `interrupted`; a program's `program_failed`, `program_not_started`,
`client_gone`).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taogpud.i18n import Text, _, render

# The one error shape is the wire's (clients read it too); the `as` re-exports it from here.
from taogpud.wire import ErrorBody as ErrorBody  # noqa: PLC0414

if TYPE_CHECKING:  # a config finding; errors.py stays light enough for the client to import
    from taogpud.config.problem import Problem


class TaogpudError(Exception):
    code = "internal_error"
    http_status = 500

    def __init__(self, message: str | Text, hint: str | Text = "") -> None:
        super().__init__(str(message))
        self.message = str(message)  # English: logs, traces and the default answer
        self.hint = str(hint)
        self._texts = (message, hint)  # for a person: `body(language)` translates a Text

    def body(self, language: str | None = None) -> ErrorBody:
        """The one error shape, its message and hint in `language` (None: English)."""
        message, hint = self._texts
        return ErrorBody(self.code, render(message, language), render(hint, language))


class ConfigError(TaogpudError):
    """Raised with every error found in a pair of files, not only the first."""

    code = "config_invalid"
    http_status = 400

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        first = str(problems[0]) if problems else "invalid configuration"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(
            first + more, hint=Text("run `taogpuctl config validate` to see every problem")
        )

    def render(self, language: str | None) -> str:
        """Every problem, one after another, in `language` (None: English): a start refused
        names them all, so that one edit can fix them all."""
        if not self.problems:
            return self.message
        return "; ".join(problem.line(language) for problem in self.problems)


class BackendUnavailable(TaogpudError):
    code = "backend_unavailable"
    http_status = 503


class HostCannotRun(BackendUnavailable):
    """The backend can never start on this host as installed (no NVIDIA driver, or no CuPy
    in this build) and the CPU fallback is refused: a start exits for good, never retried."""


class StateDiskFull(TaogpudError):
    """A commit of the job store failed (ENOSPC, EIO): new jobs are refused, none is lost."""

    code = "state_disk_full"
    http_status = 507


class RequestError(TaogpudError):
    code = "invalid_request"
    http_status = 400


class UnknownTask(RequestError):
    code = "unknown_task"
    http_status = 404


class InvalidParams(RequestError):
    code = "invalid_params"
    http_status = 422


class MissingInput(RequestError):
    code = "missing_input"
    http_status = 404


class TaskDisabled(RequestError):
    code = "task_disabled"
    http_status = 403


class UnsupportedTask(RequestError):
    code = "unsupported_task"
    http_status = 422


class JobNotFound(TaogpudError):
    code = "job_not_found"
    http_status = 404


class OutputNotFound(TaogpudError):
    code = "output_not_found"
    http_status = 404


class UnsupportedExecutor(RequestError):
    code = "unsupported_executor"
    http_status = 422


class Conflict(TaogpudError):
    code = "conflict"
    http_status = 409


class LeaseRevoked(Conflict):
    """A program's start reported after its lease ended unstarted (a cancel, a timeout): its
    starter must kill what it started (taogpud.client.program does)."""

    code = "lease_revoked"


class NotPermitted(TaogpudError):
    code = "forbidden"
    http_status = 403


class Rejected(TaogpudError):
    code = "too_large"
    http_status = 413


class BodyTooLarge(TaogpudError):
    code = "body_too_large"
    http_status = 413


class QueueFull(TaogpudError):
    code = "queue_full"
    http_status = 429


class Draining(TaogpudError):
    code = "draining"
    http_status = 503


class BadSummary(TaogpudError):
    """A task's summary that is not plain JSON: the job fails, the store never sees it."""

    code = "bad_summary"


class KernelCompileError(InvalidParams):
    """The source does not compile for the arch (the NVRTC log says why)."""

    code = "kernel_compile_failed"


class ArrayStoreFull(TaogpudError):
    code = "array_store_full"
    http_status = 507


class ArrayTooLarge(TaogpudError):
    """An upload bigger than a user's whole quota or the whole budget: it never fits, however
    long it waits, so it is the request's fault (413), not a lack of room now (507)."""

    code = "array_too_large"
    http_status = 413


class RegionError(TaogpudError):
    """The client's memory is not what the daemon vetted, or the outputs do not fit."""

    code = "bad_region"
    http_status = 400


# --- the shared-memory socket's refusals (memfd/server.py) ------------------------------------


class NotMemfd(RequestError):
    code = "not_memfd"


class NotSealed(RequestError):
    code = "not_sealed"


class RegionOutside(RequestError):
    code = "region_outside_memory"


class RegionMismatch(RequestError):
    code = "region_mismatch"


class RegionNotAllocated(RequestError):
    code = "region_not_allocated"


class MemoryQuota(RequestError):
    code = "memory_quota_exceeded"
    http_status = 507


class TooManyInFlight(RequestError):
    code = "too_many_in_flight"
    http_status = 429


# --- inside the daemon: caught where their meaning is known, never answered as they are -------


class JobCancelled(Exception):
    """Raised inside a task body when its job was cancelled or timed out."""


class BadArray(ValueError):
    """An uploaded body is not a .npy image this daemon can use."""


class DeviceMemoryCapExceeded(MemoryError):
    """An allocation would pass the device's cap (memoryFraction × global memory)."""


class StateDirLocked(Exception):
    """Another live process holds the state directory."""


class StateDirNotOurs(Exception):
    """The state directory, or a file in it, belongs to another user (say, one root left)."""


class Refused(Exception):
    """Raised from a parser callback: the parser stops, and uvicorn asks for its 400."""


# --- the relay's: each answered in the one error shape by relay/forward.py ---------------------


class RelayError(Exception):
    """An answer the relay gives itself: its HTTP status, the error body, any Retry-After."""

    def __init__(self, status: int, body: ErrorBody, retry_after_s: int | None = None) -> None:
        super().__init__(body.message)
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s


class UpstreamFailed(Exception):
    """No response head from the provider: status and code for the client's error answer."""

    def __init__(self, status: int, code: str, message: str, hint: str, attempts: int) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.hint = hint
        self.attempts = attempts


class NoWebSocket(Exception):
    """The provider gave no WebSocket: status, code and words for the client's HTTP answer."""

    def __init__(self, status: int, code: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.hint = hint


class ClientGone(Exception):
    """The client hung up before its request's body was whole."""


# --- the client's (taogpud.client re-exports them): what a failed exchange becomes ------------


class DaemonUnreachable(Exception):
    """The daemon's socket cannot be used; says which socket and what to do about it."""

    def __init__(self, socket_path: str, message: str, hint: str) -> None:
        super().__init__(f"{message} (hint: {hint})")
        self.socket_path = socket_path
        self.message = message
        self.hint = hint


class NotInGroup(DaemonUnreachable):
    """The socket is open to its group only, and this user is not (yet) in that group."""


class ApiError(Exception):
    """The daemon answered with an error: its {code, message, hint} and the HTTP status."""

    def __init__(self, code: str, message: str, hint: str = "", http_status: int = 0) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.hint = hint
        self.http_status = http_status


class MalformedResponse(Exception):
    """The socket answered something that is not an HTTP/1.1 response (a transport's)."""


def api_error(http_status: int, body: bytes) -> ApiError:
    """An ApiError from an error response, whatever its body holds."""
    fields = _error_fields(body)
    if fields is not None:
        code, message, hint = fields
        return ApiError(code, message, hint, http_status)
    return ApiError(
        f"http_{http_status}",
        f"HTTP {http_status}: {_snippet(body) or 'empty body'}",
        "the daemon answered outside its {code, message, hint} shape; see `journalctl -u taogpud`",
        http_status,
    )


def _error_fields(body: bytes) -> tuple[str, str, str] | None:
    """{code, message, hint} (wire.ErrorBody), or a framework's validation list as one."""
    try:
        parsed = json.loads(body)  # an error: the standard library's json is quick enough
    except ValueError:
        return None
    error = ErrorBody.from_json(parsed)
    if error is not None:
        return error.code, error.message, error.hint
    if isinstance(parsed, dict) and isinstance(parsed.get("detail"), list):
        return "invalid_request", _describe_validation(parsed["detail"]), ""
    return None


def _describe_validation(details: list[Any]) -> str:
    """A framework's validation list [{loc, msg}, ...] as one line."""
    parts = []
    for detail in details:
        if isinstance(detail, dict):
            where = ".".join(str(part) for part in detail.get("loc", ()))
            parts.append(f"{where}: {detail.get('msg', '')}")
    return "; ".join(parts) or "the request is invalid"


def _snippet(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


def malformed_response(socket_path: str, exc: MalformedResponse) -> ApiError:
    return ApiError(
        "bad_response",
        f"{socket_path} answered something that is not HTTP/1.1 ({exc})",
        "is that socket really taogpud's? check --socket / TAOGPUD_SOCKET",
    )


def unreachable(
    socket_path: str, exc: OSError, timeout_s: float, tried: list[str] | None = None
) -> DaemonUnreachable:
    """Which socket (and which others were looked at), what went wrong, what to do."""
    start = _("is taogpud running? `sudo systemctl start taogpud` (or run `taogpud` yourself)")
    if isinstance(exc, PermissionError):
        denied = _not_in_group(socket_path)
        if denied is not None:
            return denied
    if isinstance(exc, FileNotFoundError):
        message, hint = _("no daemon socket at {socket}"), start
    elif isinstance(exc, ConnectionRefusedError):
        message = _("nothing is listening on {socket}")
        hint = _("{start}; `journalctl -u taogpud` says why it stopped").format(start=start)
    elif isinstance(exc, PermissionError):
        message = _("permission denied on {socket}")
        hint = _("are you in group taogpu? `sudo usermod -aG taogpu $USER`, then log in again")
    elif isinstance(exc, TimeoutError):
        message = _("the daemon at {socket} did not answer within {seconds} s")
        hint = _("is it stuck or overloaded? `systemctl status taogpud`, `journalctl -u taogpud`")
    elif isinstance(exc, ConnectionError):
        message = _("the daemon at {socket} closed the connection")
        hint = _("it may have stopped or restarted: `systemctl status taogpud`")
    else:
        message = _("cannot use {socket}: {reason}")
        hint = _("check the socket path (--socket or TAOGPUD_SOCKET)")
    said = message.format(socket=socket_path, seconds=f"{timeout_s:g}", reason=exc.strerror or exc)
    if tried and len(tried) > 1:
        said += _(" (looked at {sockets})").format(sockets=_(", then ").join(tried))
    return DaemonUnreachable(socket_path, said, hint)


def _not_in_group(socket_path: str) -> NotInGroup | None:
    """A socket open to its group (0660), refused to a user outside that group: what to do.
    None when the refusal has another cause (its mode, a directory on the way)."""
    try:
        info = Path(socket_path).stat()
    except OSError:
        return None
    if os.geteuid() == info.st_uid or info.st_gid in (os.getegid(), *os.getgroups()):
        return None
    try:
        group = grp.getgrgid(info.st_gid)
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None
    name = group.gr_name
    where = _("only members of group {group} may use {socket}").format(
        group=name, socket=socket_path
    )
    if user in group.gr_mem:  # added already; this session's groups predate it
        message = _("you were added to group {group} after this session began").format(group=name)
        return NotInGroup(
            socket_path, message, _("log in again (or `newgrp {group}`)").format(group=name)
        )
    message = _("you are not in group {group}: `sudo usermod -aG {group} $USER`, then log in again")
    return NotInGroup(socket_path, message.format(group=name), where)


def not_json(http_status: int, body: bytes) -> ApiError:
    """A success answer whose body the client cannot decode."""
    return ApiError(
        "bad_response",
        f"the daemon answered HTTP {http_status} with a body that is not JSON: {_snippet(body)}",
        "is that socket really taogpud's? check --socket / TAOGPUD_SOCKET",
        http_status,
    )


def wrong_json(path: str, value: object, expected: type) -> ApiError:
    """An answer of another JSON type than the route's (a daemon of another version)."""
    return ApiError(
        "bad_response",
        f"{path} answered a JSON {type(value).__name__}, expected a {expected.__name__}",
        "is the daemon the same version as this client? `taogpuctl status`",
    )


def stream_error(http_status: int, parsed: object, body: bytes) -> ApiError:
    """A followed stream's refusal (client/stream.py): its error body, parsed, or its bytes."""
    error = ErrorBody.from_json(parsed)
    if error is None:
        return ApiError("http_error", f"HTTP {http_status}: {body[:200]!r}", "", http_status)
    return ApiError(error.code, error.message, error.hint, http_status)


def job_failed(job: Mapping[str, Any]) -> ApiError:
    """A job that did not succeed, as its record tells (memfd/client.py waits on one)."""
    error = job.get("error") or {}
    code = str(error.get("code") or job.get("status") or "failed")
    return ApiError(
        code,
        error.get("message", f"job {job.get('id')} {job.get('status')}"),
        error.get("hint", ""),
    )


def refusal(error: Mapping[str, Any]) -> ApiError:
    """The `.shm` socket's error message, {code, message, hint?} (memfd/protocol.py)."""
    return ApiError(error["code"], error["message"], error.get("hint", ""))


# --- taogpuctl's: one line, a hint, its exit code (taogpud.cli's docstring has the table) ------

EXIT_OK = 0
EXIT_FAILED = 1  # the job or check failed
EXIT_USAGE = 2  # usage or config error
EXIT_UNREACHABLE = 3  # the daemon cannot be reached
EXIT_NOT_IN_GROUP = 4  # the socket is its group's (taogpu), and this user is not in it
EXIT_STILL_RUNNING = 124  # a wait's --timeout passed before the job finished (as timeout(1))
EXIT_INTERRUPTED = 130  # Ctrl-C, as typer answers it

AMBIGUOUS_SHOWN = 10  # the candidates an ambiguous job id prefix names


class CliError(Exception):
    """A failure this command explains in one line, with its exit code."""

    def __init__(self, message: str, hint: str = "", exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code


class AmbiguousId(CliError):
    """A prefix that more than one job id starts with: a usage error, as an unknown id is."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:AMBIGUOUS_SHOWN])
        more = len(candidates) - AMBIGUOUS_SHOWN
        tail = f" and {more} more" if more > 0 else ""
        super().__init__(
            f"job id prefix {prefix} is ambiguous: {shown}{tail}", "give more of the id"
        )


class NotHot(Exception):
    """argv is not the hot path's shape (cli/hot.py): typer reads it."""


# --- the test harness's (taogpud.testing re-exports it) ----------------------------------------


class HarnessError(AssertionError):
    """A daemon did not start, stop or say what was waited for in time."""
