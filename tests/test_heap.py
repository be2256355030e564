"""What start-up made is frozen out of the cyclic collector's scans: in the daemon once it is
ready, in each worker once it is warm (taogpud/daemon/lifecycle.py, taogpud/pool/child.py).

A full collection walks every object the collector tracks. The daemon's imports and its app
alone are about 85,000, alive as long as the process; walking them took 57 ms on the 2-core
test host, a pause that every job in flight waited through, every few thousand jobs. How
long the pauses were is the bench's to say (docs/performance.md); here, that the freeze
happened, in every process that serves jobs.
"""

from __future__ import annotations

from taogpud.testing import RunningDaemon

# The daemon imports FastAPI, Starlette, uvicorn and pydantic, a worker numpy and the task
# registry: each leaves far more tracked objects than this behind.
AT_LEAST_FROZEN = 10_000


def test_the_daemon_freezes_what_start_up_made_once_ready(daemon: RunningDaemon) -> None:
    ready = daemon.events("daemon.ready")
    assert len(ready) == 1
    assert ready[0]["frozen_objects"] >= AT_LEAST_FROZEN


def test_each_worker_freezes_what_its_warm_up_made(daemon: RunningDaemon) -> None:
    warm = daemon.events("worker.warm")
    assert sorted(line["device"] for line in warm) == ["cpu:0", "cpu:1"]
    assert all(line["frozen_objects"] >= AT_LEAST_FROZEN for line in warm), warm
