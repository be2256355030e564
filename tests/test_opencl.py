"""The opencl backend through the real daemon, on PoCL (OpenCL on this host's CPU).

PoCL shows one CPU device; POCL_DEVICES="pthread pthread" makes it show two, so two opencl
workers (opencl:0, opencl:1) each hold their own device, as two GPUs would. Every daemon of
the session shares one POCL_CACHE_DIR: a kernel is built cold once (about a second), then
read from that cache.

Skipped, with the reason, where no OpenCL platform answers (CI installs PoCL: .ci/run).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taogpud.backends.opencl import probe as opencl_probe
from taogpud.client import ApiError, Client
from taogpud.testing import RunningDaemon, new_home, remove_home, start_daemon, wait_for_ready

pytestmark = pytest.mark.xdist_group("opencl")  # one worker: the daemons share the PoCL cache

HERE = opencl_probe.inventory()
requires_opencl = pytest.mark.skipif(
    not HERE.platforms, reason=f"needs an OpenCL platform (PoCL): {HERE.reason}"
)

TWO_DEVICES = {"POCL_DEVICES": "pthread pthread"}
COLD_READY_S = 300  # the session's first daemon builds every kernel: a minute at load 8 here


def opencl_settings(fraction: float = 0.5, fallback: bool = False) -> dict[str, Any]:
    return {
        "gpu": {"backend": "opencl", "memoryFraction": fraction, "allowFallbackToCpu": fallback}
    }


def opencl_config(devices: Any = (0, 1), platform_index: int = 0) -> dict[str, Any]:
    return {
        "backend": {
            "cuda": {"enabled": False},
            "opencl": {
                "enabled": True,
                "platform_index": platform_index,
                "device_index": list(devices) if isinstance(devices, tuple) else devices,
            },
        }
    }


def pocl_env(pocl_cache: Path) -> dict[str, str]:
    return {**TWO_DEVICES, "POCL_CACHE_DIR": str(pocl_cache)}


@pytest.fixture(scope="module")
def opencl_daemon(pocl_cache: Path) -> Iterator[RunningDaemon]:
    """One daemon on the default pair (both devices, half their memory each) for the tests
    that read only their own jobs; they carry `process` themselves (no fixture here says so).
    The first of the session: its kernels may be built cold, so it has longer to get ready."""
    home = new_home()
    try:
        daemon = start_daemon(home, opencl_settings(), opencl_config(), pocl_env(pocl_cache), False)
        try:
            wait_for_ready(daemon, COLD_READY_S)
            yield daemon
        finally:
            daemon.stop()
    finally:
        remove_home(home)


@pytest.fixture
def start_opencl(
    daemon_factory: Callable[..., RunningDaemon], pocl_cache: Path
) -> Iterator[Callable[..., RunningDaemon]]:
    def start(
        settings: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
    ) -> RunningDaemon:
        full_env = {**pocl_env(pocl_cache), **(env or {})}
        return daemon_factory(
            settings or opencl_settings(), config or opencl_config(), full_env, wait_ready
        )

    yield start


def taogpuctl(daemon: RunningDaemon, *args: str) -> str:
    """taogpuctl's stdout; it asks a child process about OpenCL, with the daemon's PoCL env."""
    done = daemon.ctl(*args, env=TWO_DEVICES, timeout_s=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_ok(client: Client, task: str, params: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    job = client.run(task, params, wait_s=120, **kwargs)
    assert job["status"] == "succeeded", job
    return job


def output(client: Client, job: dict[str, Any], name: str) -> np.ndarray[Any, Any]:
    array: np.ndarray[Any, Any] = np.load(io.BytesIO(client.download_output(job["id"], name)))
    return array


# ---------------------------------------------------------------------------- results


@requires_opencl
@pytest.mark.process
def test_every_kernel_equals_numpy(opencl_daemon: RunningDaemon) -> None:
    """vector_add, saxpy and sort give NumPy's exact answer on uploaded data, matmul and
    reduce_sum NumPy's to float32 rounding; each job says backend=opencl, on a CPU device."""
    daemon = opencl_daemon
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(100_003, dtype=np.float32), rng.random(100_003, dtype=np.float32)
    left, right = rng.random((67, 45), dtype=np.float32), rng.random((45, 33), dtype=np.float32)
    with daemon.client() as client:
        ids = {name: client.upload_array(x)["id"] for name, x in [("a", a), ("b", b)]}
        mats = {name: client.upload_array(x)["id"] for name, x in [("a", left), ("b", right)]}
        added = run_ok(client, "vector_add", {}, inputs=ids, keep_outputs=True)
        assert np.array_equal(output(client, added, "c"), a + b)
        saxpy = run_ok(
            client, "saxpy", {"alpha": 1.7}, inputs={"x": ids["a"], "y": ids["b"]},
            keep_outputs=True,
        )  # fmt: skip
        assert np.array_equal(output(client, saxpy, "out"), np.float32(1.7) * a + b)
        ordered = run_ok(client, "sort", {}, inputs={"x": ids["a"]}, keep_outputs=True)
        assert np.array_equal(output(client, ordered, "sorted"), np.sort(a))
        assert ordered["result"]["is_sorted"] is True
        total = run_ok(client, "reduce_sum", {}, inputs={"x": ids["a"]})["result"]["sum"]
        assert total == pytest.approx(float(a.sum()), rel=1e-4, abs=1e-2)
        product = run_ok(client, "matmul", {}, inputs=mats, keep_outputs=True)
        np.testing.assert_allclose(output(client, product, "c"), left @ right, rtol=1e-5)
    for job in (added, saxpy, ordered, product):
        assert job["backend"] == "opencl" and job["fallback"] is False
        assert job["evidence"]["device_type"] == "CPU"
        assert job["evidence"]["platform"] == "Portable Computing Language"
    traced = next(e for e in daemon.events("job.succeeded") if e["job_id"] == added["id"])
    assert traced["backend"] == "opencl" and traced["device"] == added["device"]
    assert traced["evidence"] == added["evidence"]  # type, name, vendor, platform
    assert set(traced["evidence"]) == {"device_type", "device_name", "device_vendor", "platform"}


@requires_opencl
@pytest.mark.process
def test_float64_and_generated_inputs(opencl_daemon: RunningDaemon) -> None:
    """float64 runs in double precision on the device (each job on opencl:0); generated inputs
    give finite answers, the same for the same seed; a sort with NaNs puts them last, as NumPy
    does."""
    daemon = opencl_daemon
    x = np.array([3.5, np.nan, -1.0, -0.0, np.inf, 2.0, np.nan, -np.inf], dtype=np.float64)
    with daemon.client() as client:
        ordered = run_ok(
            client, "sort", {"dtype": "float64"}, inputs={"x": client.upload_array(x)["id"]},
            keep_outputs=True, device=0,
        )  # fmt: skip
        got = output(client, ordered, "sorted")
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, np.sort(x))
        assert ordered["result"]["nan_count"] == 2 and ordered["result"]["is_sorted"] is True
        first = run_ok(client, "saxpy", {"size": 5000, "dtype": "float64", "seed": 3}, device=0)
        again = run_ok(client, "saxpy", {"size": 5000, "dtype": "float64", "seed": 3}, device=0)
        assert first["result"]["checksum"] == again["result"]["checksum"]
        assert 0 < first["result"]["checksum"] < 3 * 5000


# ---------------------------------------------------------------------------- placement, caps


@requires_opencl
def test_two_workers_placement_caps_and_refusals(
    start_opencl: Callable[..., RunningDaemon],
) -> None:
    """Two opencl workers, one per PoCL device: round robin alternates them, a probe pinned to
    each reports that device, each cap is memoryFraction × its memory, a job past the cap is
    too_large at submit, and fft (no OpenCL body) is refused, never run on the host."""
    daemon = start_opencl(settings=opencl_settings(fraction=0.25))
    with daemon.client() as client:
        devices = {d["device"]: d for d in client.devices()}
        assert sorted(devices) == ["opencl:0", "opencl:1"]
        for device in devices.values():
            assert device["backend"] == "opencl" and device["device_type"] == "CPU"
            assert device["memory_cap_bytes"] == int(device["memory_total_bytes"] * 0.25)
        placed = [run_ok(client, "noop", {})["device"] for _ in range(4)]
        assert placed == ["opencl:0", "opencl:1"] * 2
        for index in (0, 1):
            probe = run_ok(client, "probe", {}, device=index)
            assert probe["device"] == probe["result"]["device"] == f"opencl:{index}"
            assert probe["result"]["check"]["ok"] is True
        cap = devices["opencl:0"]["memory_cap_bytes"]
        with pytest.raises(ApiError) as too_large:
            client.submit("vector_add", {"size": cap // 4})  # 3 arrays of 4 bytes each
        assert too_large.value.code == "too_large"
        with pytest.raises(ApiError) as refused:
            client.submit("fft", {"size": 1024})
        assert refused.value.code == "unsupported_task"
        assert "fft has no opencl implementation" in refused.value.message
        assert "cpu, cuda" in refused.value.hint
        report = client.doctor(ping=False, probe=True, timeout_s=60)
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["opencl"]["status"] == "pass", checks["opencl"]
    assert checks["probe_job"]["status"] == "pass", checks["probe_job"]
    assert "device=opencl:1 backend=opencl" in checks["probe_job"]["detail"]
    listed = json.loads(taogpuctl(daemon, "devices", "--json"))["opencl"]
    assert listed["status"] == "ok"
    assert [d["worker"] for d in listed["platforms"][0]["devices"]] == ["opencl:0", "opencl:1"]


@requires_opencl
def test_an_allocation_past_the_cap_fails_only_that_job(
    start_opencl: Callable[..., RunningDaemon],
) -> None:
    """matmul of a (4096×1) by b (1×4096) passes admission (its estimate follows n) but needs
    64 MiB for c: with a 32 MiB cap the allocator refuses it (out_of_device_memory, with the
    numbers); the same worker, still warm, runs the next job.

    PoCL sizes its device from the host's memory at the moment it is asked, so the daemon's
    total can differ from this process's by some percent: the message is checked against the
    cap the worker reports, and the cap against the 64 MiB the job needs."""
    total = HERE.platforms[0].devices[0].global_mem_bytes
    fraction = 32 * 2**20 / total
    daemon = start_opencl(opencl_settings(fraction=fraction), opencl_config(devices=0))
    with daemon.client() as client:
        cap_bytes = client.devices()[0]["memory_cap_bytes"]
        assert 16 * 2**20 < cap_bytes < 64 * 2**20, f"the cap came out {cap_bytes} bytes"
        inputs = {
            "a": client.upload_array(np.ones((4096, 1), dtype=np.float32))["id"],
            "b": client.upload_array(np.ones((1, 4096), dtype=np.float32))["id"],
        }
        failed = client.run("matmul", {"n": 16}, inputs=inputs, wait_s=120)
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "out_of_device_memory"
        assert "64.0 MiB" in failed["error"]["message"]
        assert f"cap of {cap_bytes / 2**20:.1f} MiB" in failed["error"]["message"]
        after = run_ok(client, "vector_add", {"size": 1_000_000})
        assert after["worker_pid"] == failed["worker_pid"]
        assert client.status()["workers"][0]["restarts"] == 0


# ---------------------------------------------------------------------------- no platform


@requires_opencl
def test_no_platform_refuses_to_start(
    start_opencl: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """An empty OCL_ICD_VENDORS directory (no driver): allowFallbackToCpu false → taogpud exits
    non-zero with one line saying OpenCL cannot start, why, and the fix."""
    daemon = start_opencl(env={"OCL_ICD_VENDORS": str(tmp_path)}, wait_ready=False)
    assert daemon.proc.wait(60) != 0
    stderr = daemon.stderr()
    assert "OpenCL cannot start" in stderr
    assert "finds no platform" in stderr
    assert "allowFallbackToCpu" in stderr


@requires_opencl
def test_no_platform_falls_back_loudly_when_allowed(
    start_opencl: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """Same host, allowFallbackToCpu true: CPU workers start, status says fallback with the
    reason, and every job says backend=cpu fallback=true."""
    daemon = start_opencl(
        settings=opencl_settings(fallback=True), env={"OCL_ICD_VENDORS": str(tmp_path)}
    )
    with daemon.client() as client:
        status = client.status()
        assert status["backend"] == "cpu" and status["fallback"] is True
        assert "finds no platform" in status["fallback_reason"]
        job = run_ok(client, "vector_add", {"size": 1000})
    assert job["backend"] == "cpu" and job["fallback"] is True
    assert "finds no platform" in job["fallback_reason"]


@requires_opencl
def test_a_wrong_platform_index_says_which_exist(
    start_opencl: Callable[..., RunningDaemon],
) -> None:
    """platform_index 5 on a host with one platform: exit non-zero, naming the key and the
    platforms there are."""
    daemon = start_opencl(config=opencl_config(platform_index=5), wait_ready=False)
    assert daemon.proc.wait(60) != 0
    stderr = daemon.stderr()
    assert "backend.opencl.platform_index is 5" in stderr
    assert "0: Portable Computing Language" in stderr


@requires_opencl
def test_a_kernel_that_fails_to_build_refuses_to_start(
    start_opencl: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """A compiler that rejects every kernel (PoCL told to define __kernel away): the probe's
    test kernel fails to build, and taogpud exits with the compiler's error on one line."""
    env = {"POCL_EXTRA_BUILD_FLAGS": "-D__kernel=garbage", "POCL_CACHE_DIR": str(tmp_path)}
    daemon = start_opencl(env=env, wait_ready=False)
    assert daemon.proc.wait(60) != 0
    lines = daemon.stderr().strip().splitlines()
    assert len(lines) == 1, lines
    assert "a test kernel failed to build" in lines[0]
    assert "unknown type name 'garbage'" in lines[0]
