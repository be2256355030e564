"""The token usage a provider reports, and the relay's counters per user and model.

OpenAI-style answers carry `usage: {prompt_tokens, completion_tokens}` (a stream: in its last
chunk, when the client asked for `stream_options.include_usage`); Anthropic-style ones carry
`usage: {input_tokens, output_tokens}` (a stream: `message_start` has the input side, the
last `message_delta` the output side). Only `data:` lines that mention "usage" are parsed, so a
long stream costs a substring search per line.
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


class StreamUsage:
    """Reads usage out of an SSE stream fed piece by piece (pieces split lines anywhere)."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens
        self._tail = b""

    def feed(self, piece: bytes) -> None:
        data = self._tail + piece
        lines = data.split(b"\n")
        self._tail = lines.pop()[-65536:]  # an unfinished line; a runaway one is cut
        for line in lines:
            if line.startswith(b"data:") and b'"usage"' in line:
                self._event(line[5:])

    def _event(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        self.tokens.add(event.get("usage"))
        message = event.get("message")
        if isinstance(message, dict):  # anthropic: message_start
            self.tokens.add(message.get("usage"))


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
