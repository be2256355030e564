"""What a lease adds to a program (issue 37): `true` and `python3 -c pass`, run directly, under
a lease through the Python client (taogpud.client.program.ProgramRun) and through
`taogpuctl exec`, beside task-spooler (`tsp -f`, Debian's task-spooler) in one run.

Every way runs once per round, in turn, the order reversed each round, so each meets the
same stretches of a shared host; the medians are over all rounds. Then the throughput of
8 submitters (threads, each its own connection; tsp with 8 slots): programs finished a
second. The daemon is the bench's CPU pair with 4 slots a device (8 in all), and each
program asks for one slot (`--share`, 1 MiB): a whole device each would run 2 at once.

    python -m bench.programs [--rounds 10] [--throughput-s 5]      (from the repository's root)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.daemon_under_test import running
from bench.programs_ab import CONFIG, SUBMITTERS, task_spooler
from taogpud.client import Client
from taogpud.client.program import ProgramRun
from taogpud.testing import ctl_command, ctl_env

LEASE = {"share": True, "mem_bytes": 1 << 20}
PROGRAMS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


def ways(socket_path: Path, tsp_env: dict[str, str]) -> dict[str, Callable[[list[str]], None]]:
    client = Client(socket_path)
    ctl = [*ctl_command(socket_path), "exec", "--share", "--mem", "1M", "--"]
    return {
        "direct": lambda argv: _quiet(argv, None),
        "Python client": lambda argv: _leased(client, argv),
        "taogpuctl exec": lambda argv: _quiet([*ctl, *argv], ctl_env()),
        "tsp -f": lambda argv: _quiet(["tsp", "-f", *argv], tsp_env),
    }


def _quiet(command: list[str], env: dict[str, str] | None) -> None:
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)


def _leased(client: Client, argv: list[str]) -> None:
    outcome = ProgramRun(client, argv, **LEASE).run()
    assert outcome.job["status"] == "succeeded", outcome.job


def latencies(rounds: int, run: dict[str, Callable[[list[str]], None]]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    order = [(way, name) for name in PROGRAMS for way in run]
    for round_index in range(rounds):
        for way, name in order if round_index % 2 == 0 else reversed(order):
            started = time.perf_counter()
            run[way](PROGRAMS[name])
            times.setdefault(f"{name} | {way}", []).append(time.perf_counter() - started)
    return times


def throughput(make: Callable[[], Callable[[], None]], seconds: float) -> float:
    """Programs finished a second by SUBMITTERS threads, each running them back to back."""
    done = [0] * SUBMITTERS
    deadline = time.perf_counter() + seconds

    def submitter(index: int) -> None:
        call = make()
        while time.perf_counter() < deadline:
            call()
            done[index] += 1

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(SUBMITTERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--throughput-s", type=float, default=5.0)
    args = parser.parse_args()
    with task_spooler() as (tsp_env, _), running(config=CONFIG) as daemon:
        run = ways(daemon.socket_path, tsp_env)
        for way in run.values():  # warm-up: page cache, bytecode, the daemon's first lease
            way(["true"])
        times = latencies(args.rounds, run)
        rates = _rates(daemon.socket_path, tsp_env, args.throughput_s)
    _report(times, rates, args.rounds)


def _rates(socket_path: Path, tsp_env: dict[str, str], seconds: float) -> dict[str, float]:
    def leased() -> Callable[[], None]:
        client = Client(socket_path)
        return lambda: _leased(client, ["true"])

    def spooled() -> Callable[[], None]:
        return lambda: _quiet(["tsp", "-f", "true"], tsp_env)

    return {
        "Python client": throughput(leased, seconds),
        "tsp -f": throughput(spooled, seconds),
    }


def _report(times: dict[str, list[float]], rates: dict[str, float], rounds: int) -> None:
    print(f"wall time a program takes, median of {rounds} rounds (ms), and what it adds:")
    for name in PROGRAMS:
        base = statistics.median(times[f"{name} | direct"])
        for key, samples in times.items():
            if key.startswith(name + " |"):
                median = statistics.median(samples)
                print(f"  {key:38} {median * 1e3:8.2f}   +{(median - base) * 1e3:7.2f}")
    print(f"throughput of true, {SUBMITTERS} submitters (programs/s):")
    for way, rate in rates.items():
        print(f"  {way:38} {rate:8.1f}")


if __name__ == "__main__":
    main()
