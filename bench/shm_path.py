"""Arrays through the client's own shared memory (docs/shared-memory.md), beside memcpy and Ray.

One run, float32 arrays of each size:

- memcpy: numpy copyto into a warm buffer of the same size (the bar: ≥ 80% for a handover);
- into a worker: the client's copy of an ndarray into its shared memory plus the worker's
  mapping of it (the job's h2d_ms on the CPU backend: mapping, no device copy), for
  `reduce_sum(x)`; out of a worker: the job's d2h_ms for vector_add's c (the worker's copy
  into the client's memory);
- end to end: wall time of `client.compute("vector_add", a=a, b=b)` → an ndarray in the
  client, with a and b plain ndarrays (one copy each in) and made by `client.empty` (none);
- Ray: `ray.put(a)`, `ray.put(b)`, an actor's add, `ray.get` of the result: end to end.

First call (a new client: its memory's pages allocated on the way) and warm calls (median).

    PYTHONPATH=. python -m bench.shm_path --sizes 64 512 --repeats 5 [--no-ray]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.daemon_under_test import Client, running

MIB = 1 << 20
GIB = 1 << 30


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


def first_and_warm(samples: list[float]) -> tuple[float, float]:
    return samples[0], statistics.median(samples[1:])


def memcpy(size_mib: int, repeats: int) -> list[float]:
    import numpy as np

    source = np.ones(size_mib * MIB // 4, np.float32)
    target = np.empty_like(source)
    target[:] = 0  # warm
    return [timed(lambda: np.copyto(target, source))[0] for _ in range(repeats + 1)]


def into_worker(socket_path: str, size_mib: int, repeats: int) -> list[float]:
    """Client copy into its memory + the worker mapping it (reduce_sum's h2d_ms)."""
    import numpy as np

    x = np.ones(size_mib * MIB // 4, np.float32)
    samples = []
    with Client(socket_path, timeout_s=600) as client:
        client.shared_memory_bytes = 4 * size_mib * MIB
        for _ in range(repeats + 1):
            started = time.perf_counter()
            box = client.empty(x.shape, x.dtype)
            np.copyto(box, x)
            copied = time.perf_counter() - started
            out = client.compute("reduce_sum", x=box)
            samples.append(copied + out.job["timings"]["h2d_ms"] / 1e3)
            del box, out
    return samples


def out_of_worker(socket_path: str, size_mib: int, repeats: int) -> list[float]:
    """The worker's write of vector_add's c into the client's memory (the job's d2h_ms)."""
    samples = []
    with Client(socket_path, timeout_s=600) as client:
        client.shared_memory_bytes = 4 * size_mib * MIB
        a = client.empty(size_mib * MIB // 4, "float32")
        a[:] = 1
        for _ in range(repeats + 1):
            out = client.compute("vector_add", a=a, b=a)
            samples.append(out.job["timings"]["d2h_ms"] / 1e3)
            del out
    return samples


def end_to_end(socket_path: str, size_mib: int, repeats: int, in_place: bool) -> list[float]:
    import numpy as np

    n = size_mib * MIB // 4
    samples = []
    with Client(socket_path, timeout_s=600) as client:
        client.shared_memory_bytes = 4 * size_mib * MIB
        if in_place:
            a, b = client.empty(n, "float32"), client.empty(n, "float32")
        else:
            a, b = np.empty(n, np.float32), np.empty(n, np.float32)
        a[:], b[:] = 1, 2
        for _ in range(repeats + 1):
            seconds, out = timed(lambda: client.compute("vector_add", a=a, b=b))
            assert out["c"][0] == 3 and out["c"].shape == (n,)
            samples.append(seconds)
            del out
    return samples


def ray_end_to_end(sizes_mib: list[int], repeats: int) -> dict[int, list[float]]:
    import numpy as np
    import ray

    temp_root = tempfile.mkdtemp(prefix="tgd-ray-", dir="/tmp")
    os.environ.update(RAY_TMPDIR=temp_root, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        object_store_memory=4 * max(sizes_mib) * MIB * 2,
    )
    try:

        class Adder:
            def add(self, a: Any, b: Any) -> Any:
                return a + b

        actor: Any = ray.remote(Adder).remote()
        results = {}
        for size_mib in sizes_mib:
            n = size_mib * MIB // 4
            a, b = np.ones(n, np.float32), np.full(n, 2, np.float32)

            def call(a: Any = a, b: Any = b) -> Any:
                return ray.get(actor.add.remote(ray.put(a), ray.put(b)))

            samples = []
            for _ in range(repeats + 1):
                seconds, c = timed(call)
                assert c[0] == 3
                samples.append(seconds)
                del c
            results[size_mib] = samples
        return results
    finally:
        ray.shutdown()
        shutil.rmtree(temp_root, ignore_errors=True)


def report(rows: dict[str, dict[int, list[float]]], sizes_mib: list[int]) -> str:
    lines = [
        "| path | size | first s | warm s | warm GiB/s | warm vs memcpy |",
        "|---|---|---|---|---|---|",
    ]
    for name, by_size in rows.items():
        for size_mib in sizes_mib:
            if size_mib not in by_size:
                continue
            first, warm = first_and_warm(by_size[size_mib])
            copy = first_and_warm(rows["memcpy"][size_mib])[1]
            lines.append(
                f"| {name} | {size_mib} MiB | {first:.4f} | {warm:.4f} | "
                f"{size_mib * MIB / GIB / warm:.2f} | {copy / warm:.2f}× |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    rows: dict[str, dict[int, list[float]]] = {"memcpy": {}}
    names = (
        "into a worker (copy in + map)",
        "out of a worker (write into client memory)",
        "end to end, plain ndarrays (one copy in each)",
        "end to end, client.empty arrays (no copy in)",
    )
    for name in names:
        rows[name] = {}
    with running() as daemon:
        socket_path = str(daemon.socket_path)
        for size_mib in args.sizes:
            rows["memcpy"][size_mib] = memcpy(size_mib, args.repeats)
            rows[names[0]][size_mib] = into_worker(socket_path, size_mib, args.repeats)
            rows[names[1]][size_mib] = out_of_worker(socket_path, size_mib, args.repeats)
            rows[names[2]][size_mib] = end_to_end(socket_path, size_mib, args.repeats, False)
            rows[names[3]][size_mib] = end_to_end(socket_path, size_mib, args.repeats, True)
    if not args.no_ray:
        rows["Ray: put a, put b, actor add, get"] = ray_end_to_end(args.sizes, args.repeats)
    print(report(rows, args.sizes))


if __name__ == "__main__":
    main()
