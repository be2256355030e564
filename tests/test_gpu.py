"""The CUDA path on a real GPU: results against NumPy, the user kernel, two slots overlapping,
the pool cap in every slot thread, out-of-memory and recovery, a sticky error and the respawn,
the NVML evidence and the CUDA-event timings. Skipped without a GPU (`make test-gpu`,
`make gpu-check` run them).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec
from taogpud.backends.cuda.backend import probe_cuda
from taogpud.backends.cuda.samples import ILLEGAL_ADDRESS, SAXPY, SPIN
from taogpud.pool import protocol as msg
from taogpud.pool.execute import execute
from taogpud.tasks.warmup import backend_for, warm
from taogpud.testing import wait_for_ready, wait_until

CUDA_PROBLEM = probe_cuda([0])
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),  # a first warm-up on an empty kernel cache takes minutes
    pytest.mark.skipif(CUDA_PROBLEM is not None, reason=f"needs a GPU: {CUDA_PROBLEM}"),
]

CUDA_SETTINGS = {"gpu": {"backend": "cuda", "memoryFraction": 0.5}}
CUDA_CONFIG = {
    "runtime": {"device_type": "gpu", "enable_profiling": True},
    "backend": {
        "cuda": {
            "enabled": True,
            "cuda_arch": "auto",
            "stream_count": 2,
            "allow_user_kernels": True,
        }
    },
    "memory": {"pool_size_mb": 256},
}
Factory = Callable[..., Any]


WARM_TIMEOUT_S = 300  # a first start on an empty kernel cache compiles every built-in


def cuda_daemon(daemon_factory: Factory) -> Any:
    """A ready cuda daemon; it may take minutes to warm where the kernel cache is empty."""
    daemon = daemon_factory(CUDA_SETTINGS, CUDA_CONFIG, wait_ready=False)
    wait_for_ready(daemon, WARM_TIMEOUT_S)
    return daemon


def test_vector_add_on_the_gpu_matches_numpy_with_evidence_and_timings(
    daemon_factory: Factory,
) -> None:
    """Uploaded a, b: c == a + b; the record says cuda, NVML's evidence and event timings."""
    rng = np.random.default_rng(1)
    a, b = rng.random(1_000_000, dtype=np.float32), rng.random(1_000_000, dtype=np.float32)
    with cuda_daemon(daemon_factory).client() as client:
        inputs = {"a": client.upload_array(a)["id"], "b": client.upload_array(b)["id"]}
        job = client.run("vector_add", {}, inputs=inputs, keep_outputs=True, wait_s=120)
        c = np.load(io.BytesIO(client.download_output(job["id"], "c")))
    assert job["status"] == "succeeded", job["error"]
    assert (job["backend"], job["device"], job["fallback"]) == ("cuda", "gpu:0", False)
    np.testing.assert_array_equal(c, a + b)
    evidence = job["evidence"]
    assert evidence["verdict"] in {"confirmed", "pid_not_seen"}, evidence
    assert evidence["gpu_uuid"] == job["device_uuid"] and evidence["uuid_matches_cuda"]
    assert evidence["utilization_samples"] >= 1
    assert {"h2d_ms", "kernel_ms", "d2h_ms"} <= set(job["timings"])


def test_a_user_kernel_builds_for_the_card_and_matches_numpy(daemon_factory: Factory) -> None:
    """The saxpy sample through the kernel task: out == 2x + y, built for the card's arch."""
    n = 100_000
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    params = {
        "source": SAXPY,
        "name": "saxpy",
        "grid": [(n + 255) // 256],
        "block": [256],
        "args": [
            {"input": "x0"},
            {"input": "x1"},
            {"output": "out", "shape": [n]},
            {"scalar": 2.0},
            {"scalar": n, "dtype": "int32"},
        ],
    }
    with cuda_daemon(daemon_factory).client() as client:
        inputs = {"x0": client.upload_array(x)["id"], "x1": client.upload_array(y)["id"]}
        job = client.run("kernel", params, inputs=inputs, keep_outputs=True, wait_s=120)
        out = np.load(io.BytesIO(client.download_output(job["id"], "out")))
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["arch"].startswith("sm_")
    np.testing.assert_array_equal(out, 2 * x + y)


def test_two_slots_run_two_jobs_at_once(daemon_factory: Factory) -> None:
    """Two spin kernels of ~1 s on stream_count=2: on the GPU's own clock, they overlap."""
    params = {
        "source": SPIN,
        "name": "spin",
        "grid": [1],
        "block": [32],
        "args": [
            {"scalar": 2_000_000_000, "dtype": "int64"},
            {"output": "when", "shape": [2], "dtype": "int64"},
        ],
    }
    with cuda_daemon(daemon_factory).client() as client:
        ids = [client.submit("kernel", params, keep_outputs=True)["id"] for _ in range(2)]
        jobs = [client.wait(job_id, timeout_s=120) for job_id in ids]
        assert all(job["status"] == "succeeded" for job in jobs), jobs
        spans = [np.load(io.BytesIO(client.download_output(i, "when"))) for i in ids]
    assert {job["device"] for job in jobs} == {"gpu:0"}
    assert max(span[0] for span in spans) < min(span[1] for span in spans), spans


def test_a_sticky_error_fails_its_job_and_the_worker_comes_back_warm(
    daemon_factory: Factory,
) -> None:
    """An illegal address: that job is cuda_sticky_error, a new worker warms, jobs run again."""
    params = {
        "source": ILLEGAL_ADDRESS,
        "name": "illegal_address",
        "grid": [1],
        "block": [1],
        "args": [{"output": "o", "shape": [1]}],
    }
    daemon = cuda_daemon(daemon_factory)
    with daemon.client() as client:
        before = client.status()["workers"][0]["pid"]
        job = client.run("kernel", params, wait_s=120)
        assert job["status"] == "failed"
        assert job["error"]["code"] == "cuda_sticky_error", job["error"]

        def back() -> bool:
            worker = client.status()["workers"][0]
            return bool(worker["state"] == "warm" and worker["pid"] != before)

        wait_until(back, "a new warm worker", timeout_s=180, poll_s=0.1)
        after = client.run("vector_add", {"size": 1000}, wait_s=120)
    assert after["status"] == "succeeded" and after["worker_pid"] != before


# ---------------------------------------------------------------------------- in-process worker


@pytest.fixture(scope="module")
def small_gpu() -> Iterator[tuple[Backend, DeviceInfo]]:
    """A cuda backend in this process with a 1 % cap: the worker's own code, no daemon."""
    spec = WorkerSpec("cuda", 0, 2, 1, 0.01, 0, True, "auto", True)
    backend = backend_for(spec)
    yield backend, warm(backend)


def test_the_pool_cap_is_set_in_every_slot_thread(small_gpu: tuple[Backend, DeviceInfo]) -> None:
    """Each slot thread reads the cap as its pool limit (a limit set elsewhere reads 0)."""
    backend, info = small_gpu
    limits: list[int] = []

    def read(slot: int) -> None:
        with backend.slot(slot):
            limits.append(int(backend.xp.get_default_memory_pool().get_limit()))

    threads = [threading.Thread(target=read, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert limits == [info.memory_cap_bytes] * 2


def test_out_of_memory_at_the_cap_fails_the_job_and_the_next_one_runs(
    small_gpu: tuple[Backend, DeviceInfo],
) -> None:
    """A job over the cap is out_of_device_memory naming the cap; the next job succeeds."""
    backend, info = small_gpu
    too_big = msg.RunJob("big", "vector_add", {"size": info.memory_cap_bytes // 4}, {}, None)
    failed = execute(backend, info, too_big, threading.Event(), 0)
    assert failed.error is not None and failed.error[0] == "out_of_device_memory", failed
    assert "cap" in failed.error[1]
    small = msg.RunJob("small", "vector_add", {"size": 1000}, {}, None)
    assert execute(backend, info, small, threading.Event(), 0).status == "succeeded"
