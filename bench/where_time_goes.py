"""Where the time goes: the daemon under load, its CPU per job from /proc, its stacks from py-spy.

Three loads, each held steady while py-spy samples: tiny jobs from 1 client, tiny jobs
from 8 clients, and 512 MiB uploads from 1 client. CPU per unit of work (a job, an upload)
comes from /proc (user + system time of the daemon, its workers and the clients over the
same window); py-spy says how the daemon's busy time splits.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import pyspy_profile
from bench.daemon_under_test import Client
from bench.load import SPAWN
from bench.peers.taogpud_client import open_caller
from bench.procs import cpu_s, descendants
from bench.pyspy_profile import ProcessProfile

UPLOAD_MIB = 512
WARM_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Scenario:
    name: str
    unit: str
    units: int
    seconds: float
    cpu_ms_per_unit: dict[str, float]  # daemon, workers, clients
    profiles: dict[str, ProcessProfile] = field(default_factory=dict)  # daemon, workers, client

    @property
    def units_per_s(self) -> float:
        return self.units / self.seconds


def measure(socket_path: str, daemon_pid: int, seconds: int, rate_hz: int) -> list[Scenario]:
    runs: list[tuple[str, str, Callable[..., None], int, bool]] = [
        ("tiny jobs, 1 client", "job", _tiny_jobs, 1, True),
        ("tiny jobs, 8 clients", "job", _tiny_jobs, 8, False),
        (f"{UPLOAD_MIB} MiB uploads, 1 client", "upload", _uploads, 1, True),
    ]
    with tempfile.TemporaryDirectory(prefix="tgd-prof-") as folder:
        return [
            _scenario(name, unit, load, clients, profile_client, socket_path, daemon_pid,
                      seconds, rate_hz, Path(folder) / f"{n}")
            for n, (name, unit, load, clients, profile_client) in enumerate(runs)
        ]  # fmt: skip


def _scenario(
    name: str,
    unit: str,
    load: Callable[..., None],
    clients: int,
    profile_client: bool,
    socket_path: str,
    daemon_pid: int,
    seconds: int,
    rate_hz: int,
    out: Path,
) -> Scenario:
    stop = SPAWN.Event()
    counters = [SPAWN.Value("q", 0, lock=False) for _ in range(clients)]
    loads = [SPAWN.Process(target=load, args=(socket_path, stop, c)) for c in counters]
    for process in loads:
        process.start()
    try:
        _wait_warm(counters, loads)
        pids = {
            "daemon": [daemon_pid],
            "workers": descendants(daemon_pid),
            "clients": [p.pid for p in loads if p.pid is not None],
        }
        before, done_before, started = _cpu(pids), _total(counters), time.monotonic()
        recorders = [pyspy_profile.recorder(daemon_pid, seconds, out.with_suffix(".daemon"),
                                            rate_hz, children=True)]  # fmt: skip
        if profile_client:
            recorders.append(pyspy_profile.recorder(
                pids["clients"][0], seconds, out.with_suffix(".client"), rate_hz, children=False
            ))  # fmt: skip
        for recorder in recorders:
            _, error = recorder.communicate(timeout=seconds + 60)
            if recorder.returncode != 0:
                raise RuntimeError(f"py-spy failed: {error.decode(errors='replace')[-500:]}")
        after, done, elapsed = (
            _cpu(pids),
            _total(counters) - done_before,
            time.monotonic() - started,
        )
    finally:
        stop.set()
        for process in loads:
            process.join(60)
    per_unit = {who: (after[who] - before[who]) * 1e3 / max(done, 1) for who in pids}
    return Scenario(name, unit, done, elapsed, per_unit, _profiles(out))


def _profiles(out: Path) -> dict[str, ProcessProfile]:
    found = pyspy_profile.load(out.with_suffix(".daemon"))
    profiles = {"daemon": found["main"]}
    if "children" in found:
        profiles["workers"] = found["children"]
    if out.with_suffix(".client").exists():
        profiles["client"] = pyspy_profile.load(out.with_suffix(".client"))["main"]
    return profiles


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {who: sum(map(cpu_s, found)) for who, found in pids.items()}


def _total(counters: list[Any]) -> int:
    return sum(counter.value for counter in counters)


def _wait_warm(counters: list[Any], loads: list[Any]) -> None:
    deadline = time.monotonic() + WARM_TIMEOUT_S
    while any(counter.value < 2 for counter in counters):
        if time.monotonic() > deadline or not all(p.is_alive() for p in loads):
            raise RuntimeError("a load process did not get going")
        time.sleep(0.05)


# -- the loads, each in its own process until `stop` ---------------------------------------


def _tiny_jobs(socket_path: str, stop: Any, counter: Any) -> None:
    with open_caller(socket_path) as call:
        while not stop.is_set():
            call()
            counter.value += 1


def _uploads(socket_path: str, stop: Any, counter: Any) -> None:
    import numpy as np

    array = np.ones((UPLOAD_MIB << 20) // 4, dtype=np.float32)
    with Client(socket_path, timeout_s=600) as client:
        while not stop.is_set():
            client.upload_array(array)
            counter.value += 1
