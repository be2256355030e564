"""taogpud through its CLI: `taogpuctl submit noop --wait`, a process per call."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.load import Call, Plan, in_processes, sequential
from bench.stats import DispatchRow

NAME = "taogpud, taogpuctl submit noop --wait"


def measure(socket_path: str, plan: Plan, clients: int, concurrent: Plan) -> list[DispatchRow]:
    with open_caller(socket_path) as call:
        one = sequential(call, plan)
    many = in_processes(open_caller, [(socket_path,)] * clients, concurrent)
    note = "a new process per call: interpreter start and imports included"
    return [DispatchRow.from_runs(NAME, 1, one, note), DispatchRow.from_runs(NAME, clients, many)]


@contextlib.contextmanager
def open_caller(socket_path: str) -> Iterator[Call]:
    command = [str(taogpuctl()), "--socket", socket_path, "submit", "noop", "--wait"]
    yield lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def taogpuctl() -> Path:
    """The console script installed beside this interpreter."""
    return Path(sys.executable).parent / "taogpuctl"
