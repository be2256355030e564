"""The GPU check (`make gpu-check`): the CUDA backend measured on a real GPU, in one run.

Writes bench/results/gpu-check.md (read by the bench report, bench/gpu.py) and
bench/results/gpu-check-numbers.json, and copies both to $OUT when that is set. Every check
runs in its own try: a failing one is reported with its error and the others still run.

It cannot come back empty: one deadline bounds the whole run (GPU_CHECK_DEADLINE_S, 480 s by
default, inside a device command's 10 minutes), each check's cap is its share of that
deadline (never past what is left), every wait and subprocess has a timeout, the report is
rewritten after every check, and a watchdog writes it and exits at the deadline if a check
is stuck where no timeout reaches. It imports the daemon (taogpud.daemon.lifecycle, the API
app) before anything else, so a missing package shows at once, then prints the versions it runs on.

    warm-up          first start on an empty kernel cache, then a restart warm from disk
    bandwidth        vector_add of 1e8 float32 through the daemon vs the device's D2D copy
    shm_h2d          H2D from a client's shared memory (pinned by the worker) vs the device's
                     own pinned-copy bandwidth; in-process: registered vs pageable, register ms
    matmul_overhead  8192×8192 matmul through the daemon vs the same task body in-process
    warm_vs_cold     submit → result of a 1e3 vector_add vs `python -c "import cupy; ..."`
    oom              a job over the pool cap, then the next job (the worker's own code)
    sticky_error     an illegal address from a user kernel; the worker's respawn
    evidence         a job's NVML evidence beside `nvidia-smi --query-compute-apps`
    program_gpu      `taogpuctl exec`'s path: a CuPy program under a lease, seen on gpu:0 by
                     NVML with its memory and energy (docs/programs.md)
    program_cpu      a program that never touches its GPU: stopped as never_used_gpu after
                     gpu.firstUseTimeoutS (5 s here), saying how to check
    pytest_gpu       `pytest -m gpu` over the test files that hold gpu tests

Targets (DESIGN §10, as ratios): vector_add ≥ 85 % of copy bandwidth; matmul overhead ≤ 3 %;
warm ≥ 100× faster than cold. Bandwidth counts bytes read + written on both sides of the
ratio. Runs in about 3–5 minutes; nothing here needs the network. docs/gpu-check.md.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The daemon first: on a host missing one of its packages this fails here, at once, and not
# minutes later in a daemon's stderr (fastapi 0.165 importing opentelemetry did just that).
importlib.import_module("taogpud.daemon.lifecycle")
importlib.import_module("taogpud.api.app")
from taogpud.backends.cuda.samples import ILLEGAL_ADDRESS  # noqa: E402
from taogpud.testing import HarnessError, RunningDaemon, start_daemon, wait_for_ready  # noqa: E402

RESULTS = REPO / "bench" / "results"
# firstUseTimeoutS short: the check's program that never touches the GPU is flagged quickly
GPU_SETTINGS: dict[str, Any] = {
    "gpu": {"backend": "cuda", "memoryFraction": 0.9, "firstUseTimeoutS": 5}
}
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
BIG_N = 100_000_000  # float32 elements of a and b, fewer where /dev/shm cannot hold them
DEADLINE_S = float(os.environ.get("GPU_CHECK_DEADLINE_S", "480"))
REPORT_RESERVE_S = 10.0  # kept back from every cap: stopping daemons, writing the report
# Each check's cap, as its share of the deadline (they add up past 1: most finish early,
# and a cap is never more than what is left).
SHARES = {
    "environment": 0.05,
    "warm_up": 0.35,
    "bandwidth": 0.12,
    "shm_h2d": 0.06,
    "matmul_overhead": 0.12,
    "warm_vs_cold": 0.1,
    "evidence": 0.04,
    "program_gpu": 0.06,
    "program_cpu": 0.05,
    "sticky_error": 0.15,
    "oom": 0.08,
    "pytest_gpu": 0.3,
}
PYTEST_FILES = ["tests/test_gpu.py", "tests/test_tasks.py", "tests/test_doctor.py",
                "tests/test_doctor_checks.py", "tests/test_pinning.py"]  # fmt: skip
# What the check and the daemon import, by distribution name: their versions head the report
DEPENDS_ON = ["cupy-cuda13x", "cupy-cuda12x", "numpy", "nvidia-ml-py", "fastapi", "starlette",
              "uvicorn", "pydantic", "pydantic-settings", "structlog", "orjson", "aiohttp",
              "typer", "rich", "watchfiles", "opentelemetry-api", "pytest"]  # fmt: skip
MATMUL_N = 8192
# A program of the user's own, on the GPU for ~4 s (NVML is read once a second) with 1 GiB.
GPU_PROGRAM = (
    "import time, cupy; a = cupy.ones((8192, 16384), dtype=cupy.float32); end = time.time() + 4\n"
    "while time.time() < end: (a @ a.T).sum(); cupy.cuda.Device().synchronize()\n"
    "print('ran on', cupy.cuda.runtime.getDeviceProperties(0)['name'])"
)
CPU_PROGRAM = "import time; time.sleep(30)"  # stopped long before, never seen on the GPU
COLD_COMMAND = "import cupy; a = cupy.arange(1000, dtype=cupy.float32); print(float((a + a).sum()))"
TARGETS = {"bandwidth": 0.85, "matmul_overhead": 0.03, "warm_vs_cold": 100.0, "shm_h2d": 0.8}


class Check:
    """One check's outcome: its numbers, and its error if it failed; `left_s()` is what its
    cap leaves, the timeout for each wait and subprocess inside it."""

    def __init__(self, name: str, cap_s: float = DEADLINE_S) -> None:
        self.name = name
        self.ok = False
        self.seconds = 0.0
        self.cap_s = cap_s
        self.deadline = time.monotonic() + cap_s
        self.numbers: dict[str, Any] = {}
        self.error: str | None = None

    def left_s(self, at_most: float = float("inf")) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{self.name}: its cap of {self.cap_s:.0f} s ran out")
        return min(left, at_most)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "cap_s": round(self.cap_s, 1),
            "numbers": self.numbers,
            "error": self.error,
        }


class Clock:
    """The whole run's deadline, and each check's cap derived from it."""

    def __init__(self, deadline_s: float = DEADLINE_S) -> None:
        self.started = time.monotonic()
        self.deadline_s = deadline_s

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def left_s(self) -> float:
        return self.deadline_s - self.elapsed_s()

    def cap_s(self, name: str) -> float:
        return max(0.0, min(SHARES[name] * self.deadline_s, self.left_s() - REPORT_RESERVE_S))


class GpuCheck:
    def __init__(self, home: Path, clock: Clock) -> None:
        self.home = home
        self.clock = clock
        self.checks: list[Check] = []
        self.current: Check | None = None  # the one running, for a report cut by the watchdog
        self.daemons: list[RunningDaemon] = []  # every one started, stopped at the end
        self.daemon: RunningDaemon | None = None
        self.jobs: dict[str, Any] = {}  # jobs kept for later checks (the evidence)

    def run(self, name: str, body: Callable[[Check], None]) -> None:
        check = Check(name, self.clock.cap_s(name))
        self.current = check
        started = time.monotonic()
        print(f"== {name} (cap {check.cap_s:.0f} s)", flush=True)
        try:
            if check.cap_s <= 0:
                raise TimeoutError("no time left before the run's deadline")
            body(check)
            check.ok = True
        except Exception as exc:
            check.error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        check.seconds = time.monotonic() - started
        print(f"   {'ok' if check.ok else 'FAILED'} in {check.seconds:.1f} s: {check.numbers}")
        self.checks.append(check)
        self.current = None
        write(self.checks, self.clock.elapsed_s(), final=False)  # a cut run keeps this much

    def client(self, check: Check) -> Any:
        if self.daemon is None:
            raise RuntimeError("no daemon is running (the warm-up check failed)")
        return self.daemon.client(timeout_s=check.left_s())

    def stop_daemons(self) -> None:
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                daemon.stop()

    # -- the checks ----------------------------------------------------------------------

    def environment(self, check: Check) -> None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        check.numbers.update(environment_numbers())
        check.numbers.update(
            {
                "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
                "device": props["name"].decode(errors="replace"),
                "compute_capability": f"{props['major']}.{props['minor']}",
                "nvidia_smi": _run(["nvidia-smi", "-L"], check.left_s(30)),
            }
        )

    def warm_up(self, check: Check) -> None:
        cold_s, cold = self._start(check)
        check.numbers["first_start_s"] = round(cold_s, 2)
        check.numbers["first_warmup_ms"] = _warmup_ms(cold, check)
        cold.stop()
        warm_s, self.daemon = self._start(check)
        check.numbers["restart_s"] = round(warm_s, 2)
        check.numbers["restart_warmup_ms"] = _warmup_ms(self.daemon, check)
        cached = [path for path in self._cache().rglob("*") if path.is_file()]
        check.numbers["kernel_cache_files"] = len(cached)

    def bandwidth(self, check: Check) -> None:
        import cupy
        import numpy as np

        n = fitting_elements(shm_bytes())
        copy_gbps, add_gbps = _device_copy_and_add_gbps(cupy, n)
        cupy.get_default_memory_pool().free_all_blocks()  # this process's a, b, c: gone
        check.numbers.update(
            {
                "elements": n,
                "bytes_counted": BYTES_COUNTED,
                "d2d_copy_GBps": round(copy_gbps, 1),
                "inprocess_add_GBps": round(add_gbps, 1),
                "inprocess_ratio": round(add_gbps / copy_gbps, 3),
            }
        )
        with self.client(check) as client:
            runs = _vector_add_runs(client, np, n, check)
        self.jobs["vector_add"] = runs[-1]
        kernel_ms = statistics.median(job["timings"]["kernel_ms"] for job in runs[1:])
        # The kernel phase: c = a + b (reads 2N, writes N) and its checksum (reads c): 4N.
        daemon_gbps = 4 * 4 * n / (kernel_ms / 1e3) / 1e9
        check.numbers.update(
            {
                "daemon_vector_add_kernel_ms": round(kernel_ms, 3),
                "daemon_vector_add_GBps": round(daemon_gbps, 1),
                "ratio": round(daemon_gbps / copy_gbps, 3),
                "target": f">= {TARGETS['bandwidth']}",
            }
        )

    def shm_h2d(self, check: Check) -> None:
        """H2D of a and b from the client's own memory (the job's h2d_ms; the worker pins the
        spans it copies) against the device's copy from memory it pinned itself."""
        import cupy

        n = shm_elements(shm_bytes())
        check.numbers.update(_host_copy_numbers(cupy, n))
        with self.client(check) as client:
            client.shared_memory_bytes = 16 * n + (1 << 20)  # a, b and c's 2 × 4n of room
            a, b = client.empty(n, "float32"), client.empty(n, "float32")
            a[:], b[:] = 1, 2
            jobs = [client.compute("vector_add", a=a, b=b).job for _ in range(6)]
        _succeeded(jobs)
        warm_ms = statistics.median(job["timings"]["h2d_ms"] for job in jobs[1:])
        daemon_gbps = 2 * 4 * n / (warm_ms / 1e3) / 1e9
        pinned_gbps = check.numbers["device_pinned_h2d_GBps"]
        failures = [e for e in self._events() if e.get("event") == "shm.pin_failed"]
        check.numbers.update(
            {
                "memory": jobs[0]["memory"],
                "daemon_first_h2d_ms": round(jobs[0]["timings"]["h2d_ms"], 2),
                "daemon_warm_h2d_ms": round(warm_ms, 2),
                "daemon_shm_h2d_GBps": round(daemon_gbps, 1),
                "ratio": round(daemon_gbps / pinned_gbps, 3),
                "target": f">= {TARGETS['shm_h2d']}",
                "pin_failed_lines": failures[:3],
            }
        )

    def _events(self) -> list[dict[str, Any]]:
        return [] if self.daemon is None else self.daemon.events()

    def matmul_overhead(self, check: Check) -> None:
        inprocess = _inprocess_task_s("matmul", {"n": MATMUL_N}, repeats=5)
        with self.client(check) as client:
            # the daemon's first, off the clock
            client.run("matmul", {"n": MATMUL_N}, wait_s=check.left_s())
            walls = []
            for _ in range(5):
                started = time.perf_counter()
                job = client.run("matmul", {"n": MATMUL_N}, wait_s=check.left_s())
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
        with self.client(check) as client:
            client.run("vector_add", {"size": 1000}, wait_s=check.left_s(60))
            walls = []
            for _ in range(50):
                started = time.perf_counter()
                job = client.run("vector_add", {"size": 1000}, wait_s=check.left_s(60))
                _succeeded([job])
                walls.append(time.perf_counter() - started)
        colds = []
        for _ in range(3):
            started = time.perf_counter()
            result = bounded([sys.executable, "-c", COLD_COMMAND], check.left_s())
            if result.returncode != 0:
                raise RuntimeError(f"cold python -c exited {result.returncode}: {result.output}")
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
        from taogpud.backends.base import WorkerSpec
        from taogpud.pool import protocol as msg
        from taogpud.pool.execute import execute
        from taogpud.tasks.warmup import backend_for, warm

        backend = backend_for(WorkerSpec("cuda", 0, 2, 1, 0.01, 0, True, "auto", True))
        info = warm(backend)
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
        with self.client(check) as client:
            before = client.status()["workers"][0]["pid"]
            job = client.run("kernel", params, wait_s=check.left_s(120))
            failed_at = time.monotonic()
            while not _warm_again(client.status()["workers"][0], before):
                check.left_s()  # raises once the cap is spent
                time.sleep(0.05)
            respawn_s = time.monotonic() - failed_at
            after = client.run("vector_add", {"size": 1000}, wait_s=check.left_s(60))
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
            with self.client(check) as client:
                job = client.run("vector_add", {"size": 10_000_000}, wait_s=check.left_s(60))
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
                    ],
                    check.left_s(30),
                ),
            }
        )

    def program_gpu(self, check: Check) -> None:
        outcome = self._program(check, GPU_PROGRAM)
        job = outcome.job
        evidence = job.get("evidence") or {}
        check.numbers.update({"job": job["id"], "status": job["status"], "evidence": evidence})
        check.numbers["verdict"] = evidence.get("seen_on") == ["gpu:0"]
        if not (job["status"] == "succeeded" and check.numbers["verdict"]):
            raise AssertionError(f"expected a success seen on gpu:0: {check.numbers}")
        if not evidence.get("peak_memory_bytes") or evidence.get("energy_j") is None:
            raise AssertionError(f"expected its memory and energy: {evidence}")
        if evidence.get("xid_errors"):  # absent: this host's NVML reports no XID events
            raise AssertionError(f"the driver reported XIDs on its GPU: {evidence}")

    def program_cpu(self, check: Check) -> None:
        job = self._program(check, CPU_PROGRAM).job
        error = job.get("error") or {}
        check.numbers.update({"job": job["id"], "status": job["status"], "error": error})
        check.numbers["verdict"] = error.get("code") == "never_used_gpu"
        check.numbers["evidence"] = job.get("evidence") or {}
        if not check.numbers["verdict"]:
            raise AssertionError(f"expected never_used_gpu: {check.numbers}")

    def _program(self, check: Check, source: str) -> Any:
        """A program under a lease of gpu:0 with 2 GiB, started here as taogpuctl exec would."""
        from taogpud.client.program import ProgramRun

        with self.client(check) as client:
            run = ProgramRun(client, [sys.executable, "-c", source], mem_bytes=2 << 30)
            return run.run()

    def pytest_gpu(self, check: Check) -> None:
        # pytest's own per-test timeout below the cap, so a stuck test fails alone
        per_test_s = max(int(check.left_s()) - 5, 1)
        command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                   "-o", f"timeout={per_test_s}", *PYTEST_FILES]  # fmt: skip
        result = bounded(command, check.left_s())
        lines = result.output.strip().splitlines()
        check.numbers.update({"exit": result.returncode, "summary": lines[-1:] or [""]})
        check.numbers["tail"] = lines[-25:]
        if result.returncode != 0:
            raise AssertionError(f"pytest -m gpu exited {result.returncode}")

    # -- helpers -------------------------------------------------------------------------

    def _start(self, check: Check) -> tuple[float, RunningDaemon]:
        """Start the daemon and wait for its health (minutes on an empty kernel cache)."""
        started = time.monotonic()
        daemon = start_daemon(
            self.home / "daemon", GPU_SETTINGS, GPU_CONFIG, env=self._env(), wait_ready=False
        )
        self.daemons.append(daemon)
        try:
            wait_for_ready(daemon, timeout_s=check.left_s(), poll_s=0.02)
        except HarnessError as exc:
            daemon.stop()
            raise RuntimeError(f"within the cap of {check.cap_s:.0f} s: {exc}"[:2500]) from None
        return time.monotonic() - started, daemon

    def _env(self) -> dict[str, str]:
        return {"CUPY_CACHE_DIR": str(self._cache()), "CUDA_CACHE_PATH": str(self.home / "nv")}

    def _cache(self) -> Path:
        return self.home / "cupy-cache"


# ---------------------------------------------------------------------------- bandwidth

BYTES_COUNTED = (
    "bytes read + bytes written, on both sides of every ratio: D2D copy of N floats = 2 × 4N; "
    "in-process c = a + b = 3 × 4N; the daemon's vector_add kernel phase (c = a + b, then its "
    "checksum reads c) = 4 × 4N"
)


def shm_bytes() -> tuple[int, int]:
    """/dev/shm's (size, free) in bytes; (0, 0) where there is none."""
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return 0, 0
    return usage.total, usage.free


def fitting_elements(shm: tuple[int, int], most: int = BIG_N) -> int:
    """float32 elements per input such that a and b both fit at once: the daemon keeps
    uploads within half of /dev/shm (daemon._array_budget_bytes) and evicts the oldest past
    that, so a second upload larger than what is left would evict the first. 90 % of the
    smaller of that half and what is free, over 2 arrays × 4 bytes; at least 1e6."""
    size, free = shm
    room = min(size // 2, 8 << 30, free)
    return max(min(most, int(room * 0.9) // 8), 1_000_000)


def _vector_add_runs(client: Any, np: Any, n: int, check: Check) -> list[dict[str, Any]]:
    """Six vector_adds of n elements on uploaded a and b (the kernel phase is then c = a + b
    and its checksum alone). Where uploading fails, or an input is gone by the time the job
    runs (missing_input), the inputs are generated in the job instead, which the numbers say
    (the kernel phase then also draws a and b: a pessimistic bandwidth)."""
    from taogpud.client import ApiError

    try:
        inputs = _upload_inputs(client, np, n)
        runs = [
            client.run("vector_add", {}, inputs=inputs, wait_s=check.left_s()) for _ in range(6)
        ]
        _succeeded(runs)
        check.numbers["inputs"] = "uploaded"
        return runs
    except (ApiError, AssertionError) as exc:
        check.numbers["inputs"] = f"generated in the job (uploaded inputs failed: {exc})"
    runs = [client.run("vector_add", {"size": n}, wait_s=check.left_s()) for _ in range(6)]
    _succeeded(runs)
    return runs


def _upload_inputs(client: Any, np: Any, n: int) -> dict[str, str]:
    rng = np.random.default_rng(0)
    a = rng.random(n, dtype=np.float32)
    ids = {"a": client.upload_array(a)["id"]}
    del a
    ids["b"] = client.upload_array(rng.random(n, dtype=np.float32))["id"]
    return ids


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


def _event_median_s(
    cupy: Any, work: Callable[[], object], repeats: int = 10, stream: Any = None
) -> float:
    work()
    cupy.cuda.Device().synchronize()
    times: list[float] = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        work()
        end.record(stream)
        end.synchronize()
        times.append(float(cupy.cuda.get_elapsed_time(start, end)) / 1e3)
    return statistics.median(times)


# ---------------------------------------------------------------------------- shm H2D


def shm_elements(shm: tuple[int, int], most: int = 64 << 20) -> int:
    """float32 elements of a and b such that the client's memory (a, b and c's room: 16 n
    bytes) fits the daemon's per-uid memory quota, half of /dev/shm at most 8 GiB, with a
    tenth to spare; at most 64 Mi (256 MiB each), at least 1 Mi."""
    quota = min(shm[0] // 2, 8 << 30)
    return max(min(most, int(quota * 0.9) // 16), 1 << 20)


def _host_copy_numbers(cupy: Any, n: int) -> dict[str, Any]:
    """H2D of 4n bytes, timed with CUDA events (median of 5): from memory CUDA allocated
    pinned (the device's own bar), and from a memfd mapping the worker's own code pinned
    (with what registering it cost) and left pageable."""
    import numpy as np

    nbytes = 4 * n
    pinned = cupy.cuda.alloc_pinned_memory(nbytes)
    source = np.frombuffer(pinned, np.float32, n)
    source[:] = 1
    numbers: dict[str, Any] = {"elements": n, "bytes_per_copy": nbytes}
    numbers["device_pinned_h2d_GBps"] = round(_h2d_gbps(cupy, source), 1)
    with _mapped_memfd(nbytes) as (mapping, view):
        view[:] = 1
        numbers["inprocess_pageable_mapping_GBps"] = round(_h2d_gbps(cupy, view), 1)
        started = time.perf_counter()
        unpin = _pin(mapping, nbytes)
        numbers["register_ms"] = round((time.perf_counter() - started) * 1e3, 2)
        try:
            numbers["inprocess_pinned_mapping_GBps"] = round(_h2d_gbps(cupy, view), 1)
        finally:
            unpin()
    return numbers


def _h2d_gbps(cupy: Any, host: Any) -> float:
    """cupy.asarray(host) on a non-blocking stream, as a worker copies an input."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        seconds = _event_median_s(cupy, lambda: cupy.asarray(host), repeats=5, stream=stream)
    return float(host.nbytes / seconds / 1e9)


@contextlib.contextmanager
def _mapped_memfd(nbytes: int) -> Iterator[tuple[Any, Any]]:
    """A memfd of nbytes mapped here, as a worker maps a client's memory, and a float32 view."""
    import mmap

    import numpy as np

    fd = os.memfd_create("gpu-check", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        mapping = mmap.mmap(fd, nbytes)
        try:
            yield mapping, np.frombuffer(mapping, np.float32)
        finally:
            with contextlib.suppress(BufferError):  # the caller's view: unmapped when collected
                mapping.close()
    finally:
        os.close(fd)


def _pin(mapping: Any, nbytes: int) -> Callable[[], None]:
    """The worker's own registration (CudaBackend's host_pinning) of the whole mapping."""
    import numpy as np

    from taogpud.backends.base import WorkerSpec
    from taogpud.backends.cuda.backend import CudaBackend

    address = np.frombuffer(mapping, np.uint8, count=1).__array_interface__["data"][0]
    pin = CudaBackend(WorkerSpec("cuda", 0, 1, 1, 0.5, 0, True, "auto", False)).host_pinning()
    return pin(address, nbytes, False)


# ---------------------------------------------------------------------------- helpers


def _warm_again(worker: dict[str, Any], before: int) -> bool:
    return bool(worker["state"] == "warm" and worker["pid"] != before)


def _warmup_ms(daemon: RunningDaemon, check: Check) -> list[float | None]:
    with daemon.client(timeout_s=check.left_s(30)) as client:
        return [worker["warmup_ms"] for worker in client.status()["workers"]]


def _succeeded(jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        if job["status"] != "succeeded" or job["backend"] != "cuda":
            raise AssertionError(
                f"job {job['id']}: {job['status']} on {job['backend']}: {job['error']}"
            )


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


class Finished:
    """A bounded subprocess's exit status and its stdout and stderr together."""

    def __init__(self, returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output


def bounded(command: list[str], timeout_s: float) -> Finished:
    """Run command in its own process group; past timeout_s the whole group is killed (a
    pytest's daemons too) and what it printed so far is kept, exit 124 as timeout(1) says."""
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return Finished(proc.returncode, output)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return Finished(124, f"{output}\n[killed after {timeout_s:.0f} s]")


def _run(command: list[str], timeout_s: float = 30) -> str:
    try:
        return bounded(command, timeout_s).output.strip()
    except OSError as exc:
        return f"{command[0]}: {exc}"


# ---------------------------------------------------------------------------- versions


def package_versions() -> dict[str, str | None]:
    """The installed version of each distribution the check and the daemon import (the
    first found on sys.path, i.e. a carried wheel before the host's)."""
    versions: dict[str, str | None] = {}
    for name in DEPENDS_ON:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def environment_numbers() -> dict[str, Any]:
    """Python, the packages, NVML's driver and GPUs, /dev/shm: printed first, driver or not."""
    from taogpud.observability import nvml

    inventory = nvml.inventory(read_process_names=False)
    size, free = shm_bytes()
    return {
        "python": platform.python_version(),
        "packages": package_versions(),
        "driver": inventory.driver_version or inventory.reason,
        "cuda_driver_version": inventory.cuda_driver_version,
        "gpus": [
            f"{gpu.name}, {gpu.memory_total_bytes // 2**20} MiB, cc {gpu.compute_capability}"
            for gpu in inventory.devices
        ],
        "dev_shm_MiB": {"size": size // 2**20, "free": free // 2**20},
        "bandwidth_elements": fitting_elements((size, free)),
    }


# ---------------------------------------------------------------------------- the report


def render(checks: list[Check], total_s: float, final: bool = True, cut: str | None = None) -> str:
    state = f"{total_s:.0f} s in all" if final else f"{total_s:.0f} s so far, still running"
    lines = [
        "# GPU check",
        "",
        f"Written by `scripts/gpu_check.py` (`make gpu-check`) on {_now()}, {state} (deadline "
        f"{DEADLINE_S:.0f} s). Each check ran in its own try, within its cap; a failed one "
        "shows its error. Bandwidth: " + BYTES_COUNTED + ".",
        "",
    ]
    if cut:
        lines += [f"**Cut short**: {cut}", ""]
    lines += [
        "| check | result | seconds | cap s | target | measured |",
        "|---|---|---|---|---|---|",
    ]
    for check in checks:
        target, measured = _headline(check)
        status = "ok" if check.ok else "FAILED"
        lines.append(
            f"| {check.name} | {status} | {check.seconds:.1f} | {check.cap_s:.0f} | {target} "
            f"| {measured} |"
        )
    lines.append("")
    for check in checks:
        lines += [f"## {check.name}", ""]
        if check.error:
            lines += [f"Error: `{check.error}`", ""]
        lines += ["```json", json.dumps(check.numbers, indent=2, default=str), "```", ""]
    return "\n".join(lines)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


# checks whose headline is a ratio at least its target: (the target as shown, the ratio's unit)
RATIO_HEADLINES = {
    "bandwidth": ("≥ 0.85 of D2D copy", ""),
    "shm_h2d": ("≥ 0.8 of pinned H2D", ""),
    "warm_vs_cold": ("≥ 100×", "×"),
}


def _headline(check: Check) -> tuple[str, str]:
    numbers = check.numbers
    if check.name in RATIO_HEADLINES and "ratio" in numbers:
        target, unit = RATIO_HEADLINES[check.name]
        met = numbers["ratio"] >= TARGETS[check.name]
        return target, f"{numbers['ratio']}{unit} ({'met' if met else 'missed'})"
    if check.name == "matmul_overhead" and "overhead" in numbers:
        met = numbers["overhead"] <= TARGETS["matmul_overhead"]
        return "≤ 3 %", f"{numbers['overhead'] * 100:.2f} % ({'met' if met else 'missed'})"
    if check.name == "warm_up" and "first_warmup_ms" in numbers:
        return (
            "-",
            f"first {numbers['first_warmup_ms']} ms, restart {numbers.get('restart_warmup_ms')} ms",
        )
    return _verdict_headline(check.name, numbers)


VERDICT_HEADLINES = {"program_gpu": "seen on gpu:0", "program_cpu": "never_used_gpu"}


def _verdict_headline(name: str, numbers: dict[str, Any]) -> tuple[str, str]:
    if name == "evidence" and "evidence" in numbers:
        return "pid seen on the GPU", str(numbers["evidence"].get("verdict"))
    if name in VERDICT_HEADLINES and "verdict" in numbers:
        return VERDICT_HEADLINES[name], str(numbers["verdict"])
    return "-", "see below"


def watchdog(check: GpuCheck) -> threading.Timer:
    """At the deadline, whatever is stuck: the report with what was measured, the running
    check marked cut, the daemons killed, exit 3."""

    def fire() -> None:
        current = check.current
        cut = f"the run's deadline of {DEADLINE_S:.0f} s passed"
        if current is not None:
            cut += f" during {current.name} (cap {current.cap_s:.0f} s)"
            current.error = f"cut at the deadline: {current.numbers}"
            current.seconds = time.monotonic() - (current.deadline - current.cap_s)
        write([*check.checks, *([current] if current else [])], check.clock.elapsed_s(), cut=cut)
        for daemon in check.daemons:
            daemon.proc.kill()
        print(f"gpu-check: {cut}; report written", flush=True)
        os._exit(3)

    timer = threading.Timer(max(check.clock.left_s(), 1.0), fire)
    timer.daemon = True
    timer.start()
    return timer


def main() -> int:
    if sys.argv[1:] == ["--test-files"]:  # for scripts/gpu_replica.sh
        print("\n".join(PYTEST_FILES))
        return 0
    clock = Clock()
    print("gpu-check: " + json.dumps(environment_numbers(), default=str), flush=True)
    from taogpud.backends.cuda.backend import probe_cuda

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
    check = GpuCheck(home, clock)
    timer = watchdog(check)
    try:
        for name in ("environment", "warm_up", "bandwidth", "shm_h2d", "matmul_overhead",
                     "warm_vs_cold", "evidence", "program_gpu", "program_cpu",
                     "sticky_error", "oom"):  # fmt: skip
            check.run(name, getattr(check, name))
    finally:
        check.stop_daemons()
    check.run("pytest_gpu", check.pytest_gpu)
    timer.cancel()
    write(check.checks, clock.elapsed_s())
    shutil.rmtree(home, ignore_errors=True)
    return 0 if all(c.ok for c in check.checks) else 1


def write(checks: list[Check], total_s: float, final: bool = True, cut: str | None = None) -> None:
    """The report and its numbers, in bench/results and in $OUT; rewritten whole each time."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / "gpu-check.md"
    numbers = RESULTS / "gpu-check-numbers.json"
    _write_atomic(report, render(checks, total_s, final=final or cut is not None, cut=cut))
    _write_atomic(numbers, json.dumps([c.as_dict() for c in checks], indent=2, default=str) + "\n")
    out = os.environ.get("OUT")
    if out:
        for path in (report, numbers):
            shutil.copy(path, Path(out) / path.name)
    print(f"wrote {report} and {numbers}", flush=True)


def _write_atomic(path: Path, text: str) -> None:
    scratch = path.with_suffix(path.suffix + ".tmp")
    scratch.write_text(text)
    scratch.replace(path)


if __name__ == "__main__":
    sys.exit(main())
