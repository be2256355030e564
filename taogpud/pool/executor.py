"""Where the warm workers live: `local` (spawned processes here) or `ray` (Ray actors).

Ray is imported only when scheduling.executor = "ray".
"""

from __future__ import annotations

from taogpud.backends.base import WorkerSpec
from taogpud.config import ConfigSnapshot
from taogpud.pool.interface import Pool, PoolSink
from taogpud.pool.supervisor import WorkerPool


def create_pool(snapshot: ConfigSnapshot, specs: list[WorkerSpec], sink: PoolSink) -> Pool:
    if snapshot.config.scheduling.executor == "ray":
        from taogpud.pool.ray_pool import RayWorkerPool

        return RayWorkerPool(specs, sink, snapshot.config.ray)
    return WorkerPool(specs, sink)
