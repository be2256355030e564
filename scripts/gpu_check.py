"""The GPU check (`make gpu-check`): the CUDA backend measured on a real GPU, in one run.

Writes bench/results/gpu-check.md (read by the bench report, bench/gpu.py) and
bench/results/gpu-check-numbers.json, and copies both to $OUT when that is set. Every check
runs in its own try: a failing one is reported with its error and the others still run.

    warm-up          first start on an empty kernel cache, then a restart warm from disk
    bandwidth        vector_add of 1e8 float32 through the daemon vs the device's D2D copy
    matmul_overhead  8192×8192 matmul through the daemon vs the same task body in-process
    warm_vs_cold     submit → result of a 1e3 vector_add vs `python -c "import cupy; ..."`
    oom              a job over the pool cap, then the next job (the worker's own code)
    sticky_error     an illegal address from a user kernel; the worker's respawn
    evidence         a job's NVML evidence beside `nvidia-smi --query-compute-apps`
    pytest_gpu       `pytest -m gpu` over the test files that hold gpu tests

Targets (DESIGN §10, as ratios): vector_add ≥ 85 % of copy bandwidth; matmul overhead ≤ 3 %;
warm ≥ 100× faster than cold. Runs in about 3–5 minutes; nothing here needs the network.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "tests"))

from conftest import RunningDaemon, start_daemon  # noqa: E402

from taogpud.cuda_samples import ILLEGAL_ADDRESS  # noqa: E402

RESULTS = REPO / "bench" / "results"
GPU_SETTINGS: dict[str, Any] = {"gpu": {"backend": "cuda", "memoryFraction": 0.9}}
GPU_CONFIG: dict[str, Any] = {
    "runtime": {"device_type": "gpu", "enable_profiling": True, "thread_num": 4},
    "backend": {
        "cuda": {
            "enabled": True,
            "cuda_arch": "auto",
            "stream_count": 2,
            "allow_user_kernels": True,
        }
    },
    "memory": {"pool_size_mb": 1024},
    "scheduling": {"max_concurrent_tasks": 8},
}
BIG_N = 100_000_000
WARM_TIMEOUT_S = 300  # the daemon's own limit for warm-up (daemon.py)
MATMUL_N = 8192
COLD_COMMAND = "import cupy; a = cupy.arange(1000, dtype=cupy.float32); print(float((a + a).sum()))"
TARGETS = {"bandwidth": 0.85, "matmul_overhead": 0.03, "warm_vs_cold": 100.0}


class Check:
    """One check's outcome: its numbers, and its error if it failed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ok = False
        self.seconds = 0.0
        self.numbers: dict[str, Any] = {}
        self.error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "numbers": self.numbers,
            "error": self.error,
        }


class GpuCheck:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.checks: list[Check] = []
        self.daemon: RunningDaemon | None = None
        self.jobs: dict[str, Any] = {}  # jobs kept for later checks (the evidence)

    def run(self, name: str, body: Callable[[Check], None]) -> None:
        check = Check(name)
        started = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            body(check)
            check.ok = True
        except Exception as exc:
            check.error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        check.seconds = time.monotonic() - started
        print(f"   {'ok' if check.ok else 'FAILED'} in {check.seconds:.1f} s: {check.numbers}")
        self.checks.append(check)

    def client(self) -> Any:
        if self.daemon is None:
            raise RuntimeError("no daemon is running (the warm-up check failed)")
        return self.daemon.client(timeout_s=600)

    # -- the checks ----------------------------------------------------------------------

    def environment(self, check: Check) -> None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        check.numbers.update(
            {
                "python": platform.python_version(),
                "cupy": cupy.__version__,
                "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
                "device": props["name"].decode(errors="replace"),
                "compute_capability": f"{props['major']}.{props['minor']}",
                "nvidia_smi": _run(["nvidia-smi", "-L"]),
            }
        )

    def warm_up(self, check: Check) -> None:
        cold_s, cold = self._start()
        check.numbers["first_start_s"] = round(cold_s, 2)
        check.numbers["first_warmup_ms"] = _warmup_ms(cold)
        cold.stop()
        warm_s, self.daemon = self._start()
        check.numbers["restart_s"] = round(warm_s, 2)
        check.numbers["restart_warmup_ms"] = _warmup_ms(self.daemon)
        cached = [path for path in self._cache().rglob("*") if path.is_file()]
        check.numbers["kernel_cache_files"] = len(cached)

    def bandwidth(self, check: Check) -> None:
        import cupy
        import numpy as np

        copy_gbps, add_gbps = _device_copy_and_add_gbps(cupy, BIG_N)
        with self.client() as client:
            inputs, params = _big_inputs(client, np, check)
            runs = [client.run("vector_add", params, inputs=inputs, wait_s=600) for _ in range(6)]
        _succeeded(runs)
        self.jobs["vector_add"] = runs[-1]
        kernel_ms = statistics.median(job["timings"]["kernel_ms"] for job in runs[1:])
        # c = a + b reads 2N and writes N floats; the checksum reads c again: 16 bytes each.
        daemon_gbps = 16 * BIG_N / (kernel_ms / 1e3) / 1e9
        check.numbers.update(
            {
                "elements": BIG_N,
                "d2d_copy_GBps": round(copy_gbps, 1),
                "inprocess_add_GBps": round(add_gbps, 1),
                "daemon_vector_add_kernel_ms": round(kernel_ms, 3),
                "daemon_vector_add_GBps": round(daemon_gbps, 1),
                "ratio": round(daemon_gbps / copy_gbps, 3),
                "inprocess_ratio": round(add_gbps / copy_gbps, 3),
                "target": f">= {TARGETS['bandwidth']}",
            }
        )

    def matmul_overhead(self, check: Check) -> None:
        inprocess = _inprocess_task_s("matmul", {"n": MATMUL_N}, repeats=5)
        with self.client() as client:
            client.run("matmul", {"n": MATMUL_N}, wait_s=600)  # the daemon's first, off the clock
            walls = []
            for _ in range(5):
                started = time.perf_counter()
                job = client.run("matmul", {"n": MATMUL_N}, wait_s=600)
                walls.append(time.perf_counter() - started)
                _succeeded([job])
        daemon_s = statistics.median(walls)
        overhead = daemon_s / inprocess - 1
        check.numbers.update(
            {
                "n": MATMUL_N,
                "inprocess_s": round(inprocess, 4),
                "daemon_submit_to_result_s": round(daemon_s, 4),
                "overhead": round(overhead, 4),
                "target": f"<= {TARGETS['matmul_overhead']}",
            }
        )

    def warm_vs_cold(self, check: Check) -> None:
        with self.client() as client:
            client.run("vector_add", {"size": 1000}, wait_s=60)
            walls = []
            for _ in range(50):
                started = time.perf_counter()
                _succeeded([client.run("vector_add", {"size": 1000}, wait_s=60)])
                walls.append(time.perf_counter() - started)
        colds = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", COLD_COMMAND], check=True, capture_output=True)
            colds.append(time.perf_counter() - started)
        warm, cold = statistics.median(walls), statistics.median(colds)
        check.numbers.update(
            {
                "warm_p50_ms": round(warm * 1e3, 3),
                "warm_max_ms": round(max(walls) * 1e3, 3),
                "cold_p50_s": round(cold, 3),
                "ratio": round(cold / warm, 1),
                "target": f">= {TARGETS['warm_vs_cold']}",
            }
        )

    def oom(self, check: Check) -> None:
        from taogpud.backends import create_backend
        from taogpud.backends.base import WorkerSpec
        from taogpud.pool import protocol as msg
        from taogpud.pool.execute import execute

        backend = create_backend(WorkerSpec("cuda", 0, 2, 1, 0.01, 0, True, "auto", True))
        info = backend.warm()
        size = info.memory_cap_bytes // 4  # a alone fills the cap; b and c cannot follow
        big = execute(backend, info, msg.RunJob("big", "vector_add", {"size": size}, {}, None),
                      threading.Event(), 0)  # fmt: skip
        started = time.perf_counter()
        small = execute(backend, info, msg.RunJob("small", "vector_add", {"size": 1000}, {}, None),
                        threading.Event(), 0)  # fmt: skip
        check.numbers.update(
            {
                "cap_MiB": info.memory_cap_bytes // 2**20,
                "over_cap_job": big.error[0] if big.error else big.status,
                "over_cap_message": big.error[1] if big.error else None,
                "next_job": small.status,
                "next_job_ms": round((time.perf_counter() - started) * 1e3, 2),
            }
        )
        if (
            big.error is None
            or big.error[0] != "out_of_device_memory"
            or small.status != "succeeded"
        ):
            raise AssertionError(f"expected out_of_device_memory then success: {check.numbers}")

    def sticky_error(self, check: Check) -> None:
        params = {
            "source": ILLEGAL_ADDRESS,
            "name": "illegal_address",
            "grid": [1],
            "block": [1],
            "args": [{"output": "o", "shape": [1]}],
        }
        with self.client() as client:
            before = client.status()["workers"][0]["pid"]
            job = client.run("kernel", params, wait_s=120)
            failed_at = time.monotonic()
            while not _warm_again(client.status()["workers"][0], before):
                if time.monotonic() - failed_at > 180:
                    raise TimeoutError("the worker was not warm again within 180 s")
                time.sleep(0.05)
            respawn_s = time.monotonic() - failed_at
            after = client.run("vector_add", {"size": 1000}, wait_s=60)
        check.numbers.update(
            {
                "job_status": job["status"],
                "error": job["error"],
                "respawn_to_warm_s": round(respawn_s, 2),
                "worker_pid_before": before,
                "next_job": after["status"],
                "next_worker_pid": after["worker_pid"],
            }
        )
        if (job["error"] or {}).get("code") != "cuda_sticky_error" or after[
            "status"
        ] != "succeeded":
            raise AssertionError(f"expected cuda_sticky_error, then a success: {check.numbers}")

    def evidence(self, check: Check) -> None:
        job = self.jobs.get("vector_add")
        if job is None:
            with self.client() as client:
                job = client.run("vector_add", {"size": 10_000_000}, wait_s=60)
        check.numbers.update(
            {
                "job": job["id"],
                "device": job["device"],
                "device_uuid": job["device_uuid"],
                "worker_pid": job["worker_pid"],
                "evidence": job["evidence"],
                "timings": job["timings"],
                "nvidia_smi_compute_apps": _run(
                    [
                        "nvidia-smi",
                        "--query-compute-apps=pid,process_name,used_memory",
                        "--format=csv,noheader",
                    ]
                ),
            }
        )

    def pytest_gpu(self, check: Check) -> None:
        files = ["tests/test_gpu.py", "tests/test_tasks.py", "tests/test_doctor.py",
                 "tests/test_doctor_checks.py"]  # fmt: skip
        command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                   *files]  # fmt: skip
        result = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
        )
        lines = (result.stdout + result.stderr).strip().splitlines()
        check.numbers.update({"exit": result.returncode, "summary": lines[-1:] or [""]})
        check.numbers["tail"] = lines[-25:]
        if result.returncode != 0:
            raise AssertionError(f"pytest -m gpu exited {result.returncode}")

    # -- helpers -------------------------------------------------------------------------

    def _start(self) -> tuple[float, RunningDaemon]:
        """Start the daemon and wait for its health (minutes on an empty kernel cache)."""
        started = time.monotonic()
        daemon = start_daemon(
            self.home / "daemon", GPU_SETTINGS, GPU_CONFIG, env=self._env(), wait_ready=False
        )
        while not _healthy(daemon):
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"taogpud exited {daemon.proc.returncode}: {daemon.stderr()}")
            if time.monotonic() - started > WARM_TIMEOUT_S:
                daemon.stop()
                raise TimeoutError(f"not ready after {WARM_TIMEOUT_S} s: {daemon.stderr()[-2000:]}")
            time.sleep(0.02)
        return time.monotonic() - started, daemon

    def _env(self) -> dict[str, str]:
        return {"CUPY_CACHE_DIR": str(self._cache()), "CUDA_CACHE_PATH": str(self.home / "nv")}

    def _cache(self) -> Path:
        return self.home / "cupy-cache"


def _big_inputs(client: Any, np: Any, check: Check) -> tuple[dict[str, str], dict[str, Any]]:
    """a and b uploaded (the kernel phase is then c = a + b and its checksum alone); where
    /dev/shm is too small for 2 × 400 MB, generated in the job, which the numbers then say
    (the kernel phase then also draws a and b: a pessimistic bandwidth)."""
    from taogpud.client import ApiError

    rng = np.random.default_rng(0)
    try:
        a = rng.random(BIG_N, dtype=np.float32)
        ids = {"a": client.upload_array(a)["id"]}
        del a
        ids["b"] = client.upload_array(rng.random(BIG_N, dtype=np.float32))["id"]
    except ApiError as exc:
        check.numbers["inputs"] = f"generated in the job (upload failed: {exc.code}: {exc})"
        return {}, {"size": BIG_N}
    check.numbers["inputs"] = "uploaded"
    return ids, {}


def _healthy(daemon: RunningDaemon) -> bool:
    from taogpud.client import DaemonUnreachable

    if not daemon.socket_path.exists():
        return False
    try:
        with daemon.client(timeout_s=5) as client:
            return bool(client.health().get("ok"))
    except DaemonUnreachable:
        return False


def _warm_again(worker: dict[str, Any], before: int) -> bool:
    return bool(worker["state"] == "warm" and worker["pid"] != before)


def _warmup_ms(daemon: RunningDaemon) -> list[float | None]:
    with daemon.client() as client:
        return [worker["warmup_ms"] for worker in client.status()["workers"]]


def _succeeded(jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        if job["status"] != "succeeded" or job["backend"] != "cuda":
            raise AssertionError(
                f"job {job['id']}: {job['status']} on {job['backend']}: {job['error']}"
            )


def _device_copy_and_add_gbps(cupy: Any, n: int) -> tuple[float, float]:
    """cudaMemcpy device→device (bytes read + written) and `cupy.add` (2 read + 1 written),
    each the median of 10 timed with CUDA events after a warm-up."""
    a, b = cupy.ones(n, dtype=cupy.float32), cupy.ones(n, dtype=cupy.float32)
    c = cupy.empty_like(a)
    nbytes = a.nbytes
    kind = cupy.cuda.runtime.memcpyDeviceToDevice

    def copy() -> None:
        cupy.cuda.runtime.memcpyAsync(c.data.ptr, a.data.ptr, nbytes, kind, 0)

    def add() -> None:
        cupy.add(a, b, out=c)

    copy_s = _event_median_s(cupy, copy)
    add_s = _event_median_s(cupy, add)
    return 2 * nbytes / copy_s / 1e9, 3 * nbytes / add_s / 1e9


def _event_median_s(cupy: Any, work: Callable[[], None], repeats: int = 10) -> float:
    work()
    cupy.cuda.Device().synchronize()
    times: list[float] = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(float(cupy.cuda.get_elapsed_time(start, end)) / 1e3)
    return statistics.median(times)


def _inprocess_task_s(name: str, params: dict[str, Any], repeats: int) -> float:
    """The task's own body with CuPy in this process, wall time with a sync: what a user
    would write by hand, minus the daemon."""
    import cupy

    from taogpud import tasks
    from taogpud.tasks.base import TaskContext

    task = tasks.get(name)
    model = tasks.validate_params(task, params)

    def once() -> float:
        started = time.perf_counter()
        ctx = TaskContext(cupy, "cuda", "gpu:0", {}, threading.Event(), {})
        task.body(ctx, model)
        cupy.cuda.Device().synchronize()
        return time.perf_counter() - started

    once()
    return statistics.median(once() for _ in range(repeats))


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except OSError as exc:
        return f"{command[0]}: {exc}"


# ---------------------------------------------------------------------------- the report


def render(checks: list[Check], total_s: float) -> str:
    lines = [
        "# GPU check",
        "",
        f"Written by `scripts/gpu_check.py` (`make gpu-check`) on {_now()}, "
        f"{total_s:.0f} s in all. Each check ran in its own try; a failed one shows its error.",
        "",
        "| check | result | seconds | target | measured |",
        "|---|---|---|---|---|",
    ]
    for check in checks:
        target, measured = _headline(check)
        status = "ok" if check.ok else "FAILED"
        lines.append(f"| {check.name} | {status} | {check.seconds:.1f} | {target} | {measured} |")
    lines.append("")
    for check in checks:
        lines += [f"## {check.name}", ""]
        if check.error:
            lines += [f"Error: `{check.error}`", ""]
        lines += ["```json", json.dumps(check.numbers, indent=2, default=str), "```", ""]
    return "\n".join(lines)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _headline(check: Check) -> tuple[str, str]:
    numbers = check.numbers
    if check.name == "bandwidth" and "ratio" in numbers:
        met = numbers["ratio"] >= TARGETS["bandwidth"]
        return "≥ 0.85 of D2D copy", f"{numbers['ratio']} ({'met' if met else 'missed'})"
    if check.name == "matmul_overhead" and "overhead" in numbers:
        met = numbers["overhead"] <= TARGETS["matmul_overhead"]
        return "≤ 3 %", f"{numbers['overhead'] * 100:.2f} % ({'met' if met else 'missed'})"
    if check.name == "warm_vs_cold" and "ratio" in numbers:
        met = numbers["ratio"] >= TARGETS["warm_vs_cold"]
        return "≥ 100×", f"{numbers['ratio']}× ({'met' if met else 'missed'})"
    if check.name == "warm_up" and "first_warmup_ms" in numbers:
        return (
            "-",
            f"first {numbers['first_warmup_ms']} ms, restart {numbers.get('restart_warmup_ms')} ms",
        )
    if check.name == "evidence" and "evidence" in numbers:
        return "pid seen on the GPU", str(numbers["evidence"].get("verdict"))
    return "-", "see below"


def main() -> int:
    from taogpud.backends.cuda import probe_cuda

    problem = probe_cuda([0])
    if problem is not None:  # never overwrite a GPU host's report with a driverless one
        print(f"gpu-check: no GPU to check here ({problem}); nothing written", flush=True)
        return 0
    home = Path(tempfile.mkdtemp(prefix="tgd-gpu-", dir="/tmp"))
    os.environ["CUPY_CACHE_DIR"] = str(home / "cupy-cache")  # this process's kernels too
    # The daemons run from their own folder: they find taogpud through PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    check = GpuCheck(home)
    started = time.monotonic()
    try:
        for name in ("environment", "warm_up", "bandwidth", "matmul_overhead", "warm_vs_cold",
                     "evidence", "sticky_error", "oom"):  # fmt: skip
            check.run(name, getattr(check, name))
    finally:
        if check.daemon is not None:
            check.daemon.stop()
    check.run("pytest_gpu", check.pytest_gpu)
    total_s = time.monotonic() - started
    write(check.checks, total_s)
    shutil.rmtree(home, ignore_errors=True)
    return 0 if all(c.ok for c in check.checks) else 1


def write(checks: list[Check], total_s: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / "gpu-check.md"
    numbers = RESULTS / "gpu-check-numbers.json"
    report.write_text(render(checks, total_s))
    numbers.write_text(json.dumps([c.as_dict() for c in checks], indent=2, default=str) + "\n")
    out = os.environ.get("OUT")
    if out:
        for path in (report, numbers):
            shutil.copy(path, Path(out) / path.name)
    print(f"wrote {report} and {numbers}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
