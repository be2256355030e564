"""Where the warm workers live: `local` (spawned processes here) or `ray` (Ray actors).

Ray is imported only when scheduling.executor = "ray".
"""

from __future__ import annotations

from taogpud.backends.base import WorkerSpec
from taogpud.config import ConfigSnapshot
from taogpud.pool.interface import Pool
from taogpud.pool.supervisor import WorkerPool


def create_pool(snapshot: ConfigSnapshot, specs: list[WorkerSpec]) -> Pool:
    """The pool, not started: `Pool.start(sink, ...)` spawns its workers and names who hears
    from them, so the pool can be built before the scheduler that it reports to."""
    if snapshot.config.scheduling.executor == "ray":
        from taogpud.pool.ray_pool import RayWorkerPool

        return RayWorkerPool(specs, snapshot.config.ray)
    return WorkerPool(specs)
