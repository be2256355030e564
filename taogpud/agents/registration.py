"""How each AI tool registers `taogpuctl mcp`, in the form that tool reads; `taogpuctl relay
env --tool X` prints it beside the relay's recipe, and `--write` merges the file forms.

Each form was checked against the tool itself (docs/agents.md says how):

    claude-code   `claude mcp add NAME -- COMMAND ARGS…`, or a project's .mcp.json
                  {"mcpServers": {NAME: {command, args}}} (Claude Code 2.1.197 registered the
                  line and its `claude mcp list` connected to the server)
    codex         [mcp_servers.NAME] command, args in $CODEX_HOME/config.toml: what
                  `codex mcp add NAME -- COMMAND ARGS…` writes (openai/codex, codex-rs/cli/src/
                  mcp_cmd.rs; Codex 0.171.0 wrote exactly this table)
    openclaw      mcp.servers.NAME {command, args} in ~/.openclaw/openclaw.json, what
                  `openclaw mcp set NAME JSON` saves (openclaw/openclaw, docs/cli/mcp.md)

Pure functions: no SDK, no socket.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

SERVER_NAME = "taogpud"  # the server's name in every tool's config


def server_entry(socket_path: str | None) -> dict[str, Any]:
    """The stdio server as every tool names it: the command and its arguments. The socket
    only when one was chosen (--socket, TAOGPUD_SOCKET); else taogpuctl finds it as always."""
    socket_args = ["--socket", socket_path] if socket_path else []
    return {"command": "taogpuctl", "args": [*socket_args, "mcp"]}


def claude_code_lines(socket_path: str | None) -> list[str]:
    """The `claude mcp add` line and the .mcp.json form, as shell comments: `eval "$(taogpuctl
    relay env --tool claude-code)"` sets the variables and registers nothing behind the
    user's back."""
    entry = server_entry(socket_path)
    command = shlex.join([entry["command"], *entry["args"]])
    document = json.dumps({"mcpServers": {SERVER_NAME: entry}}, indent=2).split("\n")
    return [
        "# taogpud's GPU tools for the agent (taogpuctl mcp, docs/agents.md): register once with",
        f"# claude mcp add {SERVER_NAME} -- {command}",
        "# or, for a project, in its .mcp.json:",
        *(f"#   {line}" for line in document),
    ]


def codex_servers(socket_path: str | None) -> dict[str, Any]:
    """What merges into Codex's config.toml: [mcp_servers.taogpud]."""
    return {"mcp_servers": {SERVER_NAME: server_entry(socket_path)}}


def openclaw_servers(socket_path: str | None) -> dict[str, Any]:
    """What merges into openclaw.json: mcp.servers.taogpud."""
    return {"mcp": {"servers": {SERVER_NAME: server_entry(socket_path)}}}
