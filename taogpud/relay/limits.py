"""Per-user limits of the relay (config.toml [relay.limits]); each one optional.

    concurrent       requests in flight at once
    per_minute       requests started within the last 60 s (a sliding window)
    tokens_per_day   tokens the provider reported for the user since 00:00 UTC

Over a limit the relay answers 429 with Retry-After and a message naming the limit; the
request is not forwarded. Tokens are known only once an answer ends, so a request that
starts under the day's budget may finish above it: the next one is refused.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from taogpud.config import RelayLimits

MINUTE_S = 60.0
DAY_S = 86400.0


@dataclass(frozen=True)
class OverLimit:
    """Which limit refused a request, in words, and when to try again."""

    limit: str  # "concurrent" | "per_minute" | "tokens_per_day"
    message: str
    retry_after_s: int


@dataclass
class _User:
    in_flight: int = 0
    started: deque[float] = field(default_factory=deque)  # monotonic starts, last minute
    day: int = -1  # days since the epoch (UTC) that `tokens` counts
    tokens: int = 0


class Limiter:
    def __init__(self) -> None:
        self._users: dict[int | None, _User] = {}

    def admit(self, uid: int | None, limits: RelayLimits) -> OverLimit | None:
        """Take a slot for one request, or say which limit refuses it. Call `release` after."""
        user = self._users.setdefault(uid, _User())
        now = time.monotonic()
        while user.started and now - user.started[0] >= MINUTE_S:
            user.started.popleft()
        refused = self._refusal(user, limits, now)
        if refused is None:
            user.in_flight += 1
            user.started.append(now)
        return refused

    def release(self, uid: int | None) -> None:
        user = self._users.get(uid)
        if user is not None:
            user.in_flight = max(0, user.in_flight - 1)

    def add_tokens(self, uid: int | None, tokens: int) -> None:
        user = self._users.setdefault(uid, _User())
        today = _today()
        if user.day != today:
            user.day, user.tokens = today, 0
        user.tokens += tokens

    def _refusal(self, user: _User, limits: RelayLimits, now: float) -> OverLimit | None:
        if limits.concurrent is not None and user.in_flight >= limits.concurrent:
            return OverLimit(
                "concurrent",
                f"relay limit concurrent={limits.concurrent}: that many of your requests are "
                "in flight already",
                1,
            )
        if limits.per_minute is not None and len(user.started) >= limits.per_minute:
            wait_s = math.ceil(MINUTE_S - (now - user.started[0]))
            return OverLimit(
                "per_minute",
                f"relay limit per_minute={limits.per_minute}: you started that many requests "
                "in the last 60 s",
                max(1, wait_s),
            )
        return self._over_budget(user, limits)

    def tokens_over(self, uid: int | None, limits: RelayLimits) -> OverLimit | None:
        """The day's token budget alone: checked again at each message of a WebSocket session,
        which counts as one request however many turns it holds."""
        return self._over_budget(self._users.setdefault(uid, _User()), limits)

    def _over_budget(self, user: _User, limits: RelayLimits) -> OverLimit | None:
        budget = limits.tokens_per_day
        if budget is not None and user.day == _today() and user.tokens >= budget:
            return OverLimit(
                "tokens_per_day",
                f"relay limit tokens_per_day={budget}: you used {user.tokens} tokens today (UTC)",
                math.ceil(DAY_S - time.time() % DAY_S),
            )
        return None


def _today() -> int:
    return int(time.time() // DAY_S)
