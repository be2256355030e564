"""`taogpuctl mcp`: the daemon's GPU jobs as Model Context Protocol tools, on stdio.

An AI agent (Claude Code, Codex, OpenClaw, …) starts this as a local MCP server and reads
JSON-RPC on its stdout. Every tool reaches the daemon through the Python client over the
user's own socket connection: the daemon knows the caller by SO_PEERCRED, so an agent has
exactly its user's rights and no more (docs/agents.md).

Built on the official SDK (`mcp`, the `mcp` extra), imported only when the command runs, so a
plain install stays small and `taogpuctl status` never loads it. The tools are plain
functions: the SDK derives their input schemas from the signatures and their output schemas
from the return models (agents/results.py), and runs each in a worker thread, where it opens
a Client of its own (a Client is not thread-safe).

A failure the daemon explains comes back as an MCP tool error (isError) whose structured
content is the daemon's own {code, message, hint}, with the HTTP status beside them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, TypeVar, cast

from pydantic import Field

from taogpud import __version__, wire
from taogpud.agents import results
from taogpud.client import ApiError, Client, DaemonUnreachable, NotInGroup
from taogpud.client.ids import resolve_id
from taogpud.client.stream import stream_lines
from taogpud.errors import CliError
from taogpud.observability.trace_ring import RING_LINES

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp_types import CallToolResult

T = TypeVar("T")
log = logging.getLogger("taogpud.agents")  # stderr, under the SDK's logging set-up

MAX_RUN_WAIT_S = 600.0  # run_task's longest wait: an agent's turn should not hang longer
INSTRUCTIONS = (
    "taogpud runs GPU compute jobs for everyone on this host, as your user. gpu_status shows "
    "the devices, the backend (and any CPU fallback) and the caps; run_task runs a built-in "
    "task or a `kernel` job and answers where it ran; run_program queues your own program "
    "and starts it once it has its GPUs; job shows a job and its NVML evidence; job_logs its "
    "trace lines; cancel_job stops one of your jobs."
)
JobId = Annotated[str, Field(min_length=1, max_length=64, description="a job id, or a prefix")]


def serve(socket_path: str | None) -> None:
    """Serve the tools on stdio until the agent closes stdin."""
    build_server(socket_path).run("stdio")


def build_server(socket_path: str | None) -> MCPServer:
    """The MCP server with every tool, talking to the daemon at `socket_path`."""
    server_class = sdk_server()
    server = server_class(
        "taogpud", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING"
    )
    daemon = Daemon(socket_path)
    for tool in tools(daemon):
        server.add_tool(tool, description=(tool.__doc__ or "").strip())
    return server


def sdk_server() -> type[MCPServer]:
    """The SDK's server class; a missing SDK is a usage error naming the extra."""
    try:
        from mcp.server import MCPServer
    except ImportError as exc:
        from taogpud.host.install_hints import install_hint

        raise CliError(f"taogpuctl mcp needs the MCP SDK ({exc})", install_hint("mcp")) from None
    return MCPServer


class Daemon:
    """The daemon as the tools reach it: one Client per call, closed after it."""

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path

    def call(self, tool: str, action: Callable[[Client], T], job_id: str | None = None) -> T:
        """`action` on a fresh client, then the call's `mcp.call` trace line (the job it
        answers, else `job_id`, the one it named). A failure the daemon (or the socket)
        explains becomes the tool's error result: the SDK hands a CallToolResult back as it
        is, whatever the tool's declared result (whose schema holds for the rest)."""
        with Client(self.socket_path) as client:
            try:
                result = action(client)
            except (ApiError, DaemonUnreachable, CliError, OSError) as exc:
                fields = error_fields(exc)
                if not isinstance(exc, DaemonUnreachable | OSError):
                    tell(client, tool, job_id, fields["code"])
                return cast(T, tool_error(fields))
            tell(client, tool, getattr(result, "id", None) or job_id, None)
            return result

    def start_program(self, argv: list[str], request: dict[str, Any]) -> results.ProgramStarted:
        """Queue the program now; a thread of this server waits for its lease, runs it with
        its output in a log file (stdout here is the agent's JSON-RPC) and reports its end."""
        client = Client(self.socket_path)  # the thread's own, for the program's whole life
        try:
            return start_program(client, argv, request)
        except BaseException:
            client.close()
            raise


def start_program(
    client: Client, argv: list[str], request: dict[str, Any]
) -> results.ProgramStarted:
    """Submit through `client`, then follow the program on a thread that closes it."""
    from taogpud.client.program import ProgramRun

    run = ProgramRun(client, argv, **request)
    job = run.submit()
    path = program_log(job["id"])
    output = open_private(path)
    run.output = output
    threading.Thread(target=follow, args=(run, job, output), name=f"program-{job['id']}").start()
    return results.program_started(job, str(path))


def follow(run: Any, job: dict[str, Any], output: BinaryIO) -> None:
    """The program's whole life after its submit; whatever happens, its log and client close."""
    try:
        run.follow(job)
    except (ApiError, DaemonUnreachable) as exc:
        log.warning("program %s: %s", job["id"], exc)
    finally:
        output.close()
        run.client.close()


def programs_dir() -> Path:
    """$XDG_STATE_HOME/taogpud/programs (~/.local/state/…): the user's own, 0700."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    folder = Path(state) / "taogpud" / "programs"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def program_log(job_id: str) -> Path:
    """Where a program that run_program started writes its output."""
    return programs_dir() / f"{job_id}.log"


def open_private(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def tell(client: Client, tool: str, job_id: str | None, error_code: str | None) -> None:
    """The daemon's trace line for this call; a daemon that cannot take it is said on stderr
    (the agent's log of this server), and the call's own answer still goes back."""
    try:
        client.mcp_call(tool, ok=error_code is None, job_id=job_id, error_code=error_code)
    except (ApiError, DaemonUnreachable) as exc:
        log.warning("the daemon did not take the mcp.call line of %s: %s", tool, exc)


def error_fields(exc: ApiError | DaemonUnreachable | CliError | OSError) -> dict[str, Any]:
    """{code, message, hint, http_status}: the daemon's own, or what the client says."""
    if isinstance(exc, ApiError):
        return {
            "code": exc.code,
            "message": exc.message,
            "hint": exc.hint,
            "http_status": exc.http_status,
        }
    if isinstance(exc, DaemonUnreachable):
        code = "not_in_group" if isinstance(exc, NotInGroup) else "daemon_unreachable"
        return {"code": code, "message": exc.message, "hint": exc.hint, "http_status": 0}
    if isinstance(exc, CliError):
        return {
            "code": "invalid_request",
            "message": exc.message,
            "hint": exc.hint,
            "http_status": 0,
        }
    hint = "is taogpud running? `taogpuctl status` says"  # a stream's socket (job_logs)
    return {"code": "daemon_unreachable", "message": str(exc), "hint": hint, "http_status": 0}


def tool_error(fields: dict[str, Any]) -> CallToolResult:
    from mcp_types import CallToolResult, TextContent

    text = f"{fields['code']}: {fields['message']}"
    if fields["hint"]:
        text += f" (hint: {fields['hint']})"
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=fields, is_error=True
    )


def tools(daemon: Daemon) -> list[Callable[..., Any]]:
    """The tool functions, bound to `daemon`; each one's docstring is its description."""

    def gpu_status() -> results.GpuStatus:
        """The GPUs (name, UUID, memory free and cap, jobs running, worker health), the
        backend and whether jobs fall back to the CPU, the queue, the caps and the task
        names run_task takes. Call it first to see what this host can run now."""
        return daemon.call("gpu_status", read_gpu_status)

    def run_task(
        task: Annotated[str, Field(description="a task name from gpu_status, or `kernel`")],
        params: Annotated[
            dict[str, Any] | None,
            Field(description='the task\'s params, e.g. {"size": 1000000} for vector_add'),
        ] = None,
        device: Annotated[
            int | None, Field(ge=0, description="pin to this device index; default: any")
        ] = None,
        priority: Annotated[
            int,
            Field(ge=wire.PRIORITY_MIN, le=wire.PRIORITY_MAX, description="higher runs first"),
        ] = 0,
        timeout_s: Annotated[
            float | None,
            Field(gt=0, le=wire.MAX_JOB_TIMEOUT_S, description="the job's own time limit"),
        ] = None,
        wait_s: Annotated[
            float,
            Field(
                ge=0,
                le=MAX_RUN_WAIT_S,
                description="wait at most this long for it to finish (0: answer at once)",
            ),
        ] = 60.0,
    ) -> results.RunTaskResult:
        """Run a built-in task (vector_add, saxpy, matmul, reduce_sum, fft, sort, probe, noop,
        sleep) or a `kernel` job (CUDA C source) on this host's GPUs through the daemon's
        queue, as your user. Waits up to wait_s and answers the job: where it ran (device,
        backend), whether it fell back to the CPU, its timings and its result; a job not
        finished by then goes on, and `job` shows it later."""

        def run(client: Client) -> results.RunTaskResult:
            job = client.run(
                task, params, device=device, priority=priority, timeout_s=timeout_s, wait_s=wait_s
            )
            return results.run_task_result(job)

        return daemon.call("run_task", run)

    def run_program(
        argv: Annotated[
            list[str],
            Field(
                min_length=1, description='the program and its arguments, e.g. ["python3", "t.py"]'
            ),
        ],
        cwd: Annotated[
            str | None, Field(description="its working directory; default: this server's")
        ] = None,
        gpus: Annotated[
            int, Field(ge=1, le=wire.MAX_PROGRAM_GPUS, description="devices at once, all or none")
        ] = 1,
        device: Annotated[int | None, Field(ge=0, description="this device index only")] = None,
        mem_bytes: Annotated[
            int | None, Field(gt=0, description="its memory reservation; default: whole devices")
        ] = None,
        share: Annotated[bool, Field(description="one slot of a device, not all of it")] = False,
        priority: Annotated[
            int,
            Field(ge=wire.PRIORITY_MIN, le=wire.PRIORITY_MAX, description="higher runs first"),
        ] = 0,
        timeout_s: Annotated[
            float | None, Field(gt=0, le=wire.MAX_JOB_TIMEOUT_S, description="stop it after S s")
        ] = None,
    ) -> results.ProgramStarted:
        """Run your own program (a training script, a benchmark) on this host's GPUs through
        the daemon's queue, as `taogpuctl exec` does: answers its job id at once; once its
        lease is granted this server starts it as your user with CUDA_VISIBLE_DEVICES set to
        its GPUs, its output going to log_path. `job` shows where it ran, its evidence that
        it used the GPU, and how it ended; `cancel_job` stops it."""
        request: dict[str, Any] = {"cwd": cwd, "gpus": gpus, "device": device}
        request |= {"mem_bytes": mem_bytes, "share": share, "priority": priority}
        request["timeout_s"] = timeout_s
        return daemon.call("run_program", lambda _: daemon.start_program(argv, request))

    def job(job_id: JobId) -> results.JobWithEvidence:
        """One job's record: state, device, backend, fallback, timings, result or error, and
        its evidence: each fact NVML saw while it ran (the GPU's UUID, the job's process on
        it, peak utilisation, energy) beside the nvidia-smi query that shows the same."""

        def show(client: Client) -> results.JobWithEvidence:
            return results.job_with_evidence(client.get(full_id(client, job_id)))

        return daemon.call("job", show, job_id)

    def job_logs(
        job_id: JobId,
        lines: Annotated[
            int,
            Field(ge=1, le=results.MAX_LOG_LINES, description="the last N lines at most"),
        ] = 50,
    ) -> results.JobLogs:
        """The tail of one job's trace: a line per state change (queued, running, where it
        ran, how it ended, its error), oldest first, bounded in lines and in size; says when
        older lines were left out. The daemon keeps recent lines in memory only. For a
        program run_program started, also the end of its output."""

        def read(client: Client) -> results.JobLogs:
            full = full_id(client, job_id)
            # all of the job's lines the daemon holds (it reads its whole ring for any limit),
            # so that the tail is the job's own even after many mcp.call lines naming it
            path = wire.JOB_EVENTS.url({"limit": RING_LINES}, job_id=full)
            events = list(stream_lines(client.socket_path, path, client.timeout_s))
            logs = results.job_logs(full, results.job_lines(events), lines)
            logs.output, logs.output_truncated = results.output_tail(program_log(full))
            return logs

        return daemon.call("job_logs", read, job_id)

    def cancel_job(job_id: JobId) -> results.JobSummary:
        """Cancel one of your user's jobs, queued or running; answers it as it ended
        (cancelled, or its end if it finished first). Another user's job is refused."""

        def cancel(client: Client) -> results.JobSummary:
            return results.job_summary(client.cancel(full_id(client, job_id)))

        return daemon.call("cancel_job", cancel, job_id)

    return [gpu_status, run_task, run_program, job, job_logs, cancel_job]


def read_gpu_status(client: Client) -> results.GpuStatus:
    devices = client.devices()
    inventory = None
    if any(device.get("uuid") for device in devices):  # NVML only where there are GPUs
        from taogpud.observability import nvml

        inventory = nvml.inventory(read_process_names=False)
    return results.gpu_status(client.status(), devices, client.tasks(), inventory)


def full_id(client: Client, given: str) -> str:
    """A job id from a prefix, as taogpuctl takes one."""
    return resolve_id(client, given)
