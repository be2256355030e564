"""concurrent.futures.ProcessPoolExecutor with 2 workers (one executor: clients are threads)."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from bench.load import Plan, in_threads, sequential
from bench.peers.tiny import noop
from bench.stats import DispatchRow

NAME = "ProcessPoolExecutor, 2 workers"
WORKERS = 2


def measure(plan: Plan, clients: int, concurrent: Plan) -> list[DispatchRow]:
    with ProcessPoolExecutor(WORKERS) as pool:

        def call() -> None:
            pool.submit(noop).result()

        one = sequential(call, plan)
        many = in_threads(lambda: call, clients, concurrent)
    note = f"{clients} threads: an executor cannot be shared across processes"
    return [DispatchRow.from_runs(NAME, 1, one), DispatchRow.from_runs(NAME, clients, many, note)]
