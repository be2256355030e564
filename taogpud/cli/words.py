"""The daemon's validation errors in taogpuctl's words: flags, not API locations.

The daemon answers a bad request with pydantic's spelling of where and what
(`body.priority: Input should be less than or equal to 1000`, `size: Value error, expected an
integer, not a boolean (given True)`). A person typed `--priority 5000`, so that is what the
line should say: `--priority must be at most 1000 (given 5000)`. This module is the one place
that translates; the daemon's message stays as it is for other clients.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from typing import Any

import orjson

# API location (as the daemon spells it) → the flag a person typed.
FLAGS = {
    "body.priority": "--priority",
    "body.timeout_s": "--timeout",
    "body.device": "--device",
    "body.affinity": "--affinity",
    "query.status": "--status",
    "query.limit": "--limit",
    "query.timeout_s": "--timeout",
    "params.size": "--size",
    "params.seed": "--seed",
}

# What this command sent, by API location, so an error can say `(given 5000)`.
_SENT: ContextVar[dict[str, Any] | None] = ContextVar("taogpuctl_sent", default=None)

_LOCATED = re.compile(r"^(body|query|path)\.([\w.]+): (.*)$", re.DOTALL)
_PARAMS = re.compile(r"^invalid params for ([\w.-]+): (.*)$", re.DOTALL)
_PARAM = re.compile(r"^([\w.]+): (.*?)(?: \(given (.*?)\))?(, did you mean .*)?$", re.DOTALL)
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"^Value error, ", ""),
        (r"^Input should be less than or equal to (.+)$", r"must be at most \1"),
        (r"^Input should be greater than or equal to (.+)$", r"must be at least \1"),
        (r"^Input should be less than (.+)$", r"must be less than \1"),
        (r"^Input should be greater than (.+)$", r"must be greater than \1"),
        (r"^Input should be a valid integer.*$", "must be a whole number"),
        (r"^Input should be a valid number.*$", "must be a number"),
        (r"^Input should be a valid boolean.*$", "must be true or false"),
        (r"^Input should be a valid string.*$", "must be text"),
        (r"^Input should be (.+)$", r"must be \1"),
        (r"^expected (an? .+)$", r"must be \1"),
        (r"^unknown parameter$", "is not a parameter of this task"),
        (r"^Field required$", "is required"),
        (r"^required, not given$", "is required"),
    )
)


def remember(**sent: Any) -> None:
    """Record what this command sent (`body_priority=5000` → `body.priority`)."""
    _SENT.set({key.replace("_", ".", 1): value for key, value in sent.items()})


def humanize(message: str) -> str | None:
    """The message in taogpuctl's words, or None when it is not a validation message."""
    params = _PARAMS.match(message)
    if params:
        parts = [_param_part(part) for part in _split(params.group(2))]
        return f"invalid params for {params.group(1)}: " + "; ".join(parts)
    parts = _split(message)
    if not all(_LOCATED.match(part) for part in parts):
        return None
    return "; ".join(_located_part(part) for part in parts)


def _split(message: str) -> list[str]:
    return [part for part in message.split("; ") if part]


def _located_part(part: str) -> str:
    match = _LOCATED.match(part)
    assert match is not None
    location = f"{match.group(1)}.{match.group(2)}"
    sent = _SENT.get() or {}
    given = f" (given {_spell(sent[location])})" if location in sent else ""
    return f"{_flag(location)} {_phrase(match.group(3))}{given}"


def _param_part(part: str) -> str:
    match = _PARAM.match(part)
    if match is None:
        return part
    name, what, given, guess = match.groups()
    given_text = f" (given {_python_to_json(given)})" if given is not None else ""
    return f"{_flag('params.' + name)} {_phrase(what)}{given_text}{guess or ''}"


def _flag(location: str) -> str:
    if location in FLAGS:
        return FLAGS[location]
    kind, _, name = location.partition(".")
    return f"--param {name}" if kind == "params" else f"--{name.replace('_', '-')}"


def _phrase(text: str) -> str:
    for pattern, replacement in _PHRASES:
        text = pattern.sub(replacement, text)
    if text.startswith("must be ") and "'" in text and (" or " in text or ", " in text):
        choices = re.findall(r"'([^']*)'", text)  # `'queued', 'running' or 'failed'`
        return "must be one of " + ", ".join(choices)
    return text


def _spell(value: Any) -> str:
    """A value as the user would have typed it: JSON, with plain text unquoted."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _python_to_json(text: str) -> str:
    """`True` → `true`, `None` → `null`, `'abc'` → `"abc"`: the daemon echoes Python reprs."""
    words = {"True": "true", "False": "false", "None": "null"}
    if text in words:
        return words[text]
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return f'"{text[1:-1]}"'
    return text
