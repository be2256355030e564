"""Which tool sent a request (by User-Agent), and what each tool needs to use the relay.

Client side too: `taogpuctl relay env --tool X` prints `recipe(X, ...).lines`. Nothing here
imports the daemon. Each recipe is the way the tool's current release is configured:

    codex               a custom provider in $CODEX_HOME/config.toml (wire_api = "responses",
                        env_key naming the variable that holds the token); Codex no longer
                        reads OPENAI_BASE_URL (openai/codex PR 16720, April 2026)

`with_mcp_server` adds `taogpuctl mcp`'s registration to a recipe (agents/registration.py):
[mcp_servers.taogpud] for Codex, mcp.servers.taogpud for OpenClaw, the `claude mcp add` line
for Claude Code.
    claude-code         ANTHROPIC_BASE_URL + ANTHROPIC_AUTH_TOKEN (sent as Bearer)
    openclaw[-anthropic] a models.providers entry of openclaw.json; OpenClaw's validation
                        refuses a custom provider without its `models`
    openai, anthropic   the SDKs' own variables
    generic             OpenAI-compatible tools (llm, LangChain, LiteLLM's SDK, Continue, Aider)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# (pattern, tool name), first match wins: the tools themselves, searched in User-Agent and in
# X-Title (the app name tools send OpenRouter; OpenClaw's recipe sets it, since OpenClaw's own
# User-Agent is its SDK's), then the SDKs and clients, in User-Agent alone
KNOWN_TOOLS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"claude-cli|claude-code", "claude-code"),
        (r"codex", "codex"),
        (r"openclaw", "openclaw"),
        (r"continue", "continue"),
        (r"aider", "aider"),
        (r"langchain", "langchain"),
        (r"litellm", "litellm"),
        (r"^llm/", "llm"),
        (r"taogpuctl|taogpud", "taogpuctl"),
    )
)
KNOWN_CLIENTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"^anthropic/", "anthropic-sdk"),
        (r"^openai/", "openai-sdk"),
        (r"^curl/", "curl"),
    )
)
_PRODUCT = re.compile(r"[A-Za-z0-9._\-]{1,40}")

TOOLS = (
    "claude-code",
    "codex",
    "openclaw",
    "openclaw-anthropic",
    "openai",
    "anthropic",
    "generic",
)
PROVIDER_NAME = "taogpud"  # the provider's name in Codex's and OpenClaw's config files
CODEX_TOKEN_VAR = "TAOGPUD_RELAY_TOKEN"  # Codex's env_key: the variable holding the token
# OpenClaw wants a context window and an output cap per model; the relay cannot know the
# provider's, so these are the common floor of today's coding models (edit them to taste).
OPENCLAW_CONTEXT_WINDOW = 200_000
OPENCLAW_MAX_TOKENS = 8_192


def tool_of(user_agent: str, title: str = "") -> str:
    """A short name for the trace: a known tool (by User-Agent or X-Title), else a known
    client (the SDKs), else the User-Agent's first product token."""
    for pattern, name in KNOWN_TOOLS:
        if pattern.search(user_agent) or (title and pattern.search(title)):
            return name
    for pattern, name in KNOWN_CLIENTS:
        if pattern.search(user_agent):
            return name
    match = _PRODUCT.match(user_agent)
    return match.group(0) if match else "-"


@dataclass(frozen=True)
class Recipe:
    """What one tool needs: shell exports, and for a tool that reads a file, what to merge."""

    exports: list[tuple[str, str]]
    file_kind: str | None = None  # "codex-toml" | "openclaw-json"
    merge: dict[str, Any] = field(default_factory=dict)  # the document to merge into it
    notes: list[str] = field(default_factory=list)  # comments after the exports

    @property
    def export_lines(self) -> list[str]:
        return [f"export {name}={value}" for name, value in self.exports]

    def lines(self) -> list[str]:
        """The whole recipe as printed: the file's part (if any), then the shell's."""
        if self.file_kind is None:
            return [*self.export_lines, *self.notes]
        if self.file_kind == "codex-toml":
            head = ["# merge into $CODEX_HOME/config.toml (~/.codex/config.toml), or use --write"]
            body = codex_toml(self.merge)
        else:
            head = ["// merge into ~/.openclaw/openclaw.json, or use --write"]
            body = json.dumps(self.merge, indent=2).split("\n")
        if not self.exports:
            return [*head, *body]
        return [*head, *body, "", "# and in the shell (or its rc file):", *self.export_lines]


def recipe(tool: str, base_url: str, token: str, aliases: Mapping[str, str]) -> Recipe:
    """The recipe for `tool`, with the relay at `base_url` (no /v1) and the user's token."""
    v1 = base_url.rstrip("/") + "/v1"
    if tool == "claude-code":  # Claude Code sends ANTHROPIC_AUTH_TOKEN as a Bearer token
        return Recipe([("ANTHROPIC_BASE_URL", base_url), ("ANTHROPIC_AUTH_TOKEN", token)])
    if tool == "anthropic":  # the anthropic SDKs: x-api-key
        return Recipe([("ANTHROPIC_BASE_URL", base_url), ("ANTHROPIC_API_KEY", token)])
    if tool == "openai":
        return Recipe([("OPENAI_BASE_URL", v1), ("OPENAI_API_KEY", token)])
    if tool == "generic":  # OPENAI_API_BASE: the older name LangChain, LiteLLM and Aider read
        exports = [("OPENAI_BASE_URL", v1), ("OPENAI_API_BASE", v1), ("OPENAI_API_KEY", token)]
        return Recipe(exports)
    if tool == "codex":
        return Recipe([(CODEX_TOKEN_VAR, token)], "codex-toml", codex_config(v1, aliases))
    if tool in ("openclaw", "openclaw-anthropic"):
        entry = openclaw_provider(tool == "openclaw-anthropic", base_url, token, aliases)
        return Recipe([], "openclaw-json", {"models": {"providers": {PROVIDER_NAME: entry}}})
    raise ValueError(f"unknown tool {tool!r}; known: {', '.join(TOOLS)}")


def with_mcp_server(made: Recipe, tool: str, socket_path: str | None) -> Recipe:
    """The recipe with `taogpuctl mcp` registered in the tool's own form (issue 39): merged
    into the file a tool reads, or for Claude Code the `claude mcp add` line as a comment."""
    from taogpud.agents import registration

    if made.file_kind == "codex-toml":
        return replace(made, merge={**made.merge, **registration.codex_servers(socket_path)})
    if made.file_kind == "openclaw-json":
        return replace(made, merge={**made.merge, **registration.openclaw_servers(socket_path)})
    if tool == "claude-code":
        return replace(made, notes=registration.claude_code_lines(socket_path))
    return made


def default_model(aliases: Mapping[str, str]) -> str:
    """The alias a coding agent starts with: `coding`, else `default`, else the first."""
    for name in ("coding", "default"):
        if name in aliases:
            return name
    return next(iter(aliases), "default")


def codex_config(v1: str, aliases: Mapping[str, str]) -> dict[str, Any]:
    provider = {
        "name": "taogpud relay",
        "base_url": v1,
        "env_key": CODEX_TOKEN_VAR,
        "wire_api": "responses",
    }
    return {
        "model_provider": PROVIDER_NAME,
        "model": default_model(aliases),
        "model_providers": {PROVIDER_NAME: provider},
    }


def codex_toml(config: Mapping[str, Any]) -> list[str]:
    """The Codex config as TOML lines: root keys first, as TOML requires, then each table
    of named tables ([model_providers.NAME], [mcp_servers.NAME]). JSON's strings and arrays
    of strings are TOML's too."""
    groups = {key: value for key, value in config.items() if isinstance(value, dict)}
    lines = [f"{key} = {json.dumps(value)}" for key, value in config.items() if key not in groups]
    for group, named in groups.items():
        for name, table in named.items():
            lines += ["", f"[{group}.{name}]"]
            lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return lines


def openclaw_provider(
    anthropic: bool, base_url: str, token: str, aliases: Mapping[str, str]
) -> dict[str, Any]:
    """A complete custom provider of openclaw.json: its models are settings.json's aliases,
    which the relay turns into the provider's model names."""
    models = [
        {
            "id": alias,
            "name": f"{alias} ({model})",
            "input": ["text"],
            "contextWindow": OPENCLAW_CONTEXT_WINDOW,
            "maxTokens": OPENCLAW_MAX_TOKENS,
        }
        for alias, model in aliases.items()
    ]
    return {
        "baseUrl": base_url if anthropic else base_url.rstrip("/") + "/v1",
        "apiKey": token,
        "api": "anthropic-messages" if anthropic else "openai-completions",
        "headers": {"X-Title": "OpenClaw"},  # its User-Agent is its SDK's: the trace's name
        "models": models,
    }
