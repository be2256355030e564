"""`taogpuctl exec`: your own program through the queue, under a lease (docs/programs.md).

taogpuctl queues it, says where it stands while it waits, starts it here as you once the
lease is granted (in this directory, with this environment plus the lease's devices), streams
its output to this terminal and exits with its exit status. Ctrl-C (SIGINT), SIGTERM and
SIGHUP go to the program's process group, and the job ends `cancelled`.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from taogpud.cli import EXIT_INTERRUPTED
from taogpud.cli.failures import CliError
from taogpud.cli.output import emit_json, report_error, warn
from taogpud.client import Client
from taogpud.client.program import Outcome, ProgramRun

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`4G`, `512MiB`, `1.5g`, `1048576` → bytes (binary units)."""
    match = SIZE.match(text)
    if match is None or float(match[1]) <= 0:
        raise CliError(f"--mem {text!r} is not a size", "e.g. --mem 4G, --mem 512M, --mem 1.5GiB")
    return int(float(match[1]) * UNITS[match[2].lower()])


def exec_program(client: Client, argv: list[str], request: dict[str, Any], json_out: bool) -> int:
    """Run `argv` under a lease; taogpuctl's exit status is the program's."""
    run = ProgramRun(client, argv, reap_descendants=True, on_queued=_say_queued, **request)
    try:
        with _forwarding(run):
            outcome = run.run()
    except KeyboardInterrupt:  # Ctrl-C before the program started: the job goes with it
        if run.job is not None:
            client.cancel(run.job["id"])
            warn(f"job {run.job['id']} cancelled before its program started")
        return EXIT_INTERRUPTED
    return _report(outcome, json_out)


@contextmanager
def _forwarding(run: ProgramRun) -> Iterator[None]:
    """While the program runs, these signals go to it (and end the job cancelled); before,
    Ctrl-C is a KeyboardInterrupt that cancels the queued job."""
    previous = {signum: signal.getsignal(signum) for signum in FORWARDED}

    def forward(signum: int, _frame: Any) -> None:
        if run.process is None:
            raise KeyboardInterrupt
        run.interrupt(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _say_queued(lease: dict[str, Any]) -> None:
    job = lease["job"]
    position = lease["queue_position"]
    sys.stderr.write(f"taogpuctl: job {job['id']} queued, position {position} in the queue\n")
    sys.stderr.flush()


def _report(outcome: Outcome, json_out: bool) -> int:
    job = outcome.job
    if json_out:
        emit_json({**job, "exit_status": outcome.exit_status})
    elif job.get("status") not in ("succeeded", None):
        error = job.get("error") or {}
        message = f"job {job['id']} {job['status']}: {error.get('message', '')}"
        report_error(message, error.get("hint") or "")
    return outcome.exit_status
