"""Where the time goes: the daemon under load, its CPU per job from /proc, its stacks from py-spy.

Three steady loads: tiny jobs from 1 client, tiny jobs from 8 clients, and 512 MiB uploads
from 1 client. Each is watched twice: first alone, for the rate and the CPU per unit of
work (a job, an upload: user + system time of the daemon, its workers and the clients from
/proc), then with py-spy attached, for how the busy time splits (py-spy stops the process
for each sample, which costs CPU of its own, so the CPU figures come from the first window).
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
MIN_UNITS = 3
POLL_S = 0.002


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


def measure(socket_path: str, daemon_pid: int, seconds: float, rate_hz: int) -> list[Scenario]:
    loads = [
        Load("tiny jobs, 1 client", "job", _tiny_jobs, 1, profiled_clients=1),
        Load("tiny jobs, 8 clients", "job", _tiny_jobs, 8, profiled_clients=0),
        # Uploads never reach the workers: their samples would be idle noise.
        Load(f"{UPLOAD_MIB} MiB uploads, 1 client", "upload", _uploads, 1, 1, workers=False),
    ]
    with tempfile.TemporaryDirectory(prefix="tgd-prof-") as folder:
        return [
            _scenario(load, socket_path, daemon_pid, seconds, rate_hz, Path(folder) / str(n))
            for n, load in enumerate(loads)
        ]


@dataclass(frozen=True)
class Load:
    name: str
    unit: str
    body: Callable[..., None]  # (socket_path, stop, counter): one unit after another
    clients: int
    profiled_clients: int  # how many of the clients py-spy samples too
    workers: bool = True  # whether py-spy samples the daemon's workers too


def _scenario(
    load: Load, socket_path: str, daemon_pid: int, seconds: float, rate_hz: int, out: Path
) -> Scenario:
    """Each window runs from one finished unit to another, `seconds` and MIN_UNITS at least."""
    stop = SPAWN.Event()
    counters = [SPAWN.Value("q", 0, lock=False) for _ in range(load.clients)]
    clients = [SPAWN.Process(target=load.body, args=(socket_path, stop, c)) for c in counters]
    for process in clients:
        process.start()
    try:
        _wait_warm(counters, clients)
        pids = {
            "daemon": [daemon_pid],
            "workers": descendants(daemon_pid),
            "clients": [p.pid for p in clients if p.pid is not None],
        }
        first = _on_next_unit(counters, pids)
        last = _on_next_unit(counters, pids, after=first, seconds=seconds)
        daemon_out = out.with_suffix(".daemon")
        recorders = [pyspy_profile.recorder(daemon_pid, daemon_out, rate_hz, load.workers)]
        recorders += [
            pyspy_profile.recorder(pid, out.with_suffix(f".client{n}"), rate_hz, False)
            for n, pid in enumerate(pids["clients"][: load.profiled_clients])
        ]
        try:
            sampled = _on_next_unit(counters, pids)
            _on_next_unit(counters, pids, after=sampled, seconds=seconds)
        finally:
            pyspy_profile.stop(recorders)
    finally:
        stop.set()
        for process in clients:
            process.join(120)
    units = last.units - first.units
    cpu = {who: (last.cpu[who] - first.cpu[who]) * 1e3 / units for who in pids}
    return Scenario(load.name, load.unit, units, last.at - first.at, cpu, _profiles(out))


@dataclass(frozen=True)
class Mark:
    at: float
    units: int
    cpu: dict[str, float]


def _on_next_unit(
    counters: list[Any],
    pids: dict[str, list[int]],
    after: Mark | None = None,
    seconds: float = 0.0,
) -> Mark:
    """A mark just after a unit finishes (and, with `after`, once enough time and units passed)."""
    deadline = time.monotonic() + WARM_TIMEOUT_S + seconds
    seen = _total(counters)
    while time.monotonic() < deadline:
        now, done = time.monotonic(), _total(counters)
        enough = after is None or (now - after.at >= seconds and done - after.units >= MIN_UNITS)
        if done != seen and enough:
            return Mark(now, done, {who: sum(map(cpu_s, found)) for who, found in pids.items()})
        seen = done
        time.sleep(POLL_S)
    raise RuntimeError("the load stopped making progress")


def _profiles(out: Path) -> dict[str, ProcessProfile]:
    found = pyspy_profile.load(out.with_suffix(".daemon"))
    profiles = {"daemon": found["main"]}
    if "children" in found:
        profiles["workers"] = found["children"]
    if out.with_suffix(".client0").exists():
        profiles["client"] = pyspy_profile.load(out.with_suffix(".client0"))["main"]
    return profiles


def _total(counters: list[Any]) -> int:
    return sum(counter.value for counter in counters)


def _wait_warm(counters: list[Any], clients: list[Any]) -> None:
    deadline = time.monotonic() + WARM_TIMEOUT_S
    while any(counter.value < 1 for counter in counters):
        if time.monotonic() > deadline or not all(p.is_alive() for p in clients):
            raise RuntimeError("a load process did not get going")
        time.sleep(POLL_S)


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
