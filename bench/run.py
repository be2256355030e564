"""Issue 8's benchmarks in one command: taogpud beside dask, Ray, a process pool and a process
per job, measured in one run on one host; writes bench/results/report.md and PNG charts.

    python -m bench.run [--quick] [--repeats 3]      (from the repository's root)

Needs the bench extra (`pip install -e '.[bench]'`: dask, ray, matplotlib, py-spy); a peer
that is not installed shows as "not measured". --quick: a fifth of the jobs and shorter
profiles, for trying the harness; the report says which it was.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from bench import cli_start, datapath, dispatch, footprint, host, opencl, where_time_goes
from bench.advice import ADVICE
from bench.charts import draw_all
from bench.daemon_under_test import running
from bench.procs import cmdline, descendants
from bench.pyspy_profile import py_spy
from bench.ray_executor import ray_executor_section
from bench.report import RunFacts, render
from bench.targets import evaluate

REPO = Path(__file__).resolve().parent.parent
# Ray's and dask's workers are interpreters of their own, started elsewhere than this root:
# they find bench.peers through their environment, as `python -m` found it here.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

RESULTS = REPO / "bench" / "results"
SIZES_MIB = [64, 512]
PROFILE_RATE_HZ = 200


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer jobs, shorter profiles")
    parser.add_argument(
        "--repeats", type=int, default=3, help="repeats per measurement (≥ 2); dispatch: rounds"
    )
    args = parser.parse_args()
    # SIGTERM ends the run through its finally blocks: daemons, clusters and /dev/shm cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    command = "python -m bench.run" + (" --quick" if args.quick else "")
    facts = RunFacts(
        host.description(), host.now(), command, args.repeats, host.versions(), host.load_average()
    )
    started = time.monotonic()

    print("== tiny-job dispatch", flush=True)
    tiny = dispatch.measure(args.repeats, args.quick)
    print("== data path", flush=True)
    with running() as daemon:
        sizes = datapath.measure(str(daemon.socket_path), SIZES_MIB, args.repeats)
    print("== footprint", flush=True)
    prints = footprint.measure(args.repeats)
    print("== opencl (PoCL) vector_add vs numpy", flush=True)
    facts.opencl = opencl.report_lines(opencl.measure(repeats=max(args.repeats, 3)))
    print("== Ray executor vs local", flush=True)
    facts.ray_executor = ray_executor_section(args.repeats, args.quick)
    print("== taogpuctl start-up", flush=True)
    facts.cli_start = cli_start.report_lines(cli_start.measure())
    targets = evaluate(tiny.rows, sizes, dispatch.CLIENTS)
    scenarios = None
    if any(target.verdict == "missed" for target in targets) and py_spy() is not None:
        print("== a target was missed: profiling the daemon", flush=True)
        with running() as daemon:
            seconds = 2.0 if args.quick else 6.0
            scenarios = where_time_goes.measure(
                str(daemon.socket_path), daemon.proc.pid, seconds, PROFILE_RATE_HZ
            )

    RESULTS.mkdir(parents=True, exist_ok=True)
    facts.charts = draw_all(RESULTS, tiny.rows, sizes, dispatch.CLIENTS)
    facts.load_after = host.load_average()
    facts.duration_s = time.monotonic() - started
    report = render(
        facts,
        targets,
        tiny.rows,
        tiny.breakdown,
        sizes,
        prints,
        tiny.peer_footprints,
        scenarios,
        ADVICE,
    )
    (RESULTS / "report.md").write_text(report)
    print(report)
    _check_leftovers()


def _check_leftovers() -> None:
    """Every process this run started should be gone (multiprocessing's tracker ends with us)."""
    left = [pid for pid in descendants(os.getpid()) if b"resource_tracker" not in cmdline(pid)]
    if left:
        print(f"warning: processes this run started are still alive: {left}", file=sys.stderr)


if __name__ == "__main__":
    main()
