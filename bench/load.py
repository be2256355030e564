"""Drive a tiny job over and over: 1 client sequential, N clients concurrent, and isolation.

A peer gives a *caller opener*: a module-level function (so a spawned process can import it)
that takes plain arguments and returns a context manager yielding `call()`, one tiny job
submit → result. The same opener serves the sequential run here and each client process.

Clients in separate processes start together on a barrier for each repeat; a repeat's wall
time runs from the first client's start to the last one's end (CLOCK_MONOTONIC is one clock
for every process on the host).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.stats import LoadRun

Call = Callable[[], object]
Opener = Callable[..., AbstractContextManager[Call]]
SPAWN = multiprocessing.get_context("spawn")
CLIENT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Plan:
    """How many jobs: per repeat, and before measuring."""

    jobs: int
    repeats: int
    warmup: int


def timed(call: Call, count: int) -> tuple[float, float, list[float]]:
    """Run `count` jobs back to back: (start, end, latencies), times from CLOCK_MONOTONIC."""
    latencies = []
    started = time.monotonic()
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    return started, time.monotonic(), latencies


def sequential(call: Call, plan: Plan) -> list[LoadRun]:
    timed(call, plan.warmup)
    runs = []
    for _ in range(plan.repeats):
        started, ended, latencies = timed(call, plan.jobs)
        runs.append(LoadRun(latencies, ended - started))
    return runs


def in_processes(opener: Opener, each: list[tuple[Any, ...]], plan: Plan) -> list[LoadRun]:
    """A process per item of `each`: opener(*item) as its caller, plan.jobs per repeat."""
    clients = len(each)
    barrier = SPAWN.Barrier(clients + 1)
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(target=_client, args=(opener, args, plan, barrier, results)) for args in each
    ]
    for process in processes:
        process.start()
    try:
        return [_gather(barrier, results, clients) for _ in range(plan.repeats)]
    finally:
        _reap(processes)


def in_threads(call_for: Callable[[], Call], clients: int, plan: Plan) -> list[LoadRun]:
    """The same with threads, for what cannot be shared across processes (an executor)."""
    barrier = threading.Barrier(clients + 1)
    out: list[Any] = []
    threads = [
        threading.Thread(target=_thread_client, args=(call_for(), plan, barrier, out))
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    runs = []
    for _ in range(plan.repeats):
        barrier.wait(CLIENT_TIMEOUT_S)
        barrier.wait(CLIENT_TIMEOUT_S)  # every thread finished this repeat
        runs.append(_merge(out[-clients:]))
    for thread in threads:
        thread.join()
    return runs


def _thread_client(call: Call, plan: Plan, barrier: threading.Barrier, out: list[Any]) -> None:
    timed(call, plan.warmup)
    for _ in range(plan.repeats):
        barrier.wait(CLIENT_TIMEOUT_S)
        out.append(timed(call, plan.jobs))
        barrier.wait(CLIENT_TIMEOUT_S)


def _client(opener: Opener, args: tuple[Any, ...], plan: Plan, barrier: Any, results: Any) -> None:
    try:
        with opener(*args) as call:
            timed(call, plan.warmup)
            for _ in range(plan.repeats):
                barrier.wait(CLIENT_TIMEOUT_S)
                results.put(timed(call, plan.jobs))
    except BaseException:
        results.put(traceback.format_exc())
        barrier.abort()
        raise


def _gather(barrier: Any, results: Any, clients: int) -> LoadRun:
    try:
        barrier.wait(CLIENT_TIMEOUT_S)
    except threading.BrokenBarrierError:
        raise RuntimeError(f"a client failed:\n{results.get(timeout=5)}") from None
    parts = [results.get(timeout=CLIENT_TIMEOUT_S) for _ in range(clients)]
    for part in parts:
        if isinstance(part, str):
            raise RuntimeError(f"a client failed:\n{part}")
    return _merge(parts)


def _merge(parts: list[tuple[float, float, list[float]]]) -> LoadRun:
    started = min(part[0] for part in parts)
    ended = max(part[1] for part in parts)
    return LoadRun([sample for part in parts for sample in part[2]], ended - started)


def _reap(processes: list[Any]) -> None:
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()


# -- isolation: one peer per spawned process, so its threads, imports and clusters end with it --


def isolated(function: Callable[..., Any], *args: Any, timeout_s: float = 1800.0) -> Any:
    """Run `function(*args)` in a fresh spawned process; its result, or its error re-raised."""
    receiver, sender = SPAWN.Pipe(duplex=False)
    process = SPAWN.Process(target=_run_isolated, args=(sender, function, args))
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            raise TimeoutError(f"{function.__qualname__} took more than {timeout_s:.0f} s")
        ok, value = receiver.recv()
    except EOFError:
        raise RuntimeError(f"{function.__qualname__} died (exit {process.exitcode})") from None
    finally:
        _reap([process])
    if not ok:
        raise RuntimeError(value)
    return value


def _run_isolated(sender: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        sender.send((True, function(*args)))
    except BaseException:
        sender.send((False, traceback.format_exc()))


@contextlib.contextmanager
def just(call: Call) -> Iterator[Call]:
    """An opener's body for callers that need no set-up."""
    yield call


@contextlib.contextmanager
def socket_server(serve: Callable[[str, Any], None], name: str) -> Iterator[str]:
    """Run `serve(path, ready)` in a spawned process on a fresh Unix socket; yield its path."""
    folder = tempfile.mkdtemp(prefix=f"tgd-{name}-", dir="/tmp")
    path = str(Path(folder) / f"{name}.sock")
    ready = SPAWN.Event()
    server = SPAWN.Process(target=serve, args=(path, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError(f"the {name} server did not start")
        yield path
    finally:
        server.kill()
        server.join()
        shutil.rmtree(folder, ignore_errors=True)
