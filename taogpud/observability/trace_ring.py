"""The last trace lines, kept in memory so that clients can read them through the API.

`taogpuctl trace --grep backend` and `taogpuctl logs ID -f` read the daemon's own JSON lines
(the ones stdout and journald get, after redaction) from here, instead of searching the
daemon's stdout. logging.render() appends every line; the API filters and follows it.

A leaf: nothing here knows the API or the scheduler. Appends come from any thread, under a
lock (the count of bytes and the lines change together).

Bounded in lines and in bytes: relay request lines run to several KB, and 20,000 of them were
seen with the daemon's memory 150 MB higher; RING_BYTES caps what the lines hold, the oldest
going first.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

RING_LINES = 20_000  # ~300 bytes a job's line
RING_BYTES = 16 * 1024 * 1024  # the lines' own bytes, however long they are


@dataclass(frozen=True, slots=True)
class TraceLine:
    seq: int  # increases by one per line: a follower asks for lines after the last it saw
    line: bytes  # the JSON line as written, without its newline
    job_id: str | None
    uid: int | None  # whose job or request the line is about; None: the daemon's own


class TraceRing:
    def __init__(self, size: int = RING_LINES, max_bytes: int = RING_BYTES) -> None:
        self._lines: deque[TraceLine] = deque()
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0  # of the lines kept
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    def append(self, line: bytes, event: Mapping[str, Any]) -> None:
        job_id, uid = event.get("job_id"), event.get("uid")
        with self._lock:
            self._lines.append(
                TraceLine(
                    next(self._seq),
                    line,
                    job_id if isinstance(job_id, str) else None,
                    uid if isinstance(uid, int) else None,
                )
            )
            self._bytes += len(line)
            while len(self._lines) > self._size or self._bytes > self._max_bytes:
                self._bytes -= len(self._lines.popleft().line)

    def after(self, seq: int) -> Iterator[TraceLine]:
        """Lines newer than `seq`, oldest first (a snapshot: appends meanwhile are not lost)."""
        with self._lock:
            lines = list(self._lines)
        for item in lines:
            if item.seq > seq:
                yield item

    def last_seq(self) -> int:
        lines = self._lines
        return lines[-1].seq if lines else 0


RING = TraceRing()
