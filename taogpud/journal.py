"""Job events as native journal entries, so `journalctl -u taogpud BACKEND=cpu` selects them.

JSON on stdout lands in the journal as one MESSAGE string whose fields journald does
not index. Under journald, a job event is therefore sent once as a native entry
(datagrams to /run/systemd/journal/socket, the journal's documented protocol) whose
MESSAGE is the exact JSON line stdout would have carried, with each of its keys also
as a field (`job_id` → JOB_ID, `backend` → BACKEND, `uid` → UID, ...) and its level
as PRIORITY. `journalctl -o cat | jq` reads the same lines as before, each once.

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
        "MESSAGE": line,
        "PRIORITY": str(PRIORITIES.get(str(event.get("level", "info")), 6)),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
    }
    for key, value in event.items():
        name = field_name(key)
        if name and key not in SKIPPED_KEYS and value is not None and name not in fields:
            fields[name] = field_value(value)
    return fields


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
