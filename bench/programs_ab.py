"""Issue 37's throughput goal, two source trees alternated in one run, task-spooler beside.

    python -m bench.programs_ab BASE NEW [--rounds 4] [--seconds 4] [--as-packaged] [--out FILE]

Each round measures the base tree, the new one and `tsp -f` (the order reversed each other
round, so that each meets the same stretches of a shared host): 8 submitter processes run
`true` back to back for `--seconds`, through the Python client (ProgramRun, a slot of the
CPU pair each: `--share`, 1 MiB) or through task-spooler (8 slots). A tree is measured in a
process of its own with that tree first on PYTHONPATH (this file run there with --one), so
the daemon it starts and the client its submitters use are that tree's. The server's CPU a
program (the daemon's, or task-spooler's server's) is the time its threads ran over the
window (/proc/PID/task/*/schedstat), divided by the programs finished in it; beside it, the
shares of the window it ran and it waited to run (runnable, on the run queue): a server that
ran or waited to run all the window long was what bounded the rate. The submitters' own
CPU and their children's (`true`; for tsp, the `tsp` clients and the `true` each runs)
complete the program's CPU. On a shared host only the numbers of one run compare: the
medians over the rounds are the result.

`--as-packaged` (root) lays the processes out in CPU control groups as a host running the
package does: the server (the daemon and its workers; task-spooler's server alike) in a group
of its own, as systemd runs taogpud.service under system.slice, and the submitters with their
children in another, as a user's session runs under user.slice. systemd gives both slices the
same weight, so under contention the service gets up to half the CPU however many processes
the users run; without the option every process of the bench competes in one group, one
process's share each, as a daemon started by hand gets.
"""

from __future__ import annotations

import argparse
import contextlib
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
PROC = Path("/proc")
SETTLE_S = 2.0  # the submitters start together this long after they are spawned
# --as-packaged: the two CPU groups (cgroup v2 with its cpu controller, else v1's cpu
# hierarchy), equal weights as systemd's system.slice and user.slice have by default.
CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu"))
SERVICE_GROUP, USERS_GROUP = "tgd-bench-service", "tgd-bench-users"
CONFIG = {"backend": {"cuda": {"stream_count": 4}}}  # CPU slots: 2 devices × 4
# One submitter: `true` back to back from START to END (time.time()); prints how many ended,
# its own CPU seconds over them (user + system) and its children's (`true`, `tsp`: waited for).
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
children = after.children_user + after.children_system - cpu.children_user - cpu.children_system
print(done, after.user + after.system - cpu.user - cpu.system, children)
"""
Numbers = dict[str, Any]


def submit_for(way: str, seconds: float, env: dict[str, str], server: int | None) -> Numbers:
    """SUBMITTERS processes of `way` (a socket path, or "tsp") for `seconds`; `server`: the
    pid of the process that serves them (None: a warm-up, not measured). Laid out as
    packaged (the groups exist), the submitters join the users' group before they start."""
    start = time.time() + SETTLE_S
    end = start + seconds
    command = [sys.executable, "-c", SUBMITTER, way, str(start), str(end)]
    submitters = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(SUBMITTERS)
    ]
    for submitter in submitters:
        join_group(USERS_GROUP, submitter.pid)
    time.sleep(max(0.0, start - time.time()))
    ran_before, waited_before = scheduled_s(server) if server else (0.0, 0.0)
    time.sleep(max(0.0, end - time.time()))
    ran_after, waited_after = scheduled_s(server) if server else (0.0, 0.0)
    said = [p.communicate()[0].split() for p in submitters]
    programs = max(sum(int(count) for count, _, _ in said), 1)
    return {
        "programs_per_s": programs / seconds,
        "programs": programs,
        "server_ms_per_program": (ran_after - ran_before) / programs * 1e3,
        "server_running": (ran_after - ran_before) / seconds,  # shares of the window
        "server_waiting": (waited_after - waited_before) / seconds,
        "submitter_ms_per_program": sum(float(cpu) for _, cpu, _ in said) / programs * 1e3,
        "children_ms_per_program": sum(float(cpu) for _, _, cpu in said) / programs * 1e3,
    }


def one_tree(seconds: float) -> Numbers:
    """This process's tree: its daemon, its client, 8 submitters."""
    from bench.daemon_under_test import running
    from bench.procs import descendants

    with running(config=CONFIG) as daemon:
        for pid in [daemon.proc.pid, *descendants(daemon.proc.pid)]:  # its workers too
            join_group(SERVICE_GROUP, pid)
        env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        submit_for(str(daemon.socket_path), 0.5, env, None)  # warm: bytecode, the first leases
        return submit_for(str(daemon.socket_path), seconds, env, daemon.proc.pid)


@contextmanager
def task_spooler() -> Iterator[tuple[dict[str, str], int]]:
    """A task-spooler server of its own with SUBMITTERS slots: the environment to reach it,
    and its pid."""
    if shutil.which("tsp") is None:
        sys.exit("task-spooler is missing: apt-get install task-spooler (its binary is tsp)")
    folder = Path(tempfile.mkdtemp(prefix="tgd-tsp-"))
    env = {**os.environ, "TS_SOCKET": str(folder / "socket"), "TMPDIR": str(folder)}
    subprocess.run(["tsp", "-S", str(SUBMITTERS)], env=env, check=True)
    try:
        yield env, _tsp_server(env["TS_SOCKET"])
    finally:
        subprocess.run(["tsp", "-K"], env=env, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def scheduled_s(pid: int) -> tuple[float, float]:
    """Seconds the process's threads have run, and waited to run while runnable (on the run
    queue: /proc/PID/task/TID/schedstat), so far. Here, not in bench/procs.py: this file runs
    with the measured tree's `bench` first on the path (measure_tree)."""
    ran = waited = 0
    with contextlib.suppress(OSError):
        for task in (PROC / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError):
                fields = (task / "schedstat").read_text().split()
                ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran / 1e9, waited / 1e9


def cpu_group_root() -> Path | None:
    """Where CPU groups are made here: cgroup v2 with its cpu controller, or v1's cpu."""
    unified = CGROUP_ROOTS[0] / "cgroup.controllers"
    if unified.exists() and "cpu" in unified.read_text().split():
        return CGROUP_ROOTS[0]
    return CGROUP_ROOTS[1] if (CGROUP_ROOTS[1] / "cpu.shares").exists() else None


@contextmanager
def packaged_groups() -> Iterator[None]:
    """The service's group and the users' (equal weights: the defaults), removed after."""
    root = cpu_group_root()
    if root is None or os.geteuid() != 0:
        sys.exit("--as-packaged needs root and a cpu cgroup controller (v2 or v1's cpu)")
    if root == CGROUP_ROOTS[0]:  # v2: children of the root get the cpu controller
        (root / "cgroup.subtree_control").write_text("+cpu")
    groups = [root / name for name in (SERVICE_GROUP, USERS_GROUP)]
    for group in groups:
        group.mkdir(exist_ok=True)
    try:
        yield
    finally:
        for group in groups:
            with contextlib.suppress(OSError):  # still busy: a process that outlived the run
                group.rmdir()


def join_group(name: str, pid: int) -> None:
    """Move `pid` into the group `name` where the run made it (--as-packaged); else nothing."""
    root = cpu_group_root()
    if root is not None and (root / name).is_dir():
        with contextlib.suppress(ProcessLookupError):
            (root / name / "cgroup.procs").write_text(str(pid))


def _tsp_server(socket_path: str) -> int:
    """The pid of the task-spooler server on `socket_path` (it runs on, detached, after the
    `tsp` that started it; its environment names the socket)."""
    marker = f"TS_SOCKET={socket_path}\0".encode()
    for entry in PROC.iterdir():
        with contextlib.suppress(OSError):
            if (entry / "comm").read_text().strip() == "tsp" and marker in (
                entry / "environ"
            ).read_bytes():
                return int(entry.name)
    raise RuntimeError(f"no task-spooler server found for {socket_path}")


def measure_tree(tree: Path, seconds: float) -> Numbers:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(HERE / "bench" / "programs_ab.py"), "--one"]
    command += ["--seconds", str(seconds)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tree} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


WAYS = ("base", "new", "tsp -f")
SHARES = (  # the second table's columns: (heading, key, format)
    ("server ms", "server_ms_per_program", "{:.2f}"),
    ("server running", "server_running", "{:.0%}"),
    ("server waiting to run", "server_waiting", "{:.0%}"),
    ("submitters ms", "submitter_ms_per_program", "{:.2f}"),
    ("their children ms", "children_ms_per_program", "{:.2f}"),
    ("all ms", "all_ms_per_program", "{:.2f}"),
)


def report(rows: list[Numbers], started: str, as_packaged: bool) -> str:
    """Programs/s by round, then where a program's CPU went (medians over the rounds)."""
    layout = " --as-packaged" if as_packaged else ""
    lines = [
        f"`python -m bench.programs_ab{layout}`, started {started}: 8 submitters of `true`, "
        "programs/s (the server's ms of CPU a program; the share of the window it ran or "
        "waited to run: near 100%, the server bounded the rate).",
        "",
        "| round | load 1 min | base | new | tsp -f |",
        "|---|---|---:|---:|---:|",
    ]
    for number in sorted({row["round"] for row in rows}):
        of = {row["way"]: row for row in rows if row["round"] == number}
        cells = [_cell(of[way]) for way in WAYS]
        lines.append(f"| {number} | {of['base']['load']:.1f} | " + " | ".join(cells) + " |")
    medians = [f"**{_median(rows, way, 'programs_per_s'):,.0f}**" for way in WAYS]
    lines += ["| **median** | | " + " | ".join(medians) + " |", ""]
    lines += [
        "CPU a program, ms, and the server's wait (medians over the rounds; the server is the "
        "daemon, or task-spooler's; the submitters' children are `true`, or `tsp -f` and its "
        "`true`):",
        "",
        "| way | " + " | ".join(heading for heading, _, _ in SHARES) + " |",
        "|---|" + "---:|" * len(SHARES),
    ]
    for way in WAYS:
        cells = [form.format(_median(rows, way, key)) for _, key, form in SHARES]
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(row: Numbers) -> str:
    return (
        f"{row['programs_per_s']:,.0f} ({row['server_ms_per_program']:.2f}; "
        f"{row['server_running'] + row['server_waiting']:.0%})"
    )


def _median(rows: list[Numbers], way: str, key: str) -> float:
    mine = [row for row in rows if row["way"] == way]
    if key == "all_ms_per_program":
        parts = ("server_ms_per_program", "submitter_ms_per_program", "children_ms_per_program")
        return statistics.median(sum(float(row[part]) for part in parts) for row in mine)
    return statistics.median(float(row[key]) for row in mine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--as-packaged", action="store_true", help="the service's CPU group")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_tree(args.seconds)))
        return
    base, new = (tree.resolve() for tree in args.trees)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[Numbers] = []
    layout = packaged_groups() if args.as_packaged else contextlib.nullcontext()
    with layout, task_spooler() as (tsp_env, tsp_server):
        join_group(SERVICE_GROUP, tsp_server)  # as the daemon's: a server's group of its own
        ways = {
            "base": lambda: measure_tree(base, args.seconds),
            "new": lambda: measure_tree(new, args.seconds),
            "tsp -f": lambda: submit_for("tsp", args.seconds, tsp_env, tsp_server),
        }
        for number in range(1, args.rounds + 1):
            order = list(ways) if number % 2 else list(reversed(ways))
            for way in order:
                load = os.getloadavg()[0]
                rows.append({"round": number, "way": way, "load": load, **ways[way]()})
                print(json.dumps(rows[-1]), flush=True)
    text = report(rows, started, args.as_packaged)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
