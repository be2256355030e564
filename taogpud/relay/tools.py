"""Which tool sent a request (by User-Agent), and what each tool needs to use the relay.

Client side too: `taogpuctl relay env --tool X` prints `env_lines(X, base, token)`. Nothing
here imports the daemon.
"""

from __future__ import annotations

import json
import re

# (User-Agent pattern, tool name), first match wins
KNOWN_AGENTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"claude-cli|claude-code", "claude-code"),
        (r"codex", "codex"),
        (r"openclaw", "openclaw"),
        (r"^anthropic/", "anthropic-sdk"),
        (r"^openai/", "openai-sdk"),
        (r"^curl/", "curl"),
        (r"taogpuctl|taogpud", "taogpuctl"),
    )
)
_PRODUCT = re.compile(r"[A-Za-z0-9._\-]{1,40}")

TOOLS = ("claude-code", "codex", "openai", "anthropic", "openclaw", "openclaw-anthropic")


def tool_of(user_agent: str) -> str:
    """A short name for the trace: a known tool, else the User-Agent's first product token."""
    for pattern, name in KNOWN_AGENTS:
        if pattern.search(user_agent):
            return name
    match = _PRODUCT.match(user_agent)
    return match.group(0) if match else "-"


def env_lines(tool: str, base_url: str, token: str) -> list[str]:
    """The exact lines `tool` reads: shell exports, or OpenClaw's provider entry (JSON)."""
    v1 = base_url.rstrip("/") + "/v1"
    if tool == "claude-code":  # Claude Code sends ANTHROPIC_AUTH_TOKEN as a Bearer token
        return [f"export ANTHROPIC_BASE_URL={base_url}", f"export ANTHROPIC_AUTH_TOKEN={token}"]
    if tool == "anthropic":  # the anthropic SDKs: x-api-key
        return [f"export ANTHROPIC_BASE_URL={base_url}", f"export ANTHROPIC_API_KEY={token}"]
    if tool in ("openai", "codex"):  # the openai SDKs, and Codex's built-in openai provider
        return [f"export OPENAI_BASE_URL={v1}", f"export OPENAI_API_KEY={token}"]
    if tool in ("openclaw", "openclaw-anthropic"):
        anthropic = tool == "openclaw-anthropic"
        entry = {
            "baseUrl": base_url if anthropic else v1,
            "apiKey": token,
            "api": "anthropic-messages" if anthropic else "openai-completions",
        }
        document = {"models": {"providers": {"taogpud": entry}}}
        lines = json.dumps(document, indent=2).split("\n")
        return ["// merge into ~/.openclaw/openclaw.json", *lines]
    raise ValueError(f"unknown tool {tool!r}; known: {', '.join(TOOLS)}")
