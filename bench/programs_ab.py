"""Issue 37's throughput goal, two source trees alternated in one run, task-spooler beside.

    python -m bench.programs_ab BASE NEW [--rounds 4] [--seconds 4] [--out FILE]

Each round measures the base tree, the new one and `tsp -f` (the order reversed each other
round, so that each meets the same stretches of a shared host): 8 submitter processes run
`true` back to back for `--seconds`, through the Python client (ProgramRun, a slot of the
CPU pair each: `--share`, 1 MiB) or through task-spooler (8 slots). A tree is measured in a
process of its own with that tree first on PYTHONPATH (this file run there with --one), so
the daemon it starts and the client its submitters use are that tree's. The daemon's CPU a
program is its user + system time (/proc, every thread) over the window, divided by the
programs finished in it. On a shared host only the numbers of one run compare: the medians
over the rounds are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
SUBMITTERS = 8
SETTLE_S = 2.0  # the submitters start together this long after they are spawned
CONFIG = {"backend": {"cuda": {"stream_count": 4}}}  # CPU slots: 2 devices × 4
# One submitter: `true` back to back from START to END (time.time()); prints how many ended
# and its own CPU seconds over them (user + system; not its children's: `true`, `tsp`).
SUBMITTER = """
import os, subprocess, sys, time
way, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
if way == "tsp":
    run = lambda: subprocess.run(["tsp", "-f", "true"], stdout=subprocess.DEVNULL, check=True)
else:
    from taogpud.client import Client
    from taogpud.client.program import ProgramRun
    client = Client(way)
    def run():
        outcome = ProgramRun(client, ["true"], share=True, mem_bytes=1 << 20).run()
        assert outcome.job["status"] == "succeeded", outcome.job
time.sleep(max(0.0, start - time.time()))
done, cpu = 0, os.times()
while time.time() < end:
    run()
    done += time.time() <= end
after = os.times()
print(done, after.user + after.system - cpu.user - cpu.system)
"""
Numbers = dict[str, Any]


def submit_for(way: str, seconds: float, env: dict[str, str], watch_pid: int | None) -> Numbers:
    """SUBMITTERS processes of `way` (a socket path, or "tsp") for `seconds`."""
    from bench.procs import cpu_s

    start = time.time() + SETTLE_S
    end = start + seconds
    command = [sys.executable, "-c", SUBMITTER, way, str(start), str(end)]
    submitters = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(SUBMITTERS)
    ]
    time.sleep(max(0.0, start - time.time()))
    cpu_before = cpu_s(watch_pid) if watch_pid else 0.0
    time.sleep(max(0.0, end - time.time()))
    cpu_after = cpu_s(watch_pid) if watch_pid else 0.0
    said = [p.communicate()[0].split() for p in submitters]
    programs = sum(int(count) for count, _ in said)
    found: Numbers = {
        "programs_per_s": programs / seconds,
        "programs": programs,
        "submitter_ms_per_program": sum(float(cpu) for _, cpu in said) / max(programs, 1) * 1e3,
    }
    if watch_pid:
        found["daemon_ms_per_program"] = (cpu_after - cpu_before) / max(programs, 1) * 1e3
    return found


def one_tree(seconds: float) -> Numbers:
    """This process's tree: its daemon, its client, 8 submitters."""
    from bench.daemon_under_test import running

    with running(config=CONFIG) as daemon:
        env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        submit_for(str(daemon.socket_path), 0.5, env, None)  # warm: bytecode, the first leases
        return submit_for(str(daemon.socket_path), seconds, env, daemon.proc.pid)


@contextmanager
def task_spooler() -> Iterator[dict[str, str]]:
    """A task-spooler server of its own with SUBMITTERS slots: the environment to reach it."""
    if shutil.which("tsp") is None:
        sys.exit("task-spooler is missing: apt-get install task-spooler (its binary is tsp)")
    folder = Path(tempfile.mkdtemp(prefix="tgd-tsp-"))
    env = {**os.environ, "TS_SOCKET": str(folder / "socket"), "TMPDIR": str(folder)}
    subprocess.run(["tsp", "-S", str(SUBMITTERS)], env=env, check=True)
    try:
        yield env
    finally:
        subprocess.run(["tsp", "-K"], env=env, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def measure_tree(tree: Path, seconds: float) -> Numbers:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(HERE / "bench" / "programs_ab.py"), "--one"]
    command += ["--seconds", str(seconds)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tree} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(rows: list[Numbers], started: str) -> str:
    lines = [
        f"`python -m bench.programs_ab`, started {started}: 8 submitters of `true`, "
        "programs/s (the daemon's ms of CPU a program; the submitters' own, `true` and "
        "`tsp` apart).",
        "",
        "| round | load 1 min | base | new | tsp -f |",
        "|---|---|---:|---:|---:|",
    ]
    for number in sorted({row["round"] for row in rows}):
        of = {row["way"]: row for row in rows if row["round"] == number}
        cells = [_cell(of[way]) for way in ("base", "new", "tsp -f")]
        lines.append(f"| {number} | {of['base']['load']:.1f} | " + " | ".join(cells) + " |")
    medians = [_median(rows, way) for way in ("base", "new", "tsp -f")]
    lines.append("| **median** | | " + " | ".join(medians) + " |")
    return "\n".join(lines) + "\n"


def _cell(row: Numbers) -> str:
    cpu = row.get("daemon_ms_per_program")
    daemon = f"{cpu:.2f}; " if cpu is not None else ""
    return f"{row['programs_per_s']:,.0f} ({daemon}{row['submitter_ms_per_program']:.2f})"


def _median(rows: list[Numbers], way: str) -> str:
    mine = [row for row in rows if row["way"] == way]
    rate = statistics.median(row["programs_per_s"] for row in mine)
    client = statistics.median(row["submitter_ms_per_program"] for row in mine)
    if way == "tsp -f":
        return f"**{rate:,.0f} ({client:.2f})**"
    cpu = statistics.median(row["daemon_ms_per_program"] for row in mine)
    return f"**{rate:,.0f} ({cpu:.2f}; {client:.2f})**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_tree(args.seconds)))
        return
    base, new = (tree.resolve() for tree in args.trees)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[Numbers] = []
    with task_spooler() as tsp_env:
        ways = {
            "base": lambda: measure_tree(base, args.seconds),
            "new": lambda: measure_tree(new, args.seconds),
            "tsp -f": lambda: submit_for("tsp", args.seconds, tsp_env, None),
        }
        for number in range(1, args.rounds + 1):
            order = list(ways) if number % 2 else list(reversed(ways))
            for way in order:
                load = os.getloadavg()[0]
                rows.append({"round": number, "way": way, "load": load, **ways[way]()})
                print(json.dumps(rows[-1]), flush=True)
    text = report(rows, started)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
