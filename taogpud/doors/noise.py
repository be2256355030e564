"""What may come in floods, logged as summaries: at most one line per kind per interval.

A refused connection, a head that never ended, a request without a relay token: each is
cheap for whoever sends it, and one log line each would let anyone fill the journal (and trip
journald's rate limit, which then drops the daemon's own job lines) and the trace ring. The
first of a kind is logged at once; the rest within NOISE_EVERY_S are counted and said in one
line at the end of the interval (`count`: how many that line stands for). The kind's fields
never carry a request's path or User-Agent: the log is readable by every member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from taogpud.observability.logging import get_logger

log = get_logger("taogpud.doors")

NOISE_EVERY_S = 10.0

Kind = tuple[str, tuple[tuple[str, Hashable], ...]]


class Noise:
    """Counts by kind (an event and the fields that tell its kinds apart)."""

    def __init__(self, every_s: float = NOISE_EVERY_S) -> None:
        self.every_s = every_s
        self._counted: dict[Kind, int] = {}  # kinds in their quiet interval → unsaid count
        self.totals: dict[str, int] = {}  # by event, since the start

    def note(self, level: str, event: str, **kind_fields: Hashable) -> None:
        """One occurrence: logged now, or counted into the kind's next summary line."""
        self.totals[event] = self.totals.get(event, 0) + 1
        kind: Kind = (event, tuple(sorted(kind_fields.items())))
        if kind in self._counted:
            self._counted[kind] += 1
            return
        self._say(level, kind, 1)
        self._counted[kind] = 0
        self._later(level, kind)

    def _later(self, level: str, kind: Kind) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test): nothing is held back
            self._counted.pop(kind, None)
            return
        loop.call_later(self.every_s, self._summarise, level, kind)

    def _summarise(self, level: str, kind: Kind) -> None:
        count = self._counted.pop(kind, 0)
        if count:  # the interval saw more: said now, and the kind stays quiet one more
            self._say(level, kind, count)
            self._counted[kind] = 0
            self._later(level, kind)

    def _say(self, level: str, kind: Kind, count: int) -> None:
        event, fields = kind
        extra: dict[str, Any] = dict(fields)
        getattr(log, level)(event, count=count, interval_s=self.every_s, **extra)
