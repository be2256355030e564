"""structlog, configured in exactly one place: JSON lines on stdout, level and
redaction that a reload can change. Under journald, job events go as native journal
entries instead (taogpud.observability.journal): the same line, plus indexed fields.

With `cache_logger_on_first_use=True` a later `configure()` does not change the
level of loggers already used, so the level is a processor reading `_state`
rather than structlog's filtering logger.

Every line leaves through one `StdoutSink`, which never blocks the event loop and never
raises into it: a stdout that is a pipe or a socket (`taogpud | tee log`, journald's
stream) is written by a thread from a bounded buffer, so a reader that stops reading
costs dropped lines, not a wedged daemon that ignores SIGTERM; a dead pipe (EPIPE) is
a count, not an exception. Lines that could not be written are counted
(`write_failures()`, shown by `taogpuctl status`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import structlog

from taogpud.observability import journal, trace_ring

LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
REDACTED = "<redacted>"
SECRET_KEY_NAMES = frozenset({"api_key", "apikey", "apiKey", "authorization", "x-api-key"})


MAX_BUFFERED_BYTES = 8 << 20  # what a slow stdout may hold back before lines are dropped


class StdoutSink:
    """The one writer of log lines to a file descriptor (stdout): a file or a terminal is
    written at once; a pipe or a socket, which can fill or die, from a thread of its own."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.failures = 0  # lines (or batches) that could not be written
        self._buffer: collections.deque[bytes] = collections.deque()
        self._buffered_bytes = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            mode = 0
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            self._thread = threading.Thread(target=self._drain, name="log-writer", daemon=True)
            self._thread.start()

    def write(self, data: bytes) -> None:
        if self._thread is None:
            self._write_now(data)
            return
        with self._wake:
            if self._buffered_bytes + len(data) > MAX_BUFFERED_BYTES:
                self.failures += 1  # the reader fell behind by megabytes: drop, never block
                return
            self._buffer.append(data)
            self._buffered_bytes += len(data)
            self._wake.notify()

    def flush(self) -> None:
        """Wait (a little) for the thread to write what it holds: at the stop, so the last
        lines are not lost to the process's exit."""
        deadline = time.monotonic() + 2.0
        while self._thread is not None and self._buffer and time.monotonic() < deadline:
            time.sleep(0.01)

    def _write_now(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError:  # EPIPE, EIO, ENOSPC: the line is lost, the daemon goes on
            self.failures += 1

    def _drain(self) -> None:
        while True:
            with self._wake:
                while not self._buffer:
                    self._wake.wait()
                data = self._buffer.popleft()
                self._buffered_bytes -= len(data)
            self._write_now(data)


class _SinkFile:
    """What structlog's BytesLogger writes to: the sink, behind a file's write/flush."""

    def write(self, data: bytes) -> None:
        write_lines(data)

    def flush(self) -> None:
        pass  # each line was handed to the sink whole


class _State:
    level = LEVELS["info"]
    request_trace = True
    secrets: tuple[str, ...] = ()
    secret_marks: tuple[bytes, ...] = ()  # each secret as it reads inside a JSON line
    journal: journal.JournalWriter | None = None  # set under journald: job events go there
    trace_file: int | None = None  # settings.json logging.file, opened for appending
    sink: StdoutSink | None = None  # set by configure()
    sink_for: Any = None  # the sys.stdout it was made for (stderr, once keep_stdout_for_lines
    # put it there): one put in its place (a test's capture) is written as it is


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


def write_lines(data: bytes) -> None:
    """Rendered lines to stdout, through the sink (sys.stdout before configure())."""
    if _state.sink is not None and sys.stdout is _state.sink_for:
        _state.sink.write(data)
        return
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except OSError:
        pass


def keep_stdout_for_lines() -> None:
    """From now on stdout carries the JSON lines alone: whatever else in this process prints
    to sys.stdout (a library's print) goes to stderr, which the journal keeps too. The sink
    goes on writing the descriptor it was made for, and children inherit it as it is.

    Ray's driver prints what its raylet reports ("(raylet) A worker died ...") to sys.stdout,
    from a thread of its own, while the loop writes its lines to the same descriptor: the
    trace was mixed with text, and a line that goes out inside one is lost to every reader
    (tests/test_ray_executor.py); a task's print in a worker did the same
    (tests/test_stdout_lines.py). Call it once logging is configured (configure() made the
    sink for the real stdout, and reads the journal's stream from it)."""
    if _state.sink is None or sys.stdout is not _state.sink_for:
        return  # unconfigured, or stdout already stood in for (a test's capture)
    sys.stdout = sys.stderr
    _state.sink_for = sys.stdout


def write_failures() -> int:
    """Log lines lost to a stdout that was dead, full or failing since the start."""
    return _state.sink.failures if _state.sink is not None else 0


def flush_lines() -> None:
    if _state.sink is not None:
        _state.sink.flush()


def set_level(level: str) -> None:
    _state.level = LEVELS.get(level.lower(), LEVELS["info"])


def set_request_trace(enabled: bool) -> None:
    _state.request_trace = enabled


def request_trace_enabled() -> bool:
    return _state.request_trace


def set_secrets(*values: str | None) -> None:
    """Values that must never be written, wherever they turn up in an event."""
    _state.secrets = tuple(v for v in values if v and len(v) >= 4)
    # JSON escapes a string one character at a time, so a value holding the secret holds
    # its escaped form in the line; orjson leaves non-ASCII as UTF-8, as .encode() does.
    _state.secret_marks = tuple(
        dict.fromkeys(m for v in _state.secrets for m in (v.encode(), orjson.dumps(v)[1:-1]))
    )


def enabled(level: str) -> bool:
    """Whether a line at `level` is written (filter_level keeps it): a caller that would
    build a line for nothing (the API's debug line of each answered request) asks first."""
    return LEVELS.get(level, 20) >= _state.level


def filter_level(_: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    if LEVELS.get(method_name, 20) < _state.level:
        raise structlog.DropEvent
    return event_dict


def redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Drop the values of secret-named fields, nested ones too.

    A secret inside any other value is found in the rendered line instead (render): one
    search of the line's bytes covers every field, and also a field's key and the text of an
    object rendered through str(), which a walk over the fields' strings missed (and leaked;
    tests/test_log_redaction.py). Warm, a line costs 11–17 µs either way."""
    for key, value in event_dict.items():
        if key in SECRET_KEY_NAMES and value:
            event_dict[key] = REDACTED
        elif not (value is None or type(value) in _FLAT_TYPES) and isinstance(value, _NESTED):
            event_dict[key] = _scrub(key, value)
    return event_dict


_FLAT_TYPES = frozenset({str, int, float, bool})  # nothing nested to look into
_NESTED = (Mapping, list, tuple)


def _scrub(key: str, value: Any) -> Any:
    """`value` without secret-named fields and with the secrets in its strings replaced."""
    if key in SECRET_KEY_NAMES and value:
        return REDACTED
    if isinstance(value, str):
        for secret in _state.secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, Mapping):
        return {k: _scrub(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub("", v) for v in value]
    return value


def _without_secrets(event_dict: MutableMapping[str, Any], line: bytes) -> bytes:
    """The line again once a secret was found in it: the fields scrubbed (the journal takes
    them), then the secret replaced in what the fields could not hold it in (a key, an
    object's str())."""
    for key, value in event_dict.items():
        event_dict[key] = _scrub(key, value)
    line = _orjson_dumps(event_dict)
    for mark in _state.secret_marks:
        line = line.replace(mark, REDACTED.encode())
    return line


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


# the job trace (observability/trace.py) and the relay's (taogpud.relay): their fields become
# journal fields
JOURNAL_EVENT_PREFIX = ("job.", "relay.request")


def render(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> bytes:
    """The JSON line; under journald a job event goes as a native entry instead of stdout.

    Runs after `redact`, and scrubs a line a secret is found in, so the journal fields are the
    redacted ones."""
    line = _orjson_dumps(event_dict)
    if any(mark in line for mark in _state.secret_marks):
        line = _without_secrets(event_dict, line)
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


def configure(level: str = "info", request_trace: bool = True, *, for_process: bool = True) -> None:
    """The one configuration. `for_process=False` (a daemon in a test's own process) leaves
    loggers uncached: a cached one keeps this chain for good, and structlog.testing's
    capture_logs, which swaps the chain for a while, no longer sees what it logs."""
    set_level(level)
    set_request_trace(request_trace)
    if _state.journal is not None:
        _state.journal.close()
    _state.journal = journal.open_writer()
    if _state.sink is None or sys.stdout is not _state.sink_for:
        try:
            _state.sink = StdoutSink(sys.stdout.fileno())
        except (OSError, ValueError):  # no descriptor (stdout replaced in-process): as it is
            _state.sink = None
        _state.sink_for = sys.stdout
    structlog.configure(
        processors=[
            filter_level,
            structlog.processors.add_log_level,
            _Clock(),
            structlog.processors.format_exc_info,
            redact,
            render,
        ],
        logger_factory=structlog.BytesLoggerFactory(_SinkFile()),  # type: ignore[arg-type]
        cache_logger_on_first_use=for_process,
    )
    # Libraries that log through the standard library (uvicorn, asyncio) go to
    # stderr at WARNING: their messages are rare and journald keeps both streams.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")


def get_logger(name: str = "taogpud") -> Any:
    return structlog.get_logger(name)
