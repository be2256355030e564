"""The exception tree, drawn once, and the one place that maps it to API error codes.

What the daemon answers with (its `code` and HTTP status are the API's, docs/api.md):

    TaogpudError                   code                   HTTP  meaning
    ├── ConfigError                config_invalid          400  a config file or key is wrong
    ├── BackendUnavailable         backend_unavailable     503  the backend cannot start
    │   └── HostCannotRun          backend_unavailable     503  nor ever will here (no driver/CuPy)
    ├── ArrayStoreFull             array_store_full        507  no room for another array
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

Job failures are not exceptions of the daemon: they are `JobErrorView` values
recorded on the job (`out_of_device_memory`, `task_failed`, `worker_crashed`,
`timed_out`, `cancelled`, `interrupted`; a program's `program_failed`, `program_not_started`,
`client_gone`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from taogpud.i18n import Text, render

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
