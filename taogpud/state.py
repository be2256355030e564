"""What the daemon holds while it runs, handed to the API handlers as one object."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from taogpud.api.models import ReloadView
from taogpud.arrays import ArrayStore
from taogpud.config import ConfigSnapshot
from taogpud.jobs import JobStore
from taogpud.pool.supervisor import WorkerPool
from taogpud.scheduler import Scheduler


@dataclass
class DaemonState:
    snapshot: ConfigSnapshot
    scheduler: Scheduler
    store: JobStore
    arrays: ArrayStore
    pool: WorkerPool
    backend: str  # what the workers really run: "cuda" | "cpu"
    fallback_reason: str | None  # set when cpu workers stand in for cuda
    phase: str = "starting"  # starting | ready | draining
    generation: int = 1
    last_reload: ReloadView = field(default_factory=lambda: ReloadView(ok=True))
    started_at: float = field(default_factory=time.time)
    max_json_bytes: int = 1 << 20
    max_upload_bytes: int = 1 << 32

    @property
    def fallback(self) -> bool:
        return self.fallback_reason is not None
