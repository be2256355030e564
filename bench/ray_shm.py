"""A client's own memory under the Ray executor vs the HTTP body, in the same run (issue 22).

    python -m bench.ray_shm [--sizes 64 256] [--repeats 5]

One daemon with `executor = "ray"` on a private local Ray (2 actors, the CPU backend), with
bench/ray_executor.py's config. For each size, float32 `vector_add` end to end, client
ndarrays in, an ndarray of c back in the client:

- shared memory: `client.compute` with a and b made by `client.empty` (the `.shm` socket: the
  actor maps the client's memfd and writes c in place);
- HTTP body: what `compute` falls back to where no descriptor can pass (a cluster): upload a
  and b, the job with its output kept (object store in, the array back, the daemon's write),
  download c.

First call and the median of the warm ones. The numbers decide docs/ray.md's choice.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.daemon_under_test import Client, running
from bench.ray_executor import RAY_LOCAL

MIB = 1 << 20


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def shared(socket_path: str, n: int, repeats: int) -> list[float]:
    with Client(socket_path, timeout_s=600) as client:
        client.shared_memory_bytes = 4 * n * 4
        a, b = client.empty(n, "float32"), client.empty(n, "float32")
        a[:], b[:] = 1, 2

        def once() -> None:
            out = client.compute("vector_add", a=a, b=b)
            assert out.job["memory"]["handover"] == "shared" and out["c"][-1] == 3

        return [timed(once) for _ in range(repeats + 1)]


def over_http(socket_path: str, n: int, repeats: int) -> list[float]:
    import numpy as np

    a, b = np.ones(n, np.float32), np.full(n, 2, np.float32)
    with Client(socket_path, timeout_s=600) as client:

        def once() -> None:
            ids = {"a": client.upload_array(a)["id"], "b": client.upload_array(b)["id"]}
            job = client.run("vector_add", {}, inputs=ids, keep_outputs=True)
            c = np.load(io.BytesIO(client.download_output(job["id"], "c")))
            assert c[-1] == 3

        return [timed(once) for _ in range(repeats + 1)]


def row(socket_path: str, size_mib: int, repeats: int) -> None:
    n = size_mib * MIB // 4
    for name, measure in (("shared memory", shared), ("HTTP body", over_http)):
        samples = measure(socket_path, n, repeats)
        warm = statistics.median(samples[1:])
        print(f"| {name} | {size_mib} MiB | {samples[0]:.3f} | {warm:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| path | size (a and b each) | first s | warm s (median) |\n|---|---|---|---|")
    ray_root = tempfile.mkdtemp(prefix="tgd-ray-", dir="/tmp")
    # the daemon inherits these: Ray's files in a temp dir, a test instance without auth
    os.environ.update(RAY_TMPDIR=ray_root, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    try:
        with running(config=RAY_LOCAL) as daemon:
            for size_mib in args.sizes:
                row(str(daemon.socket_path), size_mib, args.repeats)
    finally:
        shutil.rmtree(ray_root, ignore_errors=True)


if __name__ == "__main__":
    main()
