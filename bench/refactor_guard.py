"""Issue 36's guard: the three ratios a pure refactor must hold, measured in one run.

    python -m bench.refactor_guard --label before [--rounds 5] [--shm-repeats 7] [--tree DIR]

- the tiny-job p50 with 1 client, taogpud's Python client against Ray local's warm actor;
- jobs/s with 8 clients, the same two;
- the shared-memory path: float32 `vector_add` end to end against Ray's put, put, actor add,
  get (warm medians, 64 and 512 MiB).

Dispatch is measured as bench/run.py measures it (bench/dispatch.py: rounds, the order
reversed each round, the same job counts), with only these two systems; the shared-memory
lanes are bench/shm_path.py's, only memcpy, the two end-to-end lanes and Ray's. Each run
appends a section, headed by its label and commit, to bench/results/refactor-guard.md: run
it before a refactor and after it, on the same host, and compare the ratios, not the
absolute numbers (a shared host moves those). With --tree, taogpud (client and daemon) comes
from DIR's taogpud/ and this bench from this checkout: before and after alternate in one
session, so the host's load meets both alike (a shell loop, docs/performance.md).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import taogpud
from bench import dispatch, host, shm_path
from bench.daemon_under_test import Client, running
from bench.dispatch import CLIENTS, DispatchResult
from bench.peers import ray_local, taogpud_client
from bench.stats import DispatchRow, Spread
from bench.targets import RAY_ACTOR

REPO = Path(__file__).resolve().parent.parent
# Ray's workers are interpreters of their own: they find bench.peers through PYTHONPATH.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

# py-spy beside this interpreter (the venv's), else on PATH.
PY_SPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
SHIM_PREFIX = "tgd-guard-tree-"
RESULTS = REPO / "bench" / "results" / "refactor-guard.md"
SHM_SIZES_MIB = [64, 512]
RAY_LANE = "Ray: put a, put b, actor add, get"
SHM_LANES = (
    "memcpy",
    "end to end, plain ndarrays (one copy in each)",
    "end to end, client.empty arrays (no copy in)",
    RAY_LANE,
)
HEADER = """# The refactor guard (issue 36): taogpud against Ray, before and after

Each section is one run of `python -m bench.refactor_guard` (bench/refactor_guard.py). Only
ratios within one run compare: the host is shared and its load moves every absolute number.
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--label", required=True, help='names the section, e.g. "before"')
    parser.add_argument("--rounds", type=int, default=5, help="dispatch rounds (≥ 2)")
    parser.add_argument("--shm-repeats", type=int, default=7, help="warm rounds of the lanes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the file appended to")
    parser.add_argument("--tree", type=Path, help="a checkout whose taogpud/ is measured")
    args = parser.parse_args()
    if args.tree is not None:
        _import_from(args.tree)
    _remove_shim_at_exit()
    _exit_on_sigterm()
    load_before, started = host.load_average(), time.monotonic()
    print("== tiny-job dispatch: taogpud and Ray's warm actor", flush=True)
    rows = dispatch.measure(args.rounds, False, [_taogpud, _ray_actor]).rows
    print("== shared-memory path: taogpud and Ray", flush=True)
    shm, daemon_source = _shm_rows(args.shm_repeats)
    facts = _facts(args, load_before, host.load_average(), time.monotonic() - started)
    imported = _named(_package_dir().parent)
    facts.append(f"- taogpud imported from {imported}; the daemon ran {daemon_source}")
    section = "\n".join([*facts, "", *_dispatch_table(rows), "", *_shm_table(shm), ""])
    if not args.out.exists():
        args.out.write_text(HEADER)
    with args.out.open("a") as out:
        out.write("\n" + section)
    print(section)


def _import_from(tree: Path) -> None:
    """Run again with `tree`'s taogpud/ and this checkout's bench: a folder holding only a link
    to that package goes first on PYTHONPATH, and -P keeps the working directory off sys.path.
    The harness then starts the daemon from the link's target checkout (same_code_env)."""
    package = (tree / "taogpud").resolve()
    if _package_dir() == package:
        return
    shim = Path(tempfile.mkdtemp(prefix=SHIM_PREFIX, dir="/tmp"))
    (shim / "taogpud").symlink_to(package, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])}
    command = [sys.executable, "-P", "-m", "bench.refactor_guard", *sys.argv[1:]]
    os.execve(sys.executable, command, env)


def _remove_shim_at_exit() -> None:
    """The folder _import_from made goes when this run ends (the link only, not the tree)."""
    link = Path(taogpud.__file__).parent
    if link.is_symlink() and link.parent.name.startswith(SHIM_PREFIX):
        atexit.register(shutil.rmtree, link.parent, True)


def _package_dir() -> Path:
    return Path(taogpud.__file__).resolve().parent


def _named(checkout: Path) -> str:
    """A checkout's taogpud/ by the checkout's folder name (results name no host paths)."""
    return f"{checkout.name}/taogpud"


def _daemon_source(pid: int) -> str:
    """Where the running daemon's code lives, read from its own stack (py-spy dump): the
    folder holding the taogpud/ of its first frame in taogpud, with that checkout's commit."""
    done = subprocess.run(
        [PY_SPY, "dump", "--full-filenames", "--pid", str(pid)],
        capture_output=True,
        text=True,
        check=False,
    )
    for word in done.stdout.split():
        if word.startswith("(/") and "/taogpud/" in word:
            root = Path(word.strip("()").split("/taogpud/")[0])
            return f"{_named(root)} ({_tree_commit(root)}, from py-spy dump of its stack)"
    return f"unknown (py-spy dump: {done.stderr.strip()[-200:]})"


def _exit_on_sigterm() -> None:
    """SIGTERM ends the run through its finally blocks: daemons, Ray and /dev/shm cleaned up.
    Set again after ray.init, which installs a handler of its own that just exits."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _taogpud(result: DispatchResult, quick: bool) -> list[DispatchRow]:
    """bench/dispatch.py's main taogpud rows (no taogpuctl, no A/B variants)."""
    one, many = dispatch.plans("taogpud", 1, quick)
    with running(dispatch.TRACED_LOGS) as daemon:
        rows, _ = taogpud_client.measure(daemon, one, CLIENTS, many)
    dispatch.print_rows(rows)
    return rows


_ray_actor = dispatch.isolated_peer(RAY_ACTOR, ray_local.measure_actor, "ray")


def _shm_rows(repeats: int) -> tuple[dict[int, dict[str, list[float]]], str]:
    """bench/shm_path.py's run, on the lanes the guard compares; where its daemon's code was."""
    rows: dict[int, dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        actor = stack.enter_context(shm_path.ray_actor(max(SHM_SIZES_MIB)))
        _exit_on_sigterm()
        daemon = stack.enter_context(running())
        for size_mib in SHM_SIZES_MIB:
            clients: list[Client] = []
            try:
                lanes = shm_path.lanes_for(str(daemon.socket_path), size_mib, actor, clients)
                chosen = {name: lanes[name] for name in SHM_LANES}
                rows[size_mib] = shm_path.run_lanes(chosen, repeats)
            finally:
                for client in clients:
                    client.close()
        source = _daemon_source(daemon.proc.pid)
    return rows, source


def _facts(args: argparse.Namespace, before: str, after: str, seconds: float) -> list[str]:
    command = f"python -m bench.refactor_guard --label {args.label} --rounds {args.rounds}"
    command += f" --shm-repeats {args.shm_repeats}"
    command += "" if args.tree is None else f" --tree {args.tree.resolve().name}"
    measured = "" if args.tree is None else f"taogpud/ of {_tree_commit(args.tree)}, bench of "
    return [
        f"## {args.label}, {measured}{_commit()}",
        "",
        f"- {host.now()}, `{command}`, {seconds / 60:.1f} min",
        f"- {host.description()}",
        f"- load average before: {before}; after: {after}",
    ]


def _commit() -> str:
    """HEAD, and whether taogpud/ or bench/ differ from it (then the numbers are not HEAD's);
    results a run before this one wrote do not count."""
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--", "taogpud", "bench", ":!bench/results")
    return f"{head} (with uncommitted changes)" if dirty else head


def _tree_commit(tree: Path) -> str:
    """The checkout's HEAD, and whether its taogpud/ differs from it."""
    head = _git("rev-parse", "--short", "HEAD", cwd=tree)
    dirty = _git("status", "--porcelain", "--", "taogpud", cwd=tree)
    return f"{head} (with uncommitted changes)" if dirty else head


def _git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


DISPATCH_MEASURES = (  # clients, DispatchRow field, what it is, its format
    (1, "p50_ms", "p50 ms, 1 client (lower is better)", ".3f"),
    (CLIENTS, "jobs_per_s", f"jobs/s, {CLIENTS} clients (higher is better)", ",.0f"),
)


def _dispatch_table(rows: list[DispatchRow]) -> list[str]:
    lines = [
        "Tiny-job dispatch: median over the rounds (min–max); taogpud / Ray.",
        "",
        "| measure | taogpud, Python client | Ray local, a warm actor | taogpud / Ray |",
        "|---|---:|---:|---:|",
    ]
    for clients, field, label, spec in DISPATCH_MEASURES:
        ours = _spread_of(rows, taogpud_client.NAME, clients, field)
        theirs = _spread_of(rows, RAY_ACTOR, clients, field)
        ratio = "—" if ours is None or theirs is None else f"{ours.median / theirs.median:.2f}×"
        lines.append(f"| {label} | {_text(ours, spec)} | {_text(theirs, spec)} | {ratio} |")
    return lines


def _spread_of(rows: list[DispatchRow], system: str, clients: int, field: str) -> Spread | None:
    found = [getattr(row, field) for row in rows if (row.system, row.clients) == (system, clients)]
    return found[0] if found else None


def _text(spread: Spread | None, spec: str) -> str:
    return "not measured" if spread is None else spread.text(spec)


def _shm_table(rows: dict[int, dict[str, list[float]]]) -> list[str]:
    lines = [
        "Shared-memory path, `vector_add` end to end: warm median s (GiB/s of one array); "
        "Ray / taogpud time, i.e. how many times faster than Ray.",
        "",
        "| lane | size | taogpud s (GiB/s) | Ray s (GiB/s) | × Ray, medians | × Ray, paired |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for size_mib, by_lane in rows.items():
        ray = by_lane[RAY_LANE][1:]
        for name in SHM_LANES[1:3]:
            ours = by_lane[name][1:]
            medians = statistics.median(ray) / statistics.median(ours)
            paired = statistics.median(r / o for r, o in zip(ray, ours, strict=True))
            lines.append(
                f"| {name} | {size_mib} MiB | {_seconds(ours, size_mib)} | "
                f"{_seconds(ray, size_mib)} | {medians:.2f}× | {paired:.2f}× |"
            )
    return [*lines, "", "bench/shm_path.py's table of the same run:", "", shm_path.report(rows)]


def _seconds(samples: list[float], size_mib: int) -> str:
    warm = statistics.median(samples)
    return f"{warm:.4f} ({size_mib / 1024 / warm:.2f})"


if __name__ == "__main__":
    main()
