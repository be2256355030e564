"""Job events as native journal entries, so `journalctl -u taogpud BACKEND=cpu` selects them.

JSON on stdout lands in the journal as one MESSAGE string whose fields journald does
not index. Under journald, a job event (and a relay request) is therefore sent once as a
native entry (datagrams to /run/systemd/journal/socket, the journal's documented protocol)
whose MESSAGE is one short human line, as journald's convention is (`job 1a2b3c succeeded
vector_add on gpu:0 (cuda) in 31 ms`), with each key of the event as a field beside it
(`job_id` → JOB_ID, `backend` → BACKEND, `uid` → UID, ...), its level as PRIORITY, and the
exact JSON line stdout would have carried as TRACE_JSON (`journalctl -o json | jq -r
.TRACE_JSON` reads the lines as before, each once). `journalctl -u taogpud` reads as a log.

Active only when stdout is the journal stream systemd named in JOURNAL_STREAM; a
no-op otherwise. A send that fails (a datagram too large, journald busy) returns
False and the caller writes the line to stdout instead: nothing is lost. The fields
come from the event after the logging redaction, so the API key cannot reach here.

No dependency: systemd-python needs libsystemd's headers and a compiler to install,
and the protocol is a few lines.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import orjson

JOURNAL_SOCKET = "/run/systemd/journal/socket"
SYSLOG_IDENTIFIER = "taogpud"
PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "critical": 2}
SKIPPED_KEYS = frozenset({"level", "timestamp"})  # PRIORITY and the journal's own time
_NOT_NAME = re.compile(r"[^A-Z0-9_]")
MAX_NAME_CHARS = 64


class JournalWriter:
    """One datagram socket to journald; `send` never blocks and never raises."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def send(self, fields: Mapping[str, str | bytes]) -> bool:
        try:
            self._sock.sendto(encode(fields), self.path)
        except OSError:  # EMSGSIZE, EAGAIN, journald gone: the caller falls back to stdout
            return False
        return True

    def send_event(self, line: bytes, event: Mapping[str, Any]) -> bool:
        """One native entry for a rendered event: MESSAGE=line, PRIORITY, and its keys."""
        return self.send(entry_fields(line, event))

    def close(self) -> None:
        self._sock.close()


def entry_fields(line: bytes, event: Mapping[str, Any]) -> dict[str, str | bytes]:
    fields: dict[str, str | bytes] = {
        "MESSAGE": human_message(event) or line,
        "TRACE_JSON": line,
        "PRIORITY": str(PRIORITIES.get(str(event.get("level", "info")), 6)),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
    }
    for key, value in event.items():
        name = field_name(key)
        if name and key not in SKIPPED_KEYS and value is not None and name not in fields:
            fields[name] = field_value(value)
    return fields


SHORT_ID = 6  # as `taogpuctl list` shows ids (JOB_ID holds the whole one)
FINISHED = frozenset({"succeeded", "failed", "cancelled", "timed_out", "interrupted"})


def human_message(event: Mapping[str, Any]) -> str | None:
    """The one line `journalctl -u taogpud` shows for a job event or a relay request; None
    for other events (they keep their JSON line)."""
    name = str(event.get("event", ""))
    if name.startswith("job."):
        return _job_message(name.removeprefix("job."), event)
    if name == "relay.request":
        return _relay_message(event)
    return None


def _job_message(state: str, event: Mapping[str, Any]) -> str:
    """`job 1a2b3c succeeded vector_add on gpu:0 (cuda) in 31 ms`, then a fallback or an
    error when there is one."""
    words = ["job", str(event.get("job_id", "?"))[:SHORT_ID], state]
    words += [str(event["task"])] if event.get("task") else []
    words += _where(event)
    if state == "queued" and event.get("priority"):
        words.append(f"(priority {event['priority']})")
    if state in FINISHED and isinstance(event.get("run_ms"), int | float):
        words.append(f"in {event['run_ms']:.0f} ms")
    text = " ".join(words)
    if event.get("fallback"):
        reason = event.get("fallback_reason")
        text += ", a CPU fallback" + (f": {reason}" if reason else "")
    if event.get("error"):
        code = event.get("error_code")
        text += ": " + (f"{code}: " if code else "") + str(event["error"])
    return text


def _where(event: Mapping[str, Any]) -> list[str]:
    device, backend = event.get("device"), event.get("backend")
    if device and backend:
        return [f"on {device} ({backend})"]
    return [f"on {device or backend}"] if device or backend else []


def _relay_message(event: Mapping[str, Any]) -> str:
    """`relay POST /v1/chat/completions 200 claude-sonnet in 212 ms (uid 1000, codex)`."""
    words = ["relay"] + [
        str(event[k]) for k in ("method", "path", "status", "model") if event.get(k)
    ]
    if isinstance(event.get("total_ms"), int | float):
        words.append(f"in {event['total_ms']:.0f} ms")
    who = [f"uid {event['uid']}"] if event.get("uid") is not None else []
    who += [str(event["tool"])] if event.get("tool") else []
    return " ".join(words) + (f" ({', '.join(who)})" if who else "")


def field_name(key: str) -> str | None:
    """`job_id` → JOB_ID. Journal names are [A-Z0-9_], not starting with `_` (trusted
    fields) or a digit, at most 64 characters."""
    name = _NOT_NAME.sub("_", key.upper()).lstrip("_0123456789")[:MAX_NAME_CHARS]
    return name or None


def field_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as in the JSON line: FALLBACK=true
    if isinstance(value, str | int | float):
        return str(value)
    return orjson.dumps(value, default=str).decode()


def encode(fields: Mapping[str, str | bytes]) -> bytes:
    """The native protocol: NAME=value lines; a value with a newline goes as NAME, a newline,
    its length as 64-bit little-endian, the bytes, and a newline."""
    out = bytearray()
    for name, value in fields.items():
        data = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


def stdout_is_journal(
    environ: Mapping[str, str] | None = None, stream: TextIO | None = None
) -> bool:
    """Whether stdout is the journal stream systemd connected (JOURNAL_STREAM=dev:ino)."""
    env = os.environ if environ is None else environ
    stream = sys.stdout if stream is None else stream
    try:
        device, inode = (int(part) for part in env.get("JOURNAL_STREAM", "").split(":"))
        stat = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return False
    return (stat.st_dev, stat.st_ino) == (device, inode)


def open_writer(
    environ: Mapping[str, str] | None = None, path: str = JOURNAL_SOCKET
) -> JournalWriter | None:
    """A writer when running under journald, else None (outside systemd: a no-op)."""
    if not stdout_is_journal(environ) or not Path(path).exists():
        return None
    return JournalWriter(path)
