"""`taogpuctl mcp`: the MCP server an AI agent starts, driven by the official MCP client SDK
over stdio (`mcp.client.stdio`) against a real daemon through its real socket.

Each test starts `python -m taogpud.cli --socket S mcp` as the agent would (Claude Code,
Codex and OpenClaw all start local tools on stdio), lists or calls its tools, and checks the
structured results against what the daemon itself answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from taogpud.agents.results import (
    MAX_LOG_CHARS,
    MAX_LOG_LINES,
    MAX_OUTPUT_CHARS,
    job_logs,
    output_tail,
)
from taogpud.client import ApiError, Client
from taogpud.testing import RunningDaemon, ctl_command, ctl_env, taogpuctl
from tests.test_access_users import User, as_user, shared_daemon, users, value
from tests.test_access_users import pytestmark as needs_real_users

__all__ = ["shared_daemon", "users"]  # the real users' fixtures, from test_access_users.py

TOOLS = {"gpu_status", "run_task", "run_program", "job", "job_logs", "cancel_job"}

Scenario = Callable[[ClientSession], Awaitable[Any]]


# Its tests run on one worker (--dist loadgroup), so that its shared daemon starts once.
pytestmark = pytest.mark.xdist_group("mcp")


@pytest.fixture
def daemon(module_daemon: RunningDaemon) -> RunningDaemon:
    """One daemon for the module, its trace begun at each test's start: the tests here run
    and read jobs of their own by id and their own trace lines (gpu_status, which reads the
    counts, starts a daemon of its own)."""
    return module_daemon.trace_from_now()


def server_parameters(daemon: RunningDaemon) -> StdioServerParameters:
    """`taogpuctl --socket S mcp` with this checkout's code, as an agent's config starts it."""
    command = ctl_command(daemon.socket_path)
    env = ctl_env({"XDG_STATE_HOME": str(daemon.home / "agent-state")})  # its logs
    return StdioServerParameters(command=command[0], args=[*command[1:], "mcp"], env=env)


def with_session(daemon: RunningDaemon, scenario: Scenario) -> Any:
    """Start the server over stdio, initialise a session, run `scenario` on it, stop."""

    async def main() -> Any:
        async with (
            stdio_client(server_parameters(daemon)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await scenario(session)

    return anyio.run(main)


def call(daemon: RunningDaemon, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    async def scenario(session: ClientSession) -> CallToolResult:
        return await session.call_tool(tool, arguments)

    result = with_session(daemon, scenario)
    assert isinstance(result, CallToolResult)
    return result


def structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, f"a tool error: {result.content}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_the_tools_are_listed_with_their_schemas(daemon: RunningDaemon) -> None:
    """Each tool has a description, an input schema naming its arguments and an output
    schema: what an agent reads before it calls anything."""

    async def scenario(session: ClientSession) -> Any:
        return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in with_session(daemon, scenario)}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
    run_task = tools["run_task"].input_schema
    assert run_task["required"] == ["task"]
    assert {"task", "params", "device", "priority", "timeout_s", "wait_s"} <= set(
        run_task["properties"]
    )
    assert run_task["properties"]["wait_s"]["maximum"] == 600
    assert tools["job"].input_schema["required"] == ["job_id"]
    assert "evidence" in tools["job"].output_schema["properties"]
    assert tools["job_logs"].input_schema["properties"]["lines"]["maximum"] == MAX_LOG_LINES
    assert tools["cancel_job"].input_schema["required"] == ["job_id"]
    assert tools["run_program"].input_schema["required"] == ["argv"]


def test_gpu_status_gives_the_devices_backend_and_caps(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """gpu_status: one entry per device (name, UUID, memory, running, health) matching the
    daemon's own answers, the backend, no fallback, the caps and the task names."""
    daemon = daemon_factory()
    status = structured(call(daemon, "gpu_status", {}))
    with daemon.client() as client:
        devices, tasks = client.devices(), client.tasks()
    assert status["backend"] == "cpu" and status["fallback"] is False
    assert status["caps"]["max_concurrent_tasks"] == 8
    assert status["caps"]["queue_limit"] == 1000
    assert (status["running"], status["queued"]) == (0, 0)
    assert [d["device"] for d in status["devices"]] == ["cpu:0", "cpu:1"]
    for shown, known in zip(status["devices"], devices, strict=True):
        assert shown["name"] == known["name"] and shown["uuid"] is None
        assert shown["memory_cap_bytes"] == known["memory_cap_bytes"] > 0
        assert shown["memory_free_bytes"] is None  # no NVML on a CPU device
        assert (shown["health"], shown["running"], shown["slots"]) == ("warm", 0, 2)
    assert status["tasks"] == [task["name"] for task in tasks]


def test_run_task_runs_the_job_and_returns_where_it_ran(daemon: RunningDaemon) -> None:
    """run_task vector_add waits for the job and answers its record: device, backend,
    fallback, timings and result; the daemon holds the same job as succeeded."""
    run = structured(call(daemon, "run_task", {"task": "vector_add", "params": {"size": 1000}}))
    assert run["status"] == "succeeded" and run["finished"] is True
    assert run["device"] in ("cpu:0", "cpu:1") and run["backend"] == "cpu"
    assert run["fallback"] is False and run["run_ms"] > 0 and run["queue_ms"] >= 0
    assert run["result"]["size"] == 1000 and "kernel_ms" in run["timings"]
    with daemon.client() as client:
        held = client.get(run["id"])
    assert held["status"] == "succeeded" and held["device"] == run["device"]
    assert (
        run["record"]["params"] == held["params"] == {"size": 1000, "dtype": "float32", "seed": 0}
    )


def test_run_task_waits_no_longer_than_its_bound(daemon: RunningDaemon) -> None:
    """wait_s=0 answers at once with the job still queued or running, and says how to follow
    it; the job goes on and finishes."""
    run = structured(
        call(daemon, "run_task", {"task": "sleep", "params": {"ms": 1500}, "wait_s": 0})
    )
    assert run["finished"] is False and run["status"] in ("queued", "running")
    assert run["id"] in run["note"] and "job" in run["note"]
    with daemon.client() as client:
        assert client.wait(run["id"], timeout_s=60)["status"] == "succeeded"


def test_run_program_queues_the_program_and_answers_its_id_at_once(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """run_program answers the job's id before the program ran; the server starts it as the
    user once its lease is granted, its output in the log file it named (never on stdout,
    the JSON-RPC channel), and the job ends succeeded with the program's exit status."""
    (tmp_path / "marker").write_text("here")
    argv = ["sh", "-c", 'echo "hello from $TAOGPUD_JOB_ID in $(cat marker)"; read x; echo "<$x>"']

    async def scenario(session: ClientSession) -> tuple[dict[str, Any], dict[str, Any]]:
        started = structured(
            await session.call_tool("run_program", {"argv": argv, "cwd": str(tmp_path)})
        )
        with daemon.client() as client:  # the session stays open while the program runs
            ended = await anyio.to_thread.run_sync(lambda: client.wait(started["id"], 60))
        logs = structured(await session.call_tool("job_logs", {"job_id": started["id"]}))
        return started, {**ended, "logs": logs}

    started, ended = with_session(daemon, scenario)
    assert started["status"] in ("queued", "running") and started["task"] == "program"
    assert ended["status"] == "succeeded", ended
    assert Path(started["log_path"]).parent == daemon.home / "agent-state/taogpud/programs"
    log = Path(started["log_path"]).read_text()
    assert log == f"hello from {started['id']} in here\n<>\n"  # its stdin: /dev/null
    assert ended["logs"]["output"] == log and ended["logs"]["output_truncated"] is False
    call = daemon.wait_for_event(lambda e: e.get("tool") == "run_program")
    assert call["job_id"] == started["id"] and call["ok"] is True


def test_a_bad_task_name_is_a_tool_error_with_the_daemons_code(daemon: RunningDaemon) -> None:
    """An unknown task comes back as an MCP tool error (isError) carrying the daemon's own
    code, message and hint, both as text and as structured content."""
    result = call(daemon, "run_task", {"task": "vectr_add"})
    assert result.is_error is True
    error = result.structured_content
    assert isinstance(error, dict)
    assert error["code"] == "unknown_task" and error["http_status"] == 404
    assert "vectr_add" in error["message"] and "vector_add" in error["hint"] + error["message"]
    text = result.content[0]
    assert text.type == "text" and "unknown_task" in text.text and error["message"] in text.text


def test_job_shows_the_record_and_its_evidence(daemon: RunningDaemon) -> None:
    """job: the record of a job run before, and its evidence; on the CPU there is none, and
    the note says so rather than leaving an empty list to be read as proof."""
    with daemon.client() as client:
        done = client.run("noop", {})

    async def scenario(session: ClientSession) -> tuple[CallToolResult, CallToolResult]:
        shown = await session.call_tool("job", {"job_id": done["id"][:8]})  # a prefix will do
        unknown = await session.call_tool("job", {"job_id": "f" * 17})
        return shown, unknown

    shown, unknown = with_session(daemon, scenario)
    job = structured(shown)
    assert (job["id"], job["status"], job["device"]) == (done["id"], "succeeded", done["device"])
    assert job["evidence"] == [] and "ran on cpu" in job["evidence_note"]
    assert unknown.is_error and unknown.structured_content["code"] == "job_not_found"


def test_evidence_sits_beside_the_nvidia_smi_query_that_shows_it() -> None:
    """A CUDA job's NVML facts, each paired with the nvidia-smi query `taogpuctl show
    --evidence` prints beside it (the same table), facts without one paired with None."""
    from taogpud.agents.results import evidence_facts
    from taogpud.observability.nvml import NVIDIA_SMI

    record = {
        "backend": "cuda",
        "evidence": {"gpu_uuid": "GPU-1234", "pid_seen_on_gpu": True, "sm_clock_mhz": 1410},
    }
    facts, note = evidence_facts(record)
    assert facts == [
        {"key": "gpu_uuid", "value": "GPU-1234", "nvidia_smi": NVIDIA_SMI["gpu_uuid"]},
        {"key": "pid_seen_on_gpu", "value": True, "nvidia_smi": NVIDIA_SMI["pid_seen_on_gpu"]},
        {"key": "sm_clock_mhz", "value": 1410, "nvidia_smi": None},
    ]
    assert "nvidia-smi" in note


def test_mcp_without_the_sdk_names_the_extra(daemon: RunningDaemon, tmp_path: Any) -> None:
    """With the SDK missing, `taogpuctl mcp` exits 2 with one line naming the extra."""
    blocker = tmp_path / "mcp"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no module named mcp (test)')\n")
    done = taogpuctl("mcp", socket_path=daemon.socket_path, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "taogpud[mcp]" in done.stderr and "Traceback" not in done.stderr


def test_job_logs_answers_the_tail_and_says_what_it_left_out(daemon: RunningDaemon) -> None:
    """job_logs: the job's last trace lines (queued, running, succeeded), at most `lines` of
    them, and whether older ones were left out."""
    with daemon.client() as client:
        done = client.run("noop", {})

    async def scenario(session: ClientSession) -> tuple[CallToolResult, CallToolResult]:
        whole = await session.call_tool("job_logs", {"job_id": done["id"]})
        tail = await session.call_tool("job_logs", {"job_id": done["id"], "lines": 1})
        return whole, tail

    whole, tail = (structured(result) for result in with_session(daemon, scenario))
    events = [line["event"] for line in whole["lines"]]
    assert events == ["job.queued", "job.running", "job.succeeded"] and not whole["truncated"]
    assert [line["event"] for line in tail["lines"]] == ["job.succeeded"]
    assert tail["truncated"] is True and tail["job_id"] == done["id"]


def test_job_logs_keeps_within_its_character_bound() -> None:
    """However long the lines, the answer holds at most MAX_LOG_CHARS of them, the newest
    kept, and says the rest were left out; one line longer than the bound is cut, not sent."""
    events = [{"event": "job.failed", "n": n, "error": "x" * 10_000} for n in range(20)]
    logs = job_logs("j1", events, 20)
    kept = [line["n"] for line in logs.lines]
    assert kept == list(range(20 - len(kept), 20)) and 0 < len(kept) < 20
    assert logs.truncated is True and len(logs.model_dump_json()) < MAX_LOG_CHARS + 2_000
    huge = job_logs("j1", [{"event": "job.failed", "error": "y" * (3 * MAX_LOG_CHARS)}], 5)
    assert huge.truncated is True and len(huge.model_dump_json()) < MAX_LOG_CHARS + 2_000
    assert huge.lines[0]["event"] == "job.failed" and huge.lines[0]["cut_chars"] > MAX_LOG_CHARS


def test_a_programs_output_in_job_logs_is_its_tail(tmp_path: Path) -> None:
    """A program's output far past the bound: job_logs answers its last MAX_OUTPUT_CHARS
    characters, says it cut the rest, and reads no more of the file than that."""
    log = tmp_path / "j.log"
    log.write_bytes(b"x" * 10_000_000 + b"\nthe end\n")
    text, cut = output_tail(log)
    assert cut is True and len(text) == MAX_OUTPUT_CHARS and text.endswith("\nthe end\n")
    assert output_tail(tmp_path / "none.log") == (None, False)


def test_cancel_job_cancels_the_users_own_job(daemon: RunningDaemon) -> None:
    """cancel_job on a job run_task left running: it ends cancelled, as the daemon says too."""

    async def scenario(session: ClientSession) -> dict[str, Any]:
        run = structured(
            await session.call_tool(
                "run_task", {"task": "sleep", "params": {"ms": 60_000}, "wait_s": 0}
            )
        )
        return structured(await session.call_tool("cancel_job", {"job_id": run["id"]}))

    cancelled = with_session(daemon, scenario)
    assert cancelled["status"] == "cancelled" and cancelled["finished"] is True
    with daemon.client() as client:
        assert client.get(cancelled["id"])["status"] == "cancelled"


def test_each_call_is_a_trace_line_with_its_user_tool_and_job(daemon: RunningDaemon) -> None:
    """Every tool call is one `mcp.call` line in the daemon's trace: the caller's uid (from
    SO_PEERCRED), the tool, the job it ran or named, and how it ended."""

    async def scenario(session: ClientSession) -> str:
        await session.call_tool("gpu_status", {})
        run = structured(await session.call_tool("run_task", {"task": "noop"}))
        await session.call_tool("run_task", {"task": "vectr_add"})
        return str(run["id"])

    job_id = with_session(daemon, scenario)
    daemon.wait_for_event(lambda e: e.get("event") == "mcp.call" and e.get("ok") is False)
    calls = daemon.events("mcp.call")
    assert [(c["tool"], c["ok"], c.get("job_id")) for c in calls] == [
        ("gpu_status", True, None),
        ("run_task", True, job_id),
        ("run_task", False, None),
    ]
    assert {c["uid"] for c in calls} == {0} and calls[2]["error_code"] == "unknown_task"
    assert all(c["pid"] > 0 for c in calls)  # the MCP server's own process
    assert "mcp.call tool=run_task ok=true" in daemon.ctl("logs", job_id).stdout
    with daemon.client() as client:
        assert client.mcp_call("job", job_id="f" * 17, ok=False, error_code="job_not_found") == {
            "event": "mcp.call",
            "uid": 0,
            "job_id": None,
        }
    named = daemon.wait_for_event(lambda e: e.get("tool") == "job")
    assert named["named_job_id"] == "f" * 17 and "job_id" not in named  # no job of theirs


def test_the_trace_endpoint_refuses_a_tool_name_it_cannot_log(daemon: RunningDaemon) -> None:
    """POST /v1/mcp/calls takes a tool name of lower-case words only: anything else is a 422
    in the one error shape, naming the field, and writes no line."""
    with daemon.client() as client, pytest.raises(ApiError) as refused:
        client.mcp_call("gpu status\n{", ok=True)
    assert (refused.value.http_status, refused.value.code) == (422, "invalid_request")
    assert "tool" in refused.value.message
    assert daemon.events("mcp.call") == []


# --- another user's job: the daemon's rules, whoever the agent is ----------------------------


def as_agent_of(user: User, socket_path: Path, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """The tools of `taogpuctl mcp` called by `user`: the same server object the command
    serves, in a child that is that user (the interpreter here may not be one the user can
    start, tests/test_access_users.py), reached in-process by the SDK's own client."""
    from mcp import Client as McpClient

    from taogpud.agents.server import build_server

    def action() -> list[dict[str, Any]]:
        async def main() -> list[dict[str, Any]]:
            async with McpClient(build_server(str(socket_path))) as session:
                answers = [await session.call_tool(tool, args) for tool, args in calls]
            return [{"is_error": a.is_error, "content": a.structured_content} for a in answers]

        return anyio.run(main)

    return value(as_user(user, action))


@needs_real_users
def test_another_users_job_is_refused_to_the_agent(
    users: dict[str, User], shared_daemon: Callable[..., Any]
) -> None:
    """carol's agent sees alice's job exists but not what it holds, and may neither cancel it
    nor read its lines: tool errors with the daemon's forbidden; alice's agent cancels it."""
    daemon = shared_daemon()
    sock = daemon.socket_path

    def alice_submits() -> Any:
        with Client(sock, timeout_s=30) as client:
            return client.submit("sleep", {"ms": 60_000})

    job_id = value(as_user(users["alice"], alice_submits))["id"]
    shown, cancel, logs = as_agent_of(
        users["carol"],
        sock,
        [
            ("job", {"job_id": job_id}),
            ("cancel_job", {"job_id": job_id}),
            ("job_logs", {"job_id": job_id}),
        ],
    )
    assert shown["is_error"] is False and shown["content"]["record"]["params"] == {}
    for refused in (cancel, logs):
        assert refused["is_error"] is True
        assert (refused["content"]["code"], refused["content"]["http_status"]) == ("forbidden", 403)
        assert str(users["carol"].uid) in refused["content"]["message"]
        assert refused["content"]["hint"]
    with daemon.client() as client:
        assert client.get(job_id)["status"] in ("queued", "running")  # untouched
    (own,) = as_agent_of(users["alice"], sock, [("cancel_job", {"job_id": job_id})])
    assert own["is_error"] is False and own["content"]["status"] == "cancelled"
    daemon.wait_for_event(lambda e: e.get("uid") == users["alice"].uid and e.get("tool"))
    lines = {(e["uid"], e["tool"]): e for e in daemon.events("mcp.call")}
    assert lines[(users["alice"].uid, "cancel_job")]["job_id"] == job_id
    assert lines[(users["carol"].uid, "cancel_job")]["named_job_id"] == job_id
    assert "job_id" not in lines[(users["carol"].uid, "cancel_job")]


def test_the_missing_sdk_hint_fits_the_install(tmp_path: Path) -> None:
    """A pip install is told the extra; a package's venv (its marker), which never ships the
    SDK, is told to run taogpuctl mcp from a venv of the user's own."""
    from taogpud.host.install_hints import PACKAGE_MARKER, install_hint

    assert "pip install 'taogpud[mcp]'" in install_hint("mcp", tmp_path)
    (tmp_path / PACKAGE_MARKER).write_text("extras=cuda12\n")
    assert "ships without the MCP SDK" in install_hint("mcp", tmp_path)
    assert "venv of your own" in install_hint("mcp", tmp_path)
