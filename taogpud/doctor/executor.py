"""The doctor's `executor` check: with executor "ray", the cluster answers and every actor is
warm (on which nodes). The local executor adds no check: its workers are the probe's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taogpud.doctor import Check

if TYPE_CHECKING:
    from taogpud.pool.interface import Pool

HINT = (
    "run `ray status` on the head node; check that the GPU nodes are up and have taogpud "
    "installed (same version); `journalctl -u taogpud` has worker.lost and ray.cluster lines"
)


def executor_checks(pool: Pool) -> list[Check]:
    if pool.executor != "ray":
        return []
    cluster: dict[str, Any] = getattr(pool, "cluster_view", dict)()
    where = f"Ray at {cluster.get('address')!r} (namespace {cluster.get('namespace')!r})"
    warm = [w for w in pool.workers if w.state.value == "warm"]
    problem = pool.problem()
    if problem or len(warm) < len(pool.workers):
        down = [f"{w.label} {w.state.value}" for w in pool.workers if w not in warm]
        detail = f"{where}: {len(warm)}/{len(pool.workers)} actors warm"
        detail += f" ({', '.join(down)})" if down else ""
        return [Check("executor", "fail", f"{detail}: {problem or 'being replaced'}", HINT)]
    nodes = sorted({str(w.info.extra.get("hostname")) for w in warm if w.info is not None})
    return [
        Check(
            "executor",
            "pass",
            f"{where}: {len(warm)}/{len(pool.workers)} actors warm on {', '.join(nodes)}; "
            f"{cluster.get('nodes_alive', '?')} nodes alive",
        )
    ]
