"""structlog, configured in exactly one place: JSON lines on stdout, level and
redaction that a reload can change. Under journald, job events go as native journal
entries instead (taogpud.journal): the same line, plus indexed fields.

With `cache_logger_on_first_use=True` a later `configure()` does not change the
level of loggers already used, so the level is a processor reading `_state`
rather than structlog's filtering logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import structlog

from taogpud import journal, trace_ring

LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
REDACTED = "<redacted>"
SECRET_KEY_NAMES = frozenset({"api_key", "apikey", "apiKey", "authorization", "x-api-key"})


class _State:
    level = LEVELS["info"]
    request_trace = True
    secrets: tuple[str, ...] = ()
    journal: journal.JournalWriter | None = None  # set under journald: job events go there
    trace_file: int | None = None  # settings.json logging.file, opened for appending


_state = _State()


def set_trace_file(path: Path | None) -> str | None:
    """Append every trace line to `path` too (None: stop); why it cannot, else None."""
    old, _state.trace_file = _state.trace_file, None
    if old is not None:
        os.close(old)
    if path is None:
        return None
    try:  # O_APPEND: one write() per line, whole lines even beside another writer
        _state.trace_file = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def set_level(level: str) -> None:
    _state.level = LEVELS.get(level.lower(), LEVELS["info"])


def set_request_trace(enabled: bool) -> None:
    _state.request_trace = enabled


def request_trace_enabled() -> bool:
    return _state.request_trace


def set_secrets(*values: str | None) -> None:
    """Values that must never be written, wherever they turn up in an event."""
    _state.secrets = tuple(v for v in values if v and len(v) >= 4)


def filter_level(_: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    if LEVELS.get(method_name, 20) < _state.level:
        raise structlog.DropEvent
    return event_dict


def redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Drop secret-named fields and scrub secret values from every string, nested too.

    Runs on every line, so numbers and None (most of a job trace) are passed over at once
    and values are replaced in place: a third of the cost of the copying version."""
    for key, value in event_dict.items():
        if (value is None or type(value) in _PLAIN_TYPES) and key not in SECRET_KEY_NAMES:
            continue
        scrubbed = _scrub(key, value)
        if scrubbed is not value:
            event_dict[key] = scrubbed
    return event_dict


_PLAIN_TYPES = frozenset({int, float, bool})  # never a secret, whatever the key


def _scrub(key: str, value: Any) -> Any:
    if key in SECRET_KEY_NAMES and value:
        return REDACTED
    if isinstance(value, str):
        for secret in _state.secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value  # the same object when nothing was found: `redact` keeps it
    if isinstance(value, Mapping):
        return {k: _scrub(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub("", v) for v in value]
    return value


class _Clock:
    """ISO-8601 UTC timestamps, the second's text made once per second: structlog's
    TimeStamper builds a datetime for every line, the costliest step after redaction."""

    second = -1
    prefix = ""

    def __call__(self, _: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        now = event_dict.pop("_at", None) or time.time()  # when a deferred line happened
        second = int(now)
        if second != self.second:
            self.second = second
            self.prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        event_dict["timestamp"] = f"{self.prefix}.{int((now - second) * 1e6):06d}Z"
        return event_dict


def _orjson_dumps(event: Any, **_: Any) -> bytes:
    return orjson.dumps(event, default=str)


# the job trace (taogpud.trace) and the relay's (taogpud.relay): their fields become journal fields
JOURNAL_EVENT_PREFIX = ("job.", "relay.request")


def render(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> bytes:
    """The JSON line; under journald a job event goes as a native entry instead of stdout.

    Runs after `redact`, so the journal fields are the redacted ones."""
    line = _orjson_dumps(event_dict)
    trace_ring.RING.append(line, event_dict)  # readable through the API (GET /v1/trace)
    if _state.trace_file is not None:
        _write_trace_file(_state.trace_file, line)
    writer = _state.journal
    if (
        writer is not None
        and str(event_dict.get("event", "")).startswith(JOURNAL_EVENT_PREFIX)
        and writer.send_event(line, event_dict)
    ):
        raise structlog.DropEvent
    return line


def _write_trace_file(fd: int, line: bytes) -> None:
    # a full disk must not stop the daemon; stdout / journald still have the line
    with contextlib.suppress(OSError):
        os.write(fd, line + b"\n")


def configure(level: str = "info", request_trace: bool = True) -> None:
    set_level(level)
    set_request_trace(request_trace)
    if _state.journal is not None:
        _state.journal.close()
    _state.journal = journal.open_writer()
    structlog.configure(
        processors=[
            filter_level,
            structlog.processors.add_log_level,
            _Clock(),
            structlog.processors.format_exc_info,
            redact,
            render,
        ],
        logger_factory=structlog.BytesLoggerFactory(sys.stdout.buffer),
        cache_logger_on_first_use=True,
    )
    # Libraries that log through the standard library (uvicorn, asyncio) go to
    # stderr at WARNING: their messages are rare and journald keeps both streams.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")


def get_logger(name: str = "taogpud") -> Any:
    return structlog.get_logger(name)
