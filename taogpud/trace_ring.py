"""The last trace lines, kept in memory so that clients can read them through the API.

`taogpuctl trace --grep backend` and `taogpuctl logs ID -f` read the daemon's own JSON lines
(the ones stdout and journald get, after redaction) from here, instead of searching the
daemon's stdout. logging.render() appends every line; the API filters and follows it.

A leaf: nothing here knows the API or the scheduler. Appends come from any thread; a deque's
append and a counter's next are atomic under the GIL, so no lock is taken on the log path.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

RING_LINES = 20_000  # ~300 bytes a line: a few MiB at most


@dataclass(frozen=True, slots=True)
class TraceLine:
    seq: int  # increases by one per line: a follower asks for lines after the last it saw
    line: bytes  # the JSON line as written, without its newline
    job_id: str | None
    uid: int | None  # whose job or request the line is about; None: the daemon's own


class TraceRing:
    def __init__(self, size: int = RING_LINES) -> None:
        self._lines: deque[TraceLine] = deque(maxlen=size)
        self._seq = itertools.count(1)

    def append(self, line: bytes, event: Mapping[str, Any]) -> None:
        job_id, uid = event.get("job_id"), event.get("uid")
        self._lines.append(
            TraceLine(
                next(self._seq),
                line,
                job_id if isinstance(job_id, str) else None,
                uid if isinstance(uid, int) else None,
            )
        )

    def after(self, seq: int) -> Iterator[TraceLine]:
        """Lines newer than `seq`, oldest first (a snapshot: appends meanwhile are not lost)."""
        for item in list(self._lines):
            if item.seq > seq:
                yield item

    def last_seq(self) -> int:
        lines = self._lines
        return lines[-1].seq if lines else 0


RING = TraceRing()
