"""The token usage a provider reports, and the relay's counters per user and model.

OpenAI-style answers carry `usage: {prompt_tokens, completion_tokens}` (a stream: in its last
chunk, when the client asked for `stream_options.include_usage`); Anthropic-style ones carry
`usage: {input_tokens, output_tokens}` (a stream: `message_start` has the input side, the
last `message_delta` the output side); the Responses API's stream has it in the last event,
`response.completed`, as `response.usage` (that event repeats the whole answer, so its line may
be megabytes long). Only `data:` lines that mention "usage" are parsed, so a long stream costs
a substring search per line.

A stream's end is its last event (`data: [DONE]`, `message_stop`, `response.completed`,
`.failed` or `.incomplete`), not the provider's closing of the body: a client that leaves
once it has that event has the whole answer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

MAX_JSON_BYTES = 8 << 20  # a non-streamed answer kept to read its usage; larger is not read


@dataclass
class Tokens:
    input: int = 0
    output: int = 0
    seen: bool = False  # whether the provider reported any

    @property
    def total(self) -> int:
        return self.input + self.output

    def add(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for names, side in (
            (("prompt_tokens", "input_tokens"), "input"),
            (
                ("completion_tokens", "output_tokens"),
                "output",
            ),
        ):
            for name in names:
                value = usage.get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    # a stream repeats running totals: keep the largest seen
                    setattr(self, side, max(getattr(self, side), value))
                    self.seen = True

    def as_dict(self) -> dict[str, int] | None:
        if not self.seen:
            return None
        return {"input": self.input, "output": self.output, "total": self.total}


def usage_of_json(body: bytes, tokens: Tokens) -> None:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(answer, dict):
        tokens.add(answer.get("usage"))


LAST_EVENTS = frozenset(
    {b"message_stop", b"response.completed", b"response.failed", b"response.incomplete"}
)
LAST_TYPES = frozenset(name.decode() for name in LAST_EVENTS)


class StreamUsage:
    """Reads usage out of an SSE stream fed piece by piece (pieces split lines anywhere), and
    whether the stream's last event has gone by (`ended`)."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens
        self.ended = False
        self._pending: list[bytes] = []  # the pieces of an unfinished line
        self._pending_bytes = 0

    def feed(self, piece: bytes) -> None:
        if b"\n" not in piece:
            self._keep(piece)
            return
        lines = piece.split(b"\n")
        if self._pending:
            lines[0] = b"".join(self._pending) + lines[0]
            self._pending, self._pending_bytes = [], 0
        self._keep(lines.pop())
        for line in lines:
            self._line(line)

    def _keep(self, part: bytes) -> None:
        """Joined only when its line ends: a long line costs no copy per piece. A line past
        MAX_JSON_BYTES is not kept (its usage is lost, the stream goes on)."""
        self._pending_bytes += len(part)
        if self._pending_bytes <= MAX_JSON_BYTES:
            self._pending.append(part)

    def _line(self, line: bytes) -> None:
        if line.startswith(b"data:"):
            if b'"usage"' in line:
                self._event(line[5:])
            elif line[5:].strip() == b"[DONE]":
                self.ended = True
        elif line.startswith(b"event:") and line[6:].strip() in LAST_EVENTS:
            self.ended = True

    def _event(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(event, dict):
            usage_of_event(event, self.tokens)
            self.ended = self.ended or event.get("type") in LAST_TYPES


def usage_of_event(event: dict[str, Any], tokens: Tokens) -> None:
    """The usage in one event of any family: its own `usage`, or its message's (Anthropic's
    message_start) or response's (the Responses API's response.completed)."""
    tokens.add(event.get("usage"))
    for holder in ("message", "response"):
        inner = event.get(holder)
        if isinstance(inner, dict):
            tokens.add(inner.get("usage"))


@dataclass(frozen=True)
class UseKey:
    uid: int | None
    model: str
    status: int


class UseTable:
    """Requests and tokens by (uid, model, status): `taogpuctl relay status` and Prometheus."""

    def __init__(self) -> None:
        self.requests: Counter[UseKey] = Counter()
        self.input_tokens: Counter[UseKey] = Counter()
        self.output_tokens: Counter[UseKey] = Counter()

    def record(self, key: UseKey, tokens: Tokens) -> None:
        self.requests[key] += 1
        self.input_tokens[key] += tokens.input
        self.output_tokens[key] += tokens.output

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "uid": key.uid,
                "model": key.model,
                "status": key.status,
                "requests": count,
                "input_tokens": self.input_tokens[key],
                "output_tokens": self.output_tokens[key],
            }
            for key, count in sorted(
                self.requests.items(), key=lambda item: (item[0].uid or -1, item[0].model)
            )
        ]
