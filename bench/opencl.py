"""vector_add of 1e8 float32 on PoCL (OpenCL on this host's CPU) beside NumPy, in one run.

    python -m bench.opencl [--size N] [--repeats R] [--json]

Both sides run in one child process (`--child`): a process that used OpenCL must not fork,
and bench/run.py goes on to start dask and Ray. The OpenCL kernel is taogpud's own
(tasks/opencl_kernels.py, built as a worker builds it); pyopencl.array's generic `a + b` is
shown too, as the reason taogpud writes its element-wise kernels itself. Bandwidth counts
the bytes the operation moves: two inputs read, one output written (12 bytes per element).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIZE = 100_000_000
REPEATS = 5


def measure(size: int = SIZE, repeats: int = REPEATS) -> dict[str, Any]:
    """The child's answer, or {"error": why} where OpenCL cannot run here."""
    command = [sys.executable, "-m", "bench.opencl", "--child", "--size", str(size)]
    command += ["--repeats", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        return {"error": f"exit status {done.returncode}: {tail}"}
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def report_lines(result: dict[str, Any]) -> list[str]:
    """The report's section: one row per way of computing c = a + b."""
    title = "## OpenCL (PoCL): vector_add beside NumPy"
    if "error" in result:
        return [title, "", f"Not measured: {result['error']}"]
    numpy_gbps = next(r["gbps"] for r in result["rows"] if r["name"] == "numpy np.add(a, b, out=c)")
    lines = [
        title,
        "",
        f"{result['size']:,} float32 elements, median of {result['repeats']} runs after a warm "
        f"one; device: {result['device']} ({result['platform']}). Results checked equal.",
        "",
        "| how | median ms | GB/s | × NumPy (out=) |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['name']} | {r['median_ms']:.1f} | {r['gbps']:.1f} | {r['gbps'] / numpy_gbps:.2f} |"
        for r in result["rows"]
    ]
    return lines


# --- the child ------------------------------------------------------------------------------


def _median_s(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm: page faults of a fresh buffer, a lazily built kernel
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _child(size: int, repeats: int) -> dict[str, Any]:
    import math

    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    from taogpud.backends.opencl.memory import DeviceMemoryBudget, SlotAllocator
    from taogpud.tasks.opencl_kernels import GROUP, build_programs

    rng = np.random.default_rng(0)
    a, b = rng.random(size, dtype=np.float32), rng.random(size, dtype=np.float32)
    device = cl.get_platforms()[0].get_devices()[0]
    context = cl.Context([device])
    queue = cl.CommandQueue(context)
    kernel: Any = cl.Kernel(build_programs(context, device, fp64=False)["float32"], "vector_add")
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    dc, c = cla.empty(queue, size, np.float32), np.empty_like(a)
    global_size = (math.ceil(size / GROUP) * GROUP,)
    budget = DeviceMemoryBudget(int(device.global_mem_size), int(device.max_mem_alloc_size))
    slot_allocator = SlotAllocator(queue, budget)  # what a worker's slot allocates with

    def opencl_into(out: Any) -> None:
        kernel(queue, global_size, (GROUP,), da.data, db.data, out.data, np.uint64(size))
        queue.finish()

    def array_add() -> None:
        (da + db).finish()

    runs: list[tuple[str, Callable[[], Any]]] = [
        ("PoCL, taogpud's kernel, c preallocated", lambda: opencl_into(dc)),
        (
            "PoCL, taogpud's kernel, c from a worker slot's pool",
            lambda: opencl_into(cla.empty(queue, size, np.float32, allocator=slot_allocator)),
        ),
        (
            "PoCL, taogpud's kernel, c a fresh buffer per call",
            lambda: opencl_into(cla.empty(queue, size, np.float32)),
        ),
        ("numpy np.add(a, b, out=c)", lambda: np.add(a, b, out=c)),
        ("numpy a + b (allocates c)", lambda: a + b),
        ("PoCL, pyopencl.array a + b (generic kernel)", array_add),
    ]
    rows = []
    for name, run in runs:
        seconds = _median_s(run, repeats if "generic" not in name else max(2, repeats // 2))
        rows.append({"name": name, "median_ms": seconds * 1e3, "gbps": 12 * size / seconds / 1e9})
    opencl_into(dc)
    if not np.array_equal(dc.get(), a + b):
        raise SystemExit("the OpenCL result differs from NumPy's")
    return {
        "size": size,
        "repeats": repeats,
        "device": device.name.strip(),
        "platform": device.platform.name.strip(),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.size, args.repeats)))
        return
    result = measure(args.size, args.repeats)
    print(json.dumps(result) if args.json else "\n".join(report_lines(result)))


if __name__ == "__main__":
    main()
