"""A queue that starts a process per job (pueue, task-spooler): `python -c` doing the tiny job."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from bench.load import Call, Plan, in_processes, sequential
from bench.stats import DispatchRow

# The bare tiny job, and the same with the import a real NumPy/CuPy job starts with.
BODIES = {"pass": "the interpreter alone", "import numpy": "what a real array job starts with"}


def measure(plan: Plan, clients: int, concurrent: Plan) -> list[DispatchRow]:
    rows = []
    for body, note in BODIES.items():
        name = f"process per job: python -c '{body}'"
        with open_caller(body) as call:
            rows.append(DispatchRow.from_runs(name, 1, sequential(call, plan), note))
        many = in_processes(open_caller, [(body,)] * clients, concurrent)
        rows.append(DispatchRow.from_runs(name, clients, many))
    return rows


@contextlib.contextmanager
def open_caller(body: str) -> Iterator[Call]:
    command = [sys.executable, "-c", body]
    yield lambda: subprocess.run(command, check=True)
