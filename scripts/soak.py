"""Soak: load from 8 clients through faults, then count. Bounded in time and count, loopback only.

Phases, each under load from 8 client threads (noop and short sleep jobs):
  1. kill -9 of a worker mid-job
  2. clients that hang up while waiting
  3. SIGTERM under load, then a restart on the same state directory
  4. kill -9 of the daemon under load, then a restart
After each phase every accepted job id must be accounted for (a record, in a state).
At the end: the most jobs ever running (from the traces) vs max_concurrent_tasks, p99
latency with 8 clients, schemathesis cases and failures, and a scan of every log line
and every API answer for the API key.

    python scripts/soak.py [--seconds-per-phase 8] [--fuzz-per-operation 200]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from conftest import RunningDaemon, start_daemon  # noqa: E402
from fuzzing import FUZZ_CONFIG, FUZZ_SETTINGS, fuzz  # noqa: E402
from traces import most_running  # noqa: E402

from taogpud.client import ApiError, Client, DaemonUnreachable  # noqa: E402

MAX_CONCURRENT = 3
CLIENTS = 8


@dataclass
class Load:
    """What the client threads saw: accepted ids, latencies, every answer body (for the scan)."""

    accepted: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


def client_loop(socket_path: Path, load: Load, seed: int) -> None:
    client = Client(socket_path, timeout_s=10)
    n = seed
    while not load.stop.is_set():
        n += 1
        task, params = ("sleep", {"ms": 20}) if n % 4 == 0 else ("noop", {})
        started = time.perf_counter()
        try:
            job = client.submit(task, params, wait_s=5)
        except (ApiError, DaemonUnreachable):
            time.sleep(0.05)  # queue full, draining, or restarting: try again
            continue
        with load.lock:
            load.accepted.append(job["id"])
            load.latencies_s.append(time.perf_counter() - started)
            load.answers.append(json.dumps(job))
    client.close()


def run_load(daemon: RunningDaemon, load: Load) -> list[threading.Thread]:
    load.stop.clear()
    threads = [
        threading.Thread(target=client_loop, args=(daemon.socket_path, load, i * 1000), daemon=True)
        for i in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    return threads


def stop_load(load: Load, threads: list[threading.Thread]) -> None:
    load.stop.set()
    for thread in threads:
        thread.join(30)


def accounted(daemon: RunningDaemon, load: Load) -> tuple[int, int]:
    """(accepted, accounted for): every accepted id must have a record that finished."""
    found = 0
    with daemon.client(timeout_s=60) as client:
        for job_id in load.accepted:
            job = client.wait(job_id, timeout_s=60)
            load.answers.append(json.dumps(job))
            found += job["status"] not in ("queued", "running")
    return len(load.accepted), found


def hang_ups(daemon: RunningDaemon, count: int) -> None:
    body = b'{"task": "sleep", "params": {"ms": 50}}'
    request = (
        b"POST /v1/jobs?wait_s=30 HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(daemon.socket_path))
        sock.sendall(request)
        sock.close()


def parsed(log: Path) -> list[dict[str, Any]]:
    """The JSON lines of a log; a daemon killed with -9 may have left its last one half-written."""
    records = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return [record for record in records if isinstance(record, dict)]


def phase(
    name: str, daemon: RunningDaemon, seconds: float, fault: Any
) -> tuple[RunningDaemon, dict[str, Any]]:
    load = Load()
    threads = run_load(daemon, load)
    time.sleep(seconds / 2)
    daemon = fault(daemon)
    time.sleep(seconds / 2)
    stop_load(load, threads)
    total, found = accounted(daemon, load)
    return daemon, {"phase": name, "accepted": total, "accounted": found, "load": load}


def kill_worker(daemon: RunningDaemon) -> RunningDaemon:
    with daemon.client() as client:
        pid = client.status()["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    return daemon


def hang_up_clients(daemon: RunningDaemon) -> RunningDaemon:
    hang_ups(daemon, 50)
    return daemon


def restart_after(signum: int) -> Any:
    def fault(daemon: RunningDaemon) -> RunningDaemon:
        daemon.stop(signum)
        return daemon.restart(env={"TAOTOKEN_API_KEY": KEY})

    return fault


KEY = "tk-soak-" + secrets.token_hex(12)  # made at run time: no key in any file


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds-per-phase", type=float, default=8.0)
    parser.add_argument("--fuzz-per-operation", type=int, default=200)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tgd-soak-", dir="/tmp"))
    scheduling = {**FUZZ_CONFIG["scheduling"], "max_concurrent_tasks": MAX_CONCURRENT}
    config = {**FUZZ_CONFIG, "scheduling": {**scheduling, "queue_limit": 200}}
    daemon = start_daemon(home, FUZZ_SETTINGS, config, env={"TAOTOKEN_API_KEY": KEY})
    results = []
    try:
        for name, fault in (
            ("kill -9 of a worker", kill_worker),
            ("clients hanging up while waiting", hang_up_clients),
            ("SIGTERM under load, restart", restart_after(signal.SIGTERM)),
            ("kill -9 of the daemon under load, restart", restart_after(signal.SIGKILL)),
        ):
            daemon, result = phase(name, daemon, args.seconds_per_phase, fault)
            results.append(result)
        fuzzed = fuzz(daemon.socket_path, args.fuzz_per_operation)
    finally:
        daemon.stop()
    report = render(results, fuzzed, home, daemon)
    print(report)
    shutil.rmtree(home, ignore_errors=True)
    ok = all(r["accepted"] == r["accounted"] for r in results) and not fuzzed.failures
    return 0 if ok and "LEAK" not in report else 1


def render(results: list[dict[str, Any]], fuzzed: Any, home: Path, daemon: RunningDaemon) -> str:
    logs = sorted(home.glob("logs/stdout-*.log")) + sorted(home.glob("logs/stderr-*.log"))
    latencies = sorted(s for r in results for s in r["load"].latencies_s)
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1e3 if latencies else float("nan")
    answers = "".join(a for r in results for a in r["load"].answers)
    leaked = [p.name for p in logs if KEY in p.read_text()]
    leaked += ["API answers"] if KEY in answers else []
    lines = ["| fault | accepted | accounted for |", "|---|---:|---:|"]
    lines += [f"| {r['phase']} | {r['accepted']} | {r['accounted']} |" for r in results]
    lines += [
        "",
        f"most jobs ever running: "
        f"{max(most_running(parsed(log)) for log in home.glob('logs/stdout-*.log'))} "
        f"(max_concurrent_tasks {MAX_CONCURRENT})",
        f"p99 submit→result with {CLIENTS} clients: {p99:.1f} ms over {len(latencies)} jobs",
        f"schemathesis: {fuzzed.cases} cases, {len(fuzzed.failures)} failures",
        *[f"  - {failure}" for failure in fuzzed.failures[:20]],
        f"key scan over {len(logs)} log files and {len(answers):,} bytes of answers: "
        + (f"LEAK in {', '.join(leaked)}" if leaked else "not found"),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
