"""A/B of the tiny-job dispatch: two source trees of taogpud, alternating, in one run.

    python bench/ab.py BASE_TREE NEW_TREE [--rounds 2] [--peers] [--repeats 3]

Each round measures the base tree, then the new one (each in a process of its own, with that
tree first on PYTHONPATH, so the daemon it starts runs that tree's code): tiny-job p50 and
jobs/s with 1 client, jobs/s with 8, and the daemon's CPU per job under the 8-client load
(user + system time from /proc). With --peers, Ray's warm actor and dask run once, between
the first and second round, so every row has a neighbour in time. On a shared host only
numbers within one run compare; this script is how each change in docs/performance.md was
judged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # `python bench/ab.py`: the package from this tree for the driver
    sys.path.insert(0, str(HERE))


def one_tree(repeats: int) -> dict[str, float]:
    """Measure the tree this process imports taogpud from (printed as JSON by --one)."""
    from bench.daemon_under_test import running
    from bench.dispatch import CLIENTS, plans
    from bench.load import in_processes, sequential
    from bench.peers.taogpud_client import open_caller
    from bench.procs import cpu_s, descendants

    one, many = plans("taogpud", repeats, quick=False)
    with running() as daemon:
        path = str(daemon.socket_path)
        with open_caller(path) as call:
            seq = sequential(call, one)
        pid = daemon.proc.pid
        workers = descendants(pid)
        before = cpu_s(pid), sum(map(cpu_s, workers))
        concurrent = in_processes(open_caller, [(path,)] * CLIENTS, many)
        after = cpu_s(pid), sum(map(cpu_s, workers))
    jobs = sum(len(run.latencies_s) for run in concurrent)
    return {
        "p50_ms": _median([run.p50_ms for run in seq]),
        "one_jobs_per_s": _median([run.jobs_per_s for run in seq]),
        "many_jobs_per_s": _median([run.jobs_per_s for run in concurrent]),
        "daemon_us_per_job": (after[0] - before[0]) / jobs * 1e6,
        "workers_us_per_job": (after[1] - before[1]) / jobs * 1e6,
    }


def peers(repeats: int) -> dict[str, dict[str, float]]:
    """Ray's warm actor and dask, as bench/run.py measures them."""
    from bench.dispatch import CLIENTS, plans
    from bench.load import isolated
    from bench.peers import dask_local, ray_local

    found: dict[str, dict[str, float]] = {}
    for name, module, kind in (("ray", ray_local, "ray"), ("dask", dask_local, "dask")):
        one, many = plans(kind, repeats, quick=False)
        rows, _ = isolated(module.measure, one, CLIENTS, many)
        first = rows[0]  # the warm actor's rows come first for Ray
        by_clients = {row.clients: row for row in rows if row.system == first.system}
        found[name] = {
            "p50_ms": by_clients[1].p50_ms.median,
            "one_jobs_per_s": by_clients[1].jobs_per_s.median,
            "many_jobs_per_s": by_clients[CLIENTS].jobs_per_s.median,
        }
    return found


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _measure_in(tree: Path, what: str, repeats: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # This script drives every tree (a base from before it has none); the daemon it starts
    # inherits PYTHONPATH, so it runs the tree's own code.
    command = [
        sys.executable,
        str(HERE / "bench" / "ab.py"),
        f"--{what}",
        "--repeats",
        str(repeats),
    ]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} in {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()[:2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", action="store_true", help="Ray's warm actor and dask too")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peers-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_tree(args.repeats)))
        return
    if args.peers_only:
        print(json.dumps(peers(args.repeats)))
        return
    for round_ in range(args.rounds):
        for label, tree in zip(("base", "new"), args.trees, strict=True):
            result = _measure_in(tree.resolve(), "one", args.repeats)
            print(json.dumps({"round": round_ + 1, "tree": label, "load": _load(), **result}))
            sys.stdout.flush()
        if args.peers and round_ == 0:
            print(json.dumps({"peers": _measure_in(HERE, "peers-only", args.repeats)}))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
