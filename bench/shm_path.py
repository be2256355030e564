"""Arrays through the client's own shared memory (docs/shared-memory.md), beside memcpy and Ray.

One run, float32 arrays of each size, each path a "lane" sampled in turn, round after round
(the lanes' order rotates each round), so a noisy host slows them all alike:

- memcpy: numpy copyto into a warm buffer of the same size (the bar: ≥ 80% for a handover);
- into a worker: the client's copy of an ndarray into its shared memory plus the worker's
  mapping of it (the job's h2d_ms on the CPU backend: mapping, no device copy), for
  `reduce_sum(x)`;
- out of a worker: vector_add computes c into the client's memory (`written: in_place`), so
  the job's d2h_ms is all that is left of the way out; and the copy fallback (a task that
  makes its output itself): pool/regions.py's write_outputs of a host array into warm
  client memory, run in this process on the same code;
- end to end: wall time of `client.compute("vector_add", a=a, b=b)` → an ndarray in the
  client, with a and b plain ndarrays (one copy each in) and made by `client.empty` (none);
- Ray: `ray.put(a)`, `ray.put(b)`, an actor's add and float64 checksum of c (vector_add's
  own work), `ray.get` of the result: end to end.

First call (a new client: its memory's pages allocated on the way; Ray's first put of that
size) and warm calls (median).

    python -m bench.shm_path --sizes 64 512 --repeats 7 [--no-ray] [--out F.md]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.daemon_under_test import Client, running

MIB = 1 << 20
GIB = 1 << 30
Sample = Callable[[], float]  # one timed call of a lane, in seconds


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


def memcpy_lane(n: int) -> Sample:
    import numpy as np

    source = np.ones(n, np.float32)
    target = np.empty_like(source)
    target[:] = 0  # warm
    return lambda: timed(lambda: np.copyto(target, source))[0]


def into_worker_lane(client: Client, n: int) -> Sample:
    """Client copy into its memory + the worker mapping it (reduce_sum's h2d_ms)."""
    import numpy as np

    x = np.ones(n, np.float32)

    def sample() -> float:
        started = time.perf_counter()
        box = client.empty(x.shape, x.dtype)
        np.copyto(box, x)
        copied = time.perf_counter() - started
        out = client.compute("reduce_sum", x=box, out_bytes=4096)
        return copied + float(out.job["timings"]["h2d_ms"]) / 1e3

    return sample


def out_of_worker_lane(client: Client, n: int) -> Sample:
    """What is left of the way out once vector_add computed c in place: its d2h_ms."""
    a = client.empty(n, "float32")
    a[:] = 1

    def sample() -> float:
        out = client.compute("vector_add", a=a, b=a, out_bytes=n * 4)
        assert out.job["outputs"][0]["written"] == "in_place", out.job["outputs"]
        return float(out.job["timings"]["d2h_ms"]) / 1e3

    return sample


def copy_fallback_lane(n: int) -> Sample:
    """regions.write_outputs of a host array into warm client memory (this process's memfd,
    opened through /proc/self/fd as a worker opens the daemon's): the copy a task that makes
    its own output costs."""
    import numpy as np

    from taogpud.memfd import regions
    from taogpud.memfd.client import Arena

    arena = Arena(n * 4 + MIB)
    offset = arena.allocate(n * 4)
    stat = os.fstat(arena.fd)
    memory = regions.MemoryHandle(os.getpid(), arena.fd, stat.st_dev, stat.st_ino, arena.size, True)
    region = regions.RegionRef(memory, offset, (n * 4,), "|u1", n * 4)
    c = np.full(n, 3, np.float32)

    def sample() -> float:
        maps: list[Any] = []
        started = time.perf_counter()
        regions.write_outputs(
            lambda a, out: np.copyto(out, a), {"c": c}, regions.OutputSpace(region, maps), "copy"
        )
        seconds = time.perf_counter() - started
        for hold in maps:
            hold.close()
        return seconds

    sample()  # the worker's mapping is kept across jobs: warm it as a worker's would be
    return sample


def end_to_end_lane(client: Client, n: int, in_place: bool) -> Sample:
    import numpy as np

    if in_place:
        a, b = client.empty(n, "float32"), client.empty(n, "float32")
    else:
        a, b = np.empty(n, np.float32), np.empty(n, np.float32)
    a[:], b[:] = 1, 2

    def sample() -> float:
        seconds, out = timed(lambda: client.compute("vector_add", a=a, b=b, out_bytes=n * 4))
        assert out["c"][0] == 3 and out["c"].shape == (n,)
        del out
        return seconds

    return sample


@contextlib.contextmanager
def ray_actor(max_size_mib: int) -> Iterator[Any]:
    import ray

    temp_root = tempfile.mkdtemp(prefix="tgd-ray-", dir="/tmp")
    os.environ.update(RAY_TMPDIR=temp_root, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        object_store_memory=8 * max_size_mib * MIB,
    )
    try:

        class Adder:
            def add(self, a: Any, b: Any) -> Any:
                # vector_add's own work, so both sides do the same: the add, and the
                # checksum of c in float64 that its summary carries (tasks/builtin.py).
                c = a + b
                return c, float(c.sum(dtype="float64"))

        yield ray.remote(Adder).remote()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_root, ignore_errors=True)


def ray_lane(actor: Any, n: int) -> Sample:
    import numpy as np
    import ray

    a, b = np.ones(n, np.float32), np.full(n, 2, np.float32)

    def sample() -> float:
        seconds, (c, checksum) = timed(lambda: ray.get(actor.add.remote(ray.put(a), ray.put(b))))
        assert c[0] == 3 and checksum == 3 * n
        del c
        return seconds

    return sample


def run_lanes(lanes: dict[str, Callable[[], Sample]], repeats: int) -> dict[str, list[float]]:
    """Each lane built (its first call is sample 0), then `repeats` rounds of one sample per
    lane, the lanes' order rotated each round."""
    samplers, samples = {}, {}
    for name, build in lanes.items():
        samplers[name] = build()
        samples[name] = [samplers[name]()]
    names = list(lanes)
    for round_number in range(repeats):
        turn = round_number % len(names)
        for name in names[turn:] + names[:turn]:
            samples[name].append(samplers[name]())
    return samples


def lanes_for(
    socket_path: str, size_mib: int, actor: Any, clients: list[Client]
) -> dict[str, Callable[[], Sample]]:
    n = size_mib * MIB // 4

    def client(arrays: int) -> Client:
        """A client whose memory holds `arrays` arrays of the size (and a page to spare): all
        lanes' memories at once stay under the uid's quota at 512 MiB."""
        made = Client(socket_path, timeout_s=600)
        made.shared_memory_bytes = arrays * size_mib * MIB + 2 * MIB
        clients.append(made)
        return made

    lanes: dict[str, Callable[[], Sample]] = {
        "memcpy": lambda: memcpy_lane(n),
        "into a worker (copy in + map)": lambda: into_worker_lane(client(1), n),
        "out of a worker, in place (d2h_ms)": lambda: out_of_worker_lane(client(2), n),
        "out of a worker, copy fallback": lambda: copy_fallback_lane(n),
        "end to end, plain ndarrays (one copy in each)": lambda: end_to_end_lane(
            client(3), n, False
        ),
        "end to end, client.empty arrays (no copy in)": lambda: end_to_end_lane(client(3), n, True),
    }
    if actor is not None:
        lanes["Ray: put a, put b, actor add, get"] = lambda: ray_lane(actor, n)
    return lanes


def report(rows: dict[int, dict[str, list[float]]]) -> str:
    lines = [
        "| path | size | first s | warm s (median) | warm min–max s | warm GiB/s | vs memcpy "
        "| vs memcpy, paired |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size_mib, by_lane in rows.items():
        copies = by_lane["memcpy"][1:]
        copy = statistics.median(copies)
        for name, samples in by_lane.items():
            warm = statistics.median(samples[1:])
            rate = f"{size_mib * MIB / GIB / warm:.2f}" if warm > 1e-4 else "—"
            ratio = f"{copy / warm:.2f}×" if warm > 1e-4 else "—"
            # the same round's memcpy over this lane's: the host's mood cancels out
            paired = statistics.median(c / s for c, s in zip(copies, samples[1:], strict=True))
            pair = f"{paired:.2f}×" if warm > 1e-4 else "—"
            lines.append(
                f"| {name} | {size_mib} MiB | {samples[0]:.4f} | {warm:.4f} | "
                f"{min(samples[1:]):.4f}–{max(samples[1:]):.4f} | {rate} | {ratio} | {pair} |"
            )
    return "\n".join([*lines, "", *ratios(rows)])


def ratios(rows: dict[int, dict[str, list[float]]]) -> list[str]:
    """Warm end to end against Ray, the goal's figure (≥ 2× at 512 MiB)."""
    ray = "Ray: put a, put b, actor add, get"
    found = []
    for size_mib, by_lane in rows.items():
        if ray not in by_lane:
            continue
        theirs = by_lane[ray][1:]
        for name in by_lane:
            if name.startswith("end to end"):
                ours = by_lane[name][1:]
                medians = statistics.median(theirs) / statistics.median(ours)
                paired = statistics.median(t / o for t, o in zip(theirs, ours, strict=True))
                found.append(
                    f"- {size_mib} MiB, {name}: {medians:.2f}× Ray (warm medians), "
                    f"{paired:.2f}× (paired by round)"
                )
    return found


def host_line(when: str) -> str:
    """The host's load and free memory: this bench's figures move with both."""
    available = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemAvailable:")
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"- host {when}: load average {load}; {available / GIB:.1f} GiB available"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    rows: dict[int, dict[str, list[float]]] = {}
    host = [host_line("before"), f"- {os.cpu_count()} CPUs; {args.repeats} warm rounds"]
    with contextlib.ExitStack() as stack:
        actor = None if args.no_ray else stack.enter_context(ray_actor(max(args.sizes)))
        daemon = stack.enter_context(running())
        for size_mib in args.sizes:
            clients: list[Client] = []
            try:
                lanes = lanes_for(str(daemon.socket_path), size_mib, actor, clients)
                rows[size_mib] = run_lanes(lanes, args.repeats)
            finally:
                for client in clients:
                    client.close()
    table = "\n".join([report(rows), *host, host_line("after")])
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
