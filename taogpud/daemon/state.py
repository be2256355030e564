"""What the daemon holds while it runs, handed to the API handlers as one object."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from taogpud.arrays import ArrayStore
from taogpud.config import ConfigSnapshot
from taogpud.pool.interface import Pool
from taogpud.scheduler import Scheduler
from taogpud.store import JobStore
from taogpud.wire import ReloadView


@dataclass
class DaemonState:
    snapshot: ConfigSnapshot
    scheduler: Scheduler
    store: JobStore
    arrays: ArrayStore
    pool: Pool
    backend: str  # what the workers really run: "cuda" | "cpu"
    fallback_reason: str | None  # set when cpu workers stand in for cuda
    phase: str = "starting"  # starting | ready | draining
    generation: int = 1
    last_reload: ReloadView = field(default_factory=lambda: ReloadView(ok=True))
    started_at: float = field(default_factory=time.time)
    max_json_bytes: int = 1 << 20
    max_upload_bytes: int = 1 << 32
    reload: Callable[[str], Awaitable[ReloadView]] | None = None  # set once reload can run
    waits: set[asyncio.Timeout] = field(default_factory=set)  # requests waiting on a job

    @property
    def fallback(self) -> bool:
        return self.fallback_reason is not None

    def status_line(self) -> str:
        """One ASCII-friendly line for systemd's STATUS= and `systemctl status`."""
        warm = len(self.pool.healthy)
        fallback = " FALLBACK-TO-CPU" if self.fallback else ""
        reload_failed = (
            "" if self.last_reload.ok else ", last reload FAILED (taogpuctl config status)"
        )
        devices = " ".join(w.label for w in self.pool.workers)
        draining = "draining, " if self.phase == "draining" else ""
        problem = self.pool.problem()
        reload_failed += f", {self.pool.executor} executor: {problem}" if problem else ""
        return (
            f"{draining}{self.backend}{fallback}: workers {warm}/{len(self.pool.workers)} warm "
            f"({devices}), "
            f"running {self.scheduler.running_total}, queued {self.scheduler.queued}, "
            f"config generation {self.generation}{reload_failed}"
        )
