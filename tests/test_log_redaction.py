"""The API key never reaches a log line, wherever in the line's fields it turns up.

Lines go through the configured chain (observability/logging.py's configure) and are read back from
the trace ring, which holds each line as stdout, the trace file and the journal get it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from taogpud.observability import logging as tlog
from taogpud.observability import trace_ring

SECRET = "tt-sk-redaction-" + "4b9e2c7a1f"  # built at runtime: no key sits in a fixture file
QUOTED_SECRET = 'tt-sk-"quoted\\' + "8d3e"  # JSON escapes it: the line holds \" and \\


class HoldsTheKey:
    """An object a field may carry: rendered through str() (orjson's default)."""

    def __str__(self) -> str:
        return f"client(token={SECRET})"


@pytest.fixture
def secrets() -> Iterator[None]:
    tlog.configure()
    tlog.set_secrets(SECRET, QUOTED_SECRET)
    yield
    tlog.set_secrets(None)


def last_line() -> bytes:
    return list(trace_ring.RING.after(trace_ring.RING.last_seq() - 1))[-1].line


def test_a_secret_in_any_field_is_redacted(secrets: None) -> None:
    tlog.get_logger("test").warning(
        "redaction.check",
        error=f"provider said: bad key {SECRET}",
        client=HoldsTheKey(),
        nested={"deep": [f"Bearer {SECRET}"], "authorization": "Basic abc"},
        quoted=f"key {QUOTED_SECRET} here",
        **{f"header-{SECRET}": 1},
        api_key="sk-named-field",
    )
    line = last_line()
    assert SECRET.encode() not in line
    assert json.dumps(QUOTED_SECRET)[1:-1].encode() not in line
    event = json.loads(line)
    assert event["event"] == "redaction.check"
    assert event["error"] == "provider said: bad key <redacted>"
    assert event["client"] == "client(token=<redacted>)"
    assert event["nested"] == {"deep": ["Bearer <redacted>"], "authorization": "<redacted>"}
    assert event["quoted"] == "key <redacted> here"
    assert event["header-<redacted>"] == 1
    assert event["api_key"] == "<redacted>"


def test_a_line_without_a_secret_is_left_as_it_was(secrets: None) -> None:
    tlog.get_logger("test").info("redaction.clean", note="nothing here", count=3, ratio=0.5)
    event = json.loads(last_line())
    assert (event["note"], event["count"], event["ratio"]) == ("nothing here", 3, 0.5)
