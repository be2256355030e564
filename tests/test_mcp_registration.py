"""`taogpuctl relay env --tool X` also registers `taogpuctl mcp` with that tool (issue 39), in
the form the tool reads: Claude Code's `claude mcp add` line, Codex's `[mcp_servers.NAME]`
table, OpenClaw's `mcp.servers.NAME` entry; `--write` merges the file forms with the relay's
provider, keeping a backup.

Each form was checked against the tool's own source: Codex's `codex mcp add` writes exactly
this table (openai/codex, codex-rs/cli/src/mcp_cmd.rs), OpenClaw documents this entry
(openclaw/openclaw, docs/cli/mcp.md), Claude Code's changelog names `claude mcp add` and
`.mcp.json`'s `mcpServers`. Where the real tool is installed (the relay issue's tier installs
them), the tests register with it as printed and ask it to connect.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from test_real_tools import CLAUDE_CODE_VERSION, CODEX_VERSION, tool_binary

from taogpud.agents.registration import SERVER_NAME, claude_code_lines, server_entry
from taogpud.testing import RunningDaemon, ctl_env

# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("mcp_registration")


@pytest.fixture
def relayd(shared_relayd: RunningDaemon) -> RunningDaemon:
    """One relay for the tests here: each writes and reads files of its own under tmp_path."""
    return shared_relayd


def env_for(home: Path) -> dict[str, str]:
    """A user whose config files (relay token, Codex's, OpenClaw's) all live under `home`."""
    return {
        "XDG_CONFIG_HOME": str(home / "config"),
        "HOME": str(home),
        "CODEX_HOME": str(home / "codex"),
    }


def relay_env(daemon: RunningDaemon, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = daemon.ctl("relay", "env", *args, env=env_for(home), timeout_s=60)
    assert done.returncode == 0, done.stderr
    return done


def expected_entry(daemon: RunningDaemon) -> dict[str, Any]:
    return {"command": "taogpuctl", "args": ["--socket", str(daemon.socket_path), "mcp"]}


def test_the_server_entry_names_the_socket_only_when_one_was_chosen() -> None:
    """Without --socket the agent's taogpuctl finds the daemon as every command does."""
    assert server_entry(None) == {"command": "taogpuctl", "args": ["mcp"]}
    assert server_entry("/run/x.sock") == {
        "command": "taogpuctl",
        "args": ["--socket", "/run/x.sock", "mcp"],
    }
    lines = claude_code_lines("/run/my sock")
    assert all(line.startswith("#") for line in lines)  # eval "$(relay env …)" runs none
    assert "# claude mcp add taogpud -- taogpuctl --socket '/run/my sock' mcp" in lines


@pytest.mark.slow
def test_claude_code_gets_its_mcp_add_line(relayd: RunningDaemon, tmp_path: Path) -> None:
    """`relay env --tool claude-code`: the exports, then the one line that registers the MCP
    server, commented so that `eval` leaves it alone; its .mcp.json form beside it."""
    out = relay_env(relayd, tmp_path, "--tool", "claude-code").stdout
    socket = str(relayd.socket_path)
    assert out.startswith("export ANTHROPIC_BASE_URL=")
    assert f"# claude mcp add {SERVER_NAME} -- taogpuctl --socket {socket} mcp" in out
    json_form = "\n".join(
        line.removeprefix("# ") for line in out.splitlines() if line.startswith("#   ")
    )
    assert json.loads(json_form) == {"mcpServers": {SERVER_NAME: expected_entry(relayd)}}


@pytest.mark.slow
def test_codex_gets_its_mcp_servers_table_and_write_merges_it(
    relayd: RunningDaemon, tmp_path: Path
) -> None:
    """`relay env --tool codex` prints [mcp_servers.taogpud] beside the provider; --write
    merges both into $CODEX_HOME/config.toml, keeping the user's own servers and a backup."""
    printed = relay_env(relayd, tmp_path, "--tool", "codex").stdout
    config = tomllib.loads(printed.partition("# and in the shell")[0])
    assert config["mcp_servers"][SERVER_NAME] == expected_entry(relayd)
    assert config["model_providers"][config["model_provider"]]["wire_api"] == "responses"
    codex_file = tmp_path / "codex" / "config.toml"
    codex_file.parent.mkdir()
    before = '# mine\n[mcp_servers.other]\ncommand = "other-mcp"\n'
    codex_file.write_text(before)
    relay_env(relayd, tmp_path, "--tool", "codex", "--write")
    written = tomllib.loads(codex_file.read_text())
    assert written["mcp_servers"] == {
        "other": {"command": "other-mcp"},
        SERVER_NAME: expected_entry(relayd),
    }
    assert "# mine" in codex_file.read_text()
    assert codex_file.with_name("config.toml.bak").read_text() == before


@pytest.mark.slow
def test_openclaw_gets_its_mcp_servers_entry_and_write_merges_it(
    relayd: RunningDaemon, tmp_path: Path
) -> None:
    """`relay env --tool openclaw` prints one openclaw.json document with the provider and
    mcp.servers.taogpud; --write merges it beside the user's own servers."""
    printed = relay_env(relayd, tmp_path, "--tool", "openclaw").stdout
    document = json.loads(printed.split("\n", 1)[1])
    assert document["mcp"]["servers"][SERVER_NAME] == expected_entry(relayd)
    assert SERVER_NAME in document["models"]["providers"]
    claw_file = tmp_path / ".openclaw" / "openclaw.json"
    claw_file.parent.mkdir()
    claw_file.write_text(json.dumps({"mcp": {"servers": {"other": {"command": "o"}}}}))
    relay_env(relayd, tmp_path, "--tool", "openclaw", "--write")
    written = json.loads(claw_file.read_text())
    assert written["mcp"]["servers"] == {
        "other": {"command": "o"},
        SERVER_NAME: expected_entry(relayd),
    }
    assert SERVER_NAME in written["models"]["providers"]


# --- the real tools, where installed ------------------------------------------------------------


def taogpuctl_on_path(folder: Path) -> dict[str, str]:
    """An environment whose PATH has a `taogpuctl` that runs this checkout's code."""
    folder.mkdir()
    script = folder / "taogpuctl"
    python_path = ctl_env()["PYTHONPATH"]
    command = f"PYTHONPATH={shlex.quote(python_path)} exec {shlex.quote(sys.executable)}"
    script.write_text(f'#!/bin/sh\n{command} -m taogpud.cli "$@"\n')
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.slow
def test_claude_code_registers_the_line_and_connects(relayd: RunningDaemon, tmp_path: Path) -> None:
    """The printed line, run as it is, registers the server with Claude Code, whose own
    health check then starts `taogpuctl mcp` and connects to it. (The tool as .ci/run
    installs it, else a skip saying so.)"""
    claude_bin = tool_binary("claude", CLAUDE_CODE_VERSION)
    out = relay_env(relayd, tmp_path, "--tool", "claude-code").stdout
    line = next(line for line in out.splitlines() if line.startswith("# claude mcp add"))
    env = taogpuctl_on_path(tmp_path / "bin")
    env["PATH"] = f"{claude_bin.parent}{os.pathsep}{env['PATH']}"
    env["CLAUDE_CONFIG_DIR"] = str(tmp_path / "claude")
    project = tmp_path / "project"
    project.mkdir()

    def claude(command: str) -> str:
        done = subprocess.run(
            command,
            shell=True,
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    claude(line.removeprefix("# "))
    listed = claude("claude mcp list")
    assert f"{SERVER_NAME}: taogpuctl --socket {relayd.socket_path} mcp" in listed
    assert "Connected" in listed.split(f"{SERVER_NAME}:", 1)[1].splitlines()[0]


@pytest.mark.slow
def test_codex_reads_the_written_server(relayd: RunningDaemon, tmp_path: Path) -> None:
    """After --write, Codex itself lists the server with its command and arguments."""
    codex = tool_binary("codex", CODEX_VERSION)
    relay_env(relayd, tmp_path, "--tool", "codex", "--write")
    env = {**os.environ, **env_for(tmp_path)}
    done = subprocess.run(
        [str(codex), "mcp", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (server,) = [entry for entry in json.loads(done.stdout) if entry["name"] == SERVER_NAME]
    assert server["transport"]["command"] == "taogpuctl"
    assert server["transport"]["args"] == expected_entry(relayd)["args"]
