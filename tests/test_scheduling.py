"""Scheduling through a real daemon: caps, placement, affinity, cancel, timeouts, a full queue.

Concurrency is read from the daemon's own traces: job.running adds one, every
finished state removes one, in the order the daemon wrote them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from traces import most_running

from taogpud.client import ApiError
from taogpud.testing import DaemonHandle, InProcessDaemon

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("scheduling")


def submit_all(
    daemon: DaemonHandle, count: int, task: str, params: dict[str, Any], **kw: Any
) -> list[str]:
    with daemon.client() as client:
        return [client.submit(task, params, **kw)["id"] for _ in range(count)]


def wait_all(daemon: DaemonHandle, ids: list[str]) -> list[dict[str, Any]]:
    with daemon.client() as client:
        return [client.wait(job_id, timeout_s=60) for job_id in ids]


# --- on the module's one daemon: each test's jobs are its own (its own affinity keys too) ---


def test_affinity_key_sticks_to_its_first_device(module_inprocess_daemon: InProcessDaemon) -> None:
    """Jobs with one affinity key stay on the device the key first landed on."""
    with module_inprocess_daemon.client() as client:
        first_a = client.run("noop", affinity="A")["device"]
        first_b = client.run("noop", affinity="B")["device"]
        later = [(client.run("noop", affinity=key)["device"], key) for key in "ABAB" * 2]
    assert first_a != first_b
    assert all(device == (first_a if key == "A" else first_b) for device, key in later)


def test_pinned_device(module_inprocess_daemon: InProcessDaemon) -> None:
    """--device 1 runs on cpu:1; an unknown device is refused with the list of devices."""
    with module_inprocess_daemon.client() as client:
        assert client.run("noop", device=1)["device"] == "cpu:1"
        with pytest.raises(ApiError) as refused:
            client.submit("noop", device=7)
    assert refused.value.code == "invalid_request"
    assert "devices: 0, 1" in refused.value.hint


def test_a_requested_device_wins_over_the_affinity_key(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    """A job that names a device runs there, even when its affinity key landed elsewhere."""
    with module_inprocess_daemon.client() as client:
        first = client.run("noop", affinity="K")["device_index"]
        other = 1 - first
        moved = client.run("noop", affinity="K", device=other)
        again = client.run("noop", affinity="K")
    assert moved["device_index"] == other
    assert again["device_index"] == first  # the key stays where it first landed


def test_cancel_running_job_stops_it(module_inprocess_daemon: InProcessDaemon) -> None:
    """A running sleep of 60 s is cancelled at once; its slot is free for the next job."""
    with module_inprocess_daemon.client() as client:
        job = client.submit("sleep", {"ms": 60_000}, device=0)
        module_inprocess_daemon.wait_running(job["id"])
        cancelled = client.cancel(job["id"])
        after = client.run("noop", device=0)
    assert cancelled["status"] == "cancelled"
    assert cancelled["run_ms"] < 60_000
    assert after["status"] == "succeeded"


def test_timeout_ends_a_long_job(module_inprocess_daemon: InProcessDaemon) -> None:
    """A job past its timeout_s ends timed_out with a clear error."""
    with module_inprocess_daemon.client() as client:
        job = client.run("sleep", {"ms": 60_000}, timeout_s=0.3)
    assert job["status"] == "timed_out"
    assert job["error"]["code"] == "timed_out"
    assert "0.3" in job["error"]["message"]


# --- on a daemon of their own: a config of their own, or the daemon's whole state read ------
# (round robin from its first device, every job.succeeded line, the most running at once)


def test_cap_of_three_holds_for_twenty_sleep_jobs(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """With max_concurrent_tasks=3 and 4 slots, 20 sleep jobs never run more than 3 at once."""
    daemon = inprocess_factory(config={"scheduling": {"max_concurrent_tasks": 3}})
    ids = submit_all(daemon, 20, "sleep", {"ms": 60})
    jobs = wait_all(daemon, ids)
    assert [j["status"] for j in jobs] == ["succeeded"] * 20
    assert most_running(daemon.events()) == 3
    with daemon.client() as client:
        assert client.status()["max_concurrent_tasks"] == 3


def test_stream_count_caps_each_device(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """One device with stream_count=2 never runs more than 2 jobs, even under a cap of 8."""
    daemon = inprocess_factory(config={"runtime": {"cpu_devices": 1}})
    ids = submit_all(daemon, 8, "sleep", {"ms": 60})
    assert {j["status"] for j in wait_all(daemon, ids)} == {"succeeded"}
    assert most_running(daemon.events()) == 2


def test_round_robin_alternates_devices(inprocess_daemon: InProcessDaemon) -> None:
    """round_robin sends one job after another to cpu:0, cpu:1, cpu:0, ..."""
    with inprocess_daemon.client() as client:
        devices = [client.run("noop")["device"] for _ in range(6)]
    assert devices == ["cpu:0", "cpu:1"] * 3


def test_least_loaded_reuses_the_idle_first_device(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """least_loaded keeps sequential jobs on the first idle device instead of rotating."""
    daemon = inprocess_factory(config={"scheduling": {"strategy": "least_loaded"}})
    with daemon.client() as client:
        devices = {client.run("noop")["device"] for _ in range(4)}
        busy = client.submit("sleep", {"ms": 2000})
        other = client.run("noop")
        client.cancel(busy["id"])
    assert devices == {"cpu:0"}
    assert other["device"] == "cpu:1"


def test_affinity_waits_for_its_device_rather_than_moving(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """A key whose device is full waits for it even when another device is idle."""
    daemon = inprocess_factory(config={"backend": {"cuda": {"stream_count": 1}}})
    with daemon.client() as client:
        first = client.submit("sleep", {"ms": 300}, affinity="K")
        second = client.run("noop", affinity="K")
        first = client.wait(first["id"])
    assert second["device"] == first["device"]
    assert second["queue_ms"] > 100


def test_priority_runs_first(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """With one slot busy, a high-priority job queued last starts before earlier ones."""
    daemon = inprocess_factory(
        config={"runtime": {"cpu_devices": 1}, "backend": {"cuda": {"stream_count": 1}}}
    )
    with daemon.client() as client:
        blocker = client.submit("sleep", {"ms": 300})
        low = [client.submit("noop")["id"] for _ in range(3)]
        high = client.submit("noop", priority=10)["id"]
        wait_all(daemon, [blocker["id"], *low, high])
    started = [e["job_id"] for e in daemon.events("job.running")]
    assert started.index(high) < min(started.index(job_id) for job_id in low)


def test_cancel_queued_job_never_runs(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """A queued job that is cancelled ends cancelled and never reaches a worker."""
    daemon = inprocess_factory(config={"scheduling": {"max_concurrent_tasks": 1}})
    with daemon.client() as client:
        blocker = client.submit("sleep", {"ms": 1000})
        queued = client.submit("noop")
        cancelled = client.cancel(queued["id"])
        client.cancel(blocker["id"])
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"]["code"] == "cancelled"
    assert queued["id"] not in [e["job_id"] for e in daemon.events("job.running")]


def test_full_queue_answers_queue_full(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """Past queue_limit a submit is refused with 429 queue_full, and the queued jobs still run."""
    daemon = inprocess_factory(config={"scheduling": {"max_concurrent_tasks": 1, "queue_limit": 2}})
    with daemon.client() as client:
        blocker = client.submit("sleep", {"ms": 300})
        queued = [client.submit("noop")["id"] for _ in range(2)]
        with pytest.raises(ApiError) as refused:
            client.submit("noop")
        finished = wait_all(daemon, [blocker["id"], *queued])
    assert refused.value.http_status == 429
    assert refused.value.code == "queue_full"
    assert "queue_limit" in refused.value.hint
    assert {j["status"] for j in finished} == {"succeeded"}


def test_many_clients_at_once_lose_nothing(inprocess_daemon: InProcessDaemon) -> None:
    """8 threads submitting 25 jobs each: all 200 succeed and each is traced once as succeeded."""
    results: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        with inprocess_daemon.client() as client:
            statuses = [client.run("noop")["status"] for _ in range(25)]
        with lock:
            results.extend(statuses)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == ["succeeded"] * 200
    assert len(inprocess_daemon.events("job.succeeded")) == 200


def test_respawn_backoff_doubles_in_a_row_and_restarts_after_a_healthy_spell() -> None:
    """1, 2, 4 … 60 s for a crash loop; a worker warm for STREAK_RESET_S starts at 1 s again,
    while `restarts` keeps counting every respawn for status."""
    from types import SimpleNamespace

    from taogpud.pool import supervisor

    worker = SimpleNamespace(restarts=0, crash_streak=0, warm_at=None)
    delays = [supervisor.next_respawn_delay(worker) for _ in range(8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    worker.warm_at = time.monotonic() - 10  # warm again, briefly: still a loop
    assert supervisor.next_respawn_delay(worker) == 60.0
    worker.warm_at = time.monotonic() - supervisor.STREAK_RESET_S - 1
    assert supervisor.next_respawn_delay(worker) == 1.0
    assert worker.restarts == 10
