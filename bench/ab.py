"""A/B of the tiny-job dispatch: two source trees of taogpud, alternating, in one run.

    python -m bench.ab BASE NEW [--rounds 2] [--peers] [--data] [--repeats 3] [--out FILE]

Each round measures the base tree, then the new one, each in a process of its own with that
tree first on PYTHONPATH, so the daemon it starts runs that tree's code (this script drives
both): tiny-job p50 and jobs/s with 1 client, jobs/s with 8, and the daemon's and workers'
CPU per job under the 8-client load (user + system time from /proc). With --peers, Ray's
warm actor and dask run once, after the first round, so the rows have neighbours in time,
and the targets of bench/targets.py are judged on the new tree's rows. With --data, each
tree's daemon also moves a 512 MiB array up and down (upload_array, download_output, the
better of two), after its CPU counts, so one run holds both trees' data path beside their
dispatch. --out writes the tables as markdown. On a shared host only numbers within one
run compare; this is how each change in docs/performance.md was judged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# `python -m bench.ab` from the root; each measuring child runs this file with its own tree
# on PYTHONPATH, so the bench package it imports is that tree's.
HERE = Path(__file__).resolve().parent.parent

Numbers = dict[str, Any]
DATA_MIB, DATA_REPEATS = 512, 2


def one_tree(repeats: int, data: bool = False) -> Numbers:
    """Measure the tree this process imports taogpud from: every repeat's figures."""
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
        moved = data_path(path) if data else {}
    jobs = sum(len(run.latencies_s) for run in concurrent)
    return {
        "p50_ms": [run.p50_ms for run in seq],
        "one_jobs_per_s": [run.jobs_per_s for run in seq],
        "many_jobs_per_s": [run.jobs_per_s for run in concurrent],
        "daemon_us_per_job": (after[0] - before[0]) / jobs * 1e6,
        "workers_us_per_job": (after[1] - before[1]) / jobs * 1e6,
        **moved,
    }


def data_path(socket_path: str) -> Numbers:
    """DATA_MIB MiB through this tree's daemon, in GiB/s, the better of DATA_REPEATS: its own
    bench/datapath.py measures, whose names have not changed since before issue 18."""
    from bench import datapath

    (result,) = datapath.measure(socket_path, [DATA_MIB], DATA_REPEATS)
    return {
        "upload_gib_s": result.gib_per_s[datapath.UPLOAD_ARRAY].high,
        "download_gib_s": result.gib_per_s[datapath.DOWNLOAD].high,
    }


def peers(repeats: int) -> dict[str, Numbers]:
    """Ray's warm actor and dask, as bench/run.py measures them."""
    from bench.dispatch import CLIENTS, plans
    from bench.load import isolated
    from bench.peers import dask_local, ray_local
    from bench.targets import RAY_ACTOR

    found: dict[str, Numbers] = {}
    for module, kind, system in (
        (ray_local, "ray", RAY_ACTOR),
        (dask_local, "dask", dask_local.NAME),
    ):
        one, many = plans(kind, repeats, quick=False)
        rows, _ = isolated(module.measure, one, CLIENTS, many)
        by_clients = {row.clients: row for row in rows if row.system == system}
        found[system] = {
            "p50_ms": _spread_values(by_clients[1].p50_ms),
            "one_jobs_per_s": _spread_values(by_clients[1].jobs_per_s),
            "many_jobs_per_s": _spread_values(by_clients[CLIENTS].jobs_per_s),
        }
    return found


def _spread_values(spread: Any) -> list[float]:
    """A peer's repeats come back as a Spread: its median, low and high stand for them."""
    return [spread.median, spread.low, spread.high]


def _measure_in(tree: Path, what: str, repeats: int, data: bool = False) -> Any:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [
        sys.executable,
        str(HERE / "bench" / "ab.py"),
        f"--{what}",
        "--repeats",
        str(repeats),
        *(["--data"] if data else []),
    ]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg()[:2])


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


# -- the report ---------------------------------------------------------------------------


def rows_of(system: str, numbers: list[Numbers]) -> list[Any]:
    """DispatchRows over every repeat of every round, as bench/targets.py reads them."""
    from bench.dispatch import CLIENTS
    from bench.stats import DispatchRow, Spread

    def pooled(key: str) -> Spread:
        return Spread.of(value for entry in numbers for value in entry[key])

    return [
        DispatchRow(system, 1, jobs_per_s=pooled("one_jobs_per_s"), p50_ms=pooled("p50_ms")),
        DispatchRow(system, CLIENTS, jobs_per_s=pooled("many_jobs_per_s"), p50_ms=None),
    ]


def markdown(rounds: list[Numbers], found_peers: dict[str, Numbers] | None, started: str) -> str:
    from bench.peers import taogpud_client
    from bench.report import _targets
    from bench.targets import evaluate

    lines = [
        f"A/B run of `bench/ab.py`, started {started}; medians of each measurement's repeats.",
        "",
        "| round | tree | load 1 / 5 min | p50 ms | 1 client jobs/s | 8 clients jobs/s | "
        "daemon µs/job (8 clients) | workers µs/job |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for entry in rounds:
        lines.append(
            f"| {entry['round']} | {entry['tree']} | {entry['load']} | "
            f"{_median(entry['p50_ms']):.3f} | {_median(entry['one_jobs_per_s']):,.0f} | "
            f"{_median(entry['many_jobs_per_s']):,.0f} | {entry['daemon_us_per_job']:,.0f} | "
            f"{entry['workers_us_per_job']:,.0f} |"
        )
    lines += _data_table(rounds)
    if not found_peers:
        return "\n".join(lines) + "\n"
    lines += ["", "| peer, the same run | p50 ms | 1 client jobs/s | 8 clients jobs/s |"]
    lines.append("|---|---:|---:|---:|")
    for system, numbers in found_peers.items():
        lines.append(
            f"| {system} | {numbers['p50_ms'][0]:.3f} | {numbers['one_jobs_per_s'][0]:,.0f} | "
            f"{numbers['many_jobs_per_s'][0]:,.0f} |"
        )
    peer_rows = [row for system, n in found_peers.items() for row in rows_of(system, [n])]
    for tree in ("base", "new"):
        ours = [entry for entry in rounds if entry["tree"] == tree]
        rows = rows_of(taogpud_client.NAME, ours) + peer_rows
        table = _targets(evaluate(rows, [], 8)).split("\n", 1)[1]  # without its heading
        lines += ["", f"Targets on the **{tree}** tree's repeats (all rounds):", table.strip()]
    return "\n".join(lines) + "\n"


def _data_table(rounds: list[Numbers]) -> list[str]:
    """The data path's rows, when the run measured it (--data)."""
    if not rounds or not all("upload_gib_s" in entry for entry in rounds):
        return []
    lines = [
        "",
        f"| round | tree | {DATA_MIB} MiB upload_array, GiB/s | "
        f"{DATA_MIB} MiB download_output, GiB/s |",
        "|---|---|---:|---:|",
    ]
    for entry in rounds:
        lines.append(
            f"| {entry['round']} | {entry['tree']} | {entry['upload_gib_s']:.2f} | "
            f"{entry['download_gib_s']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", action="store_true", help="Ray's warm actor and dask too")
    parser.add_argument("--data", action="store_true", help=f"{DATA_MIB} MiB up and down too")
    parser.add_argument("--out", type=Path, help="write the tables here as markdown")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peers-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_tree(args.repeats, args.data)))
        return
    if args.peers_only:
        print(json.dumps(peers(args.repeats)))
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rounds: list[Numbers] = []
    found_peers = None
    for round_ in range(args.rounds):
        for label, tree in zip(("base", "new"), args.trees, strict=True):
            load = _load()
            result = _measure_in(tree.resolve(), "one", args.repeats, args.data)
            rounds.append({"round": round_ + 1, "tree": label, "load": load, **result})
            print(json.dumps(rounds[-1]), flush=True)
        if args.peers and round_ == 0:
            found_peers = _measure_in(HERE, "peers-only", args.repeats)
            print(json.dumps({"peers": found_peers}), flush=True)
    report = markdown(rounds, found_peers, started)
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
