"""Claude Code itself uses taogpud's GPU tools (issue 39): set up by nothing but what
`taogpuctl relay env --tool claude-code` printed (its exports, and its `claude mcp add` line
run as printed), `claude -p` talks to taogpud/testing/fake_provider.py through the relay;
the provider is scripted to ask for `gpu_status`, then `run_task vector_add`. The calls reach
the daemon as this user, the job runs, and the tool results reach the provider.

Skipped, saying why, where Claude Code is not installed (.ci/run installs it, as for
tests/test_real_tools.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import start_relay
from test_mcp_registration import taogpuctl_on_path
from test_real_tools import CLAUDE_CODE_VERSION, TURN_TIMEOUT_S, clean_env, tool_binary

from taogpud.testing import RunningDaemon
from taogpud.testing.fake_provider import (
    FakeProvider,
    Reply,
    Seen,
    anthropic_message,
)

pytestmark = pytest.mark.slow

GPU_STATUS, RUN_TASK = "mcp__taogpud__gpu_status", "mcp__taogpud__run_task"


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def tool_use_stream(model: str, tool: str, arguments: dict[str, Any]) -> tuple[bytes, ...]:
    """A Messages stream whose one block asks for `tool` with `arguments`."""
    message = {
        "id": "msg_t", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 1},
    }  # fmt: skip
    block = {"type": "tool_use", "id": f"toolu_{tool[-8:]}", "name": tool, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
    return (
        sse("message_start", {"message": message}),
        sse("content_block_start", {"index": 0, "content_block": block}),
        sse("content_block_delta", {"index": 0, "delta": delta}),
        sse("content_block_stop", {"index": 0}),
        sse("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        sse("message_stop", {}),
    )


def text_stream(model: str, text: str) -> tuple[bytes, ...]:
    message = {
        "id": "msg_e", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 1},
    }  # fmt: skip
    delta = {"type": "text_delta", "text": text}
    return (
        sse("message_start", {"message": message}),
        sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        sse("content_block_delta", {"index": 0, "delta": delta}),
        sse("content_block_stop", {"index": 0}),
        sse("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        sse("message_stop", {}),
    )


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool_result block the agent has sent back so far."""
    return [
        block
        for message in body.get("messages") or []
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def scripted(seen: Seen) -> Reply:
    """gpu_status first, then run_task vector_add, then the end of the turn."""
    body: dict[str, Any] = seen.body if isinstance(seen.body, dict) else {}
    path, model = seen.path.split("?")[0], str(body.get("model", "m"))
    if path.endswith("/v1/messages/count_tokens"):
        return Reply(body={"input_tokens": 42})
    if not path.endswith("/v1/messages"):
        return Reply(body={"data": [], "has_more": False})
    if not body.get("stream"):
        return Reply(body=anthropic_message(model))
    return Reply(events=next_turn(body, model))


def next_turn(body: dict[str, Any], model: str) -> tuple[bytes, ...]:
    offered = {tool.get("name") for tool in body.get("tools") or []}
    if GPU_STATUS not in offered:  # a side request (a title, a summary): no tools
        return text_stream(model, "ok")
    done = len(tool_results(body))
    if done == 0:
        return tool_use_stream(model, GPU_STATUS, {})
    if done == 1:
        return tool_use_stream(model, RUN_TASK, {"task": "vector_add", "params": {"size": 1000}})
    return text_stream(model, "the job ran")


def test_claude_code_runs_a_task_through_the_mcp_tools(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider, tmp_path: Path
) -> None:
    """claude -p, set up by relay env's lines alone: gpu_status and run_task reach the
    daemon as this user (mcp.call lines), vector_add runs, and both results reach the model."""
    claude = tool_binary("claude", CLAUDE_CODE_VERSION)
    daemon = start_relay(daemon_factory, provider.base_url)
    provider.respond = scripted
    home = tmp_path / "home"
    home.mkdir()
    with_ctl = taogpuctl_on_path(tmp_path / "bin")
    env = clean_env(home, {"CLAUDE_CONFIG_DIR": str(home / ".claude"), "PATH": with_ctl["PATH"]})
    # claude -p may send its first request before a registered server has connected: here
    # 3 runs in 11 went out without the tools; with these two, 12 in 12 waited for it.
    env |= {"MCP_CONNECTION_NONBLOCKING": "false", "MCP_TIMEOUT": "30000"}
    out = daemon.ctl("relay", "env", "--tool", "claude-code", env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for line in lines:
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
    register = next(line for line in lines if line.startswith("# claude mcp add"))
    added = subprocess.run(
        register.removeprefix("# ").replace("claude", str(claude), 1),
        shell=True, cwd=home, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    prompt = ["-p", "Check the GPUs, then run vector_add."]
    done = subprocess.run(
        [str(claude), *prompt, "--allowedTools", "mcp__taogpud"],
        cwd=home, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    offered = [
        sorted(t.get("name") for t in s.body.get("tools") or [] if "mcp" in t.get("name", ""))
        for s in provider.seen
        if isinstance(s.body, dict)
    ]  # the MCP tools each request offered: what to look at when the next line fails
    assert "the job ran" in done.stdout, offered
    calls = daemon.events("mcp.call")
    assert [(call["tool"], call["ok"]) for call in calls] == [
        ("gpu_status", True),
        ("run_task", True),
    ]
    job_id = calls[1]["job_id"]
    with daemon.client() as client:
        job = client.get(job_id)
    assert job["status"] == "succeeded" and job["task"] == "vector_add"
    assert calls[1]["uid"] == job["peer"]["uid"]  # the agent's user, as SO_PEERCRED said
    last = [s.body for s in provider.seen if isinstance(s.body, dict) and tool_results(s.body)]
    status_result, run_result = (json.dumps(block) for block in tool_results(last[-1]))
    assert "max_concurrent_tasks" in status_result and "cpu:0" in status_result
    assert job_id in run_result and "succeeded" in run_result and job["device"] in run_result
