"""How long `taogpuctl status` takes, from exec to exit, against a running daemon (issue 23).

A new process per call, stdout into a pipe (a script's use): interpreter start, imports, one
GET /v1/status over the Unix socket, the answer printed. The floor beside it is the same
interpreter doing nothing (`python -c pass`), so the report can say what is taogpuctl's own.
Bytecode is written and used as an installed package's is (PYTHONDONTWRITEBYTECODE is dropped
for the calls): without it every call would compile taogpud's modules again, ~70 ms.
The target is a median under 100 ms on the bench host; a timed assertion in the tests would
only measure how busy the CI machine is, so it lives here.

    python -m bench.cli_start [--runs 10]      (from the repository's root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench.daemon_under_test import running
from bench.peers.taogpuctl import taogpuctl

RUNS = 10
WARM_UP = 2  # the first calls fill the page cache with the interpreter and the modules
TARGET_MS = 100.0


# An installed taogpud has its bytecode (pip compiles it); a checkout gets it on the warm-up.
CALL_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def wall_ms(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.PIPE, env=CALL_ENV)
    return (time.perf_counter() - started) * 1e3


def medians(commands: dict[str, list[str]], runs: int) -> dict[str, list[float]]:
    """Each command `runs` times, interleaved, so a busy moment of the host hits them alike."""
    for command in commands.values():
        for _ in range(WARM_UP):
            wall_ms(command)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            samples[name].append(wall_ms(command))
    return samples


def measure(runs: int = RUNS) -> dict[str, list[float]]:
    with running() as daemon:
        socket_path = str(daemon.socket_path)
        return medians(
            {
                "taogpuctl status": [str(taogpuctl()), "--socket", socket_path, "status"],
                "python -c pass": [sys.executable, "-c", "pass"],
            },
            runs,
        )


def report_lines(samples: dict[str, list[float]]) -> list[str]:
    status = statistics.median(samples["taogpuctl status"])
    floor = statistics.median(samples["python -c pass"])
    verdict = "met" if status < TARGET_MS else "missed"
    lines = [
        "## CLI start-up",
        "",
        f"`taogpuctl status` against a running daemon, stdout into a pipe, a new process per "
        f"call; median of {len(samples['taogpuctl status'])} (min–max):",
        "",
        "| command | median ms | min–max ms |",
        "|---|---:|---:|",
    ]
    for name, values in samples.items():
        lines.append(f"| `{name}` | {statistics.median(values):.0f} | "
                     f"{min(values):.0f}–{max(values):.0f} |")  # fmt: skip
    lines += [
        "",
        f"taogpuctl's own share: {status - floor:.0f} ms; status / bare interpreter = "
        f"{status / floor:.1f}×. Target: median under {TARGET_MS:.0f} ms — {verdict}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    print("\n".join(report_lines(measure(args.runs))))


if __name__ == "__main__":
    main()
