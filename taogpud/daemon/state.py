"""What the daemon holds while it runs, handed to the API handlers as one object.

    DaemonState    frozen: the services, built once at start in the order they depend on
                   each other (store → arrays → pool → scheduler → reloader), and the limits
    DaemonStatus   mutable, small: the lifecycle's phase, the config in force and its
                   generation, the last reload's report, what the workers really run

A handler reads `state.scheduler` or `state.status.phase`; nothing assigns a service after
start, and only the lifecycle (the phase) and the reloader (everything else in the status)
write the status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum

from taogpud.arrayfiles.store import ArrayStore
from taogpud.config import ConfigSnapshot
from taogpud.doors import Doors
from taogpud.jobs.scheduler import Scheduler
from taogpud.jobs.store import JobStore
from taogpud.pool.interface import Pool
from taogpud.wire import ReloadView


class Phase(StrEnum):
    """Where the daemon is in its life (daemon/lifecycle.py), as /v1/health reports it."""

    starting = "starting"  # bound, the workers warm, the store is read back; not ready yet
    ready = "ready"  # serving: jobs are taken and a reload may run
    draining = "draining"  # a stop was asked: no new jobs, running ones finish within the drain
    stopping = "stopping"  # the drain is over: the server closes, the workers stop


@dataclass
class DaemonStatus:
    """What changes while the daemon runs.

    The config snapshot is here, not among the frozen services: a reload swaps it, and the
    generation (and, when workers roll, the backend) with it, in one step that nothing reads
    halfway (the loop runs one callback at a time). Readers take `status.snapshot` when they
    need it rather than keeping it, so each request sees the config in force."""

    snapshot: ConfigSnapshot
    backend: str  # what the workers really run: "cuda" | "cpu" | "opencl"
    fallback_reason: str | None  # set when cpu workers stand in for cuda
    phase: Phase = Phase.starting
    generation: int = 1
    last_reload: ReloadView = field(default_factory=lambda: ReloadView(ok=True))

    @property
    def fallback(self) -> bool:
        return self.fallback_reason is not None


@dataclass(frozen=True)
class Limits:
    """Request body caps (api/edge.py): JSON bodies, and uploads (the array store's budget)."""

    max_json_bytes: int = 1 << 20
    max_upload_bytes: int = 1 << 32


Reload = Callable[[str], Awaitable[ReloadView]]  # the reloader's entry, by trigger name


@dataclass(frozen=True)
class DaemonState:
    status: DaemonStatus
    store: JobStore
    arrays: ArrayStore
    pool: Pool
    scheduler: Scheduler
    reload: Reload
    doors: Doors  # every listener, and the connection policy they share (taogpud/doors)
    limits: Limits = Limits()
    started_at: float = field(default_factory=time.time)
    # Requests waiting on a job (api/jobs.py): a registry the set itself, never replaced;
    # the drain ends each wait with the job as it is.
    waits: set[asyncio.Timeout] = field(default_factory=set)

    def status_line(self) -> str:
        return status_line(self.status, self.pool, self.scheduler)


def status_line(status: DaemonStatus, pool: Pool, scheduler: Scheduler) -> str:
    """One ASCII-friendly line for systemd's STATUS= and `systemctl status`."""
    warm = len(pool.healthy)
    fallback = " FALLBACK-TO-CPU" if status.fallback else ""
    reload_failed = (
        "" if status.last_reload.ok else ", last reload FAILED (taogpuctl config status)"
    )
    devices = " ".join(w.label for w in pool.workers)
    stopping = status.phase in (Phase.draining, Phase.stopping)
    draining = f"{status.phase.value}, " if stopping else ""
    problem = pool.problem()
    reload_failed += f", {pool.executor} executor: {problem}" if problem else ""
    return (
        f"{draining}{status.backend}{fallback}: workers {warm}/{len(pool.workers)} warm "
        f"({devices}), "
        f"running {scheduler.running_total}, queued {scheduler.queued}, "
        f"config generation {status.generation}{reload_failed}"
    )
