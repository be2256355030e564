"""Soak: load from 8 clients through faults, then count. Bounded in time and count, loopback only.

Phases, each under load from 8 client threads (noop and short sleep jobs, a quarter of
them allowing a retry):
  1. kill -9 of a worker mid-job
  2. clients that hang up while waiting
  3. SIGTERM under load, then a restart on the same state directory
  4. kill -9 of the daemon under load, with retryable 1.5 s jobs running, then a restart
  5. SIGTERM with jobs that outlive the drain (1.5 s sleeps, drain_timeout_s 1), restart
  6. a second daemon started by hand on the same state directory (it must exit 75: held)
  7. config.toml rewritten in place in two steps (the first parses, with the default caps)
  8. the state directory full (ENOSPC) for a while: a tmpfs the soak mounts (root only;
     skipped with the reason elsewhere)
  9. a daemon whose stdout is a dead pipe, stopped with SIGTERM, then a normal restart
 10. idle connections flooding the relay's TCP port (no uid), held half the phase
 11. idle connections flooding the `.shm` socket as `nobody`, held half the phase
     (scripts/soak_doors.py: each door must refuse past its caps and serve the rest)
After each phase every accepted job id (answered 201) must be accounted for (a record that
finished), and none may have run more often than its retries allow (job.running lines in
every log beyond 1 + attempts). At the end: the most jobs ever running (from the traces) vs
max_concurrent_tasks — a half-applied config would show here — p99 latency with 8 clients
(in all, and per phase: what each fault cost the load's jobs),
schemathesis cases and failures, and a scan of every log line and API answer for the key.

    python -m scripts.soak [--seconds-per-phase 8] [--fuzz-per-operation 200]   (from the root)

`--growth 0,10000,100000` instead: tiny jobs from 8 clients without a pause, and at each count
the largest WAL seen (looked at every 500 jobs: by count), the database's size, the daemon's
RSS, and the time a restart takes (SIGTERM, then a start until ready); the store keeps its
default limits (10,000 finished jobs, pruned by housekeeping every 10 minutes).
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
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.soak_doors import relay_flood, shm_flood
from taogpud.client import ApiError, Client, DaemonUnreachable
from taogpud.daemon.lifecycle import EXIT_MAY_PASS_LATER, RECENT_JOBS_SHOWN
from taogpud.jobs.store import JobStore
from taogpud.testing import (
    CPU_CONFIG,
    RunningDaemon,
    daemon_command,
    deep_merge,
    most_running,
    start_daemon,
    to_toml,
)
from taogpud.testing.fuzzing import FUZZ_CONFIG, FUZZ_SETTINGS, fuzz

MAX_CONCURRENT = 3
CLIENTS = 8
STATE_FS_SIZE = "64m"  # the tmpfs under the state directory (phase 8 fills it)


@dataclass
class Load:
    """What the client threads saw: accepted ids, latencies, every answer body (for the scan)."""

    accepted: list[str] = field(default_factory=list)
    long_jobs: bool = False  # 1.5 s sleeps that outlive a 1 s drain
    refused: Counter[str] = field(default_factory=Counter)  # error code → submits refused
    latencies_s: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


def client_loop(socket_path: Path, load: Load, seed: int) -> None:
    client = Client(socket_path, timeout_s=10)
    n = seed
    while not load.stop.is_set():
        n += 1
        ms = 1500 if load.long_jobs else 20
        task, params = ("sleep", {"ms": ms}) if n % 4 == 0 else ("noop", {})
        started = time.perf_counter()
        # Long jobs are answered at once and waited for apart: a submit still waiting when
        # the daemon is killed has no answer, so its job (retried or not) is never counted.
        wait_s = 0.0 if load.long_jobs else 5.0
        try:
            job = client.submit(task, params, wait_s=wait_s, max_retries=1 if n % 8 == 4 else 0)
        except ApiError as exc:  # queue full, draining, a full disk: try again
            with load.lock:
                load.refused[exc.code] += 1
            time.sleep(0.05)
            continue
        except DaemonUnreachable:  # restarting
            time.sleep(0.05)
            continue
        with load.lock:
            load.accepted.append(job["id"])
            load.answers.append(json.dumps(job))
        if not wait_s:
            with contextlib.suppress(ApiError, DaemonUnreachable):
                client.wait(job["id"], timeout_s=5)
        with load.lock:
            load.latencies_s.append(time.perf_counter() - started)
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


def accounted(daemon: RunningDaemon, load: Load) -> tuple[int, int, dict[str, int]]:
    """(accepted, accounted for, attempts by id): every accepted id must have a record that
    finished."""
    found, attempts = 0, {}
    with daemon.client(timeout_s=60) as client:
        for job_id in load.accepted:
            job = client.wait(job_id, timeout_s=60)
            load.answers.append(json.dumps(job))
            found += job["status"] not in ("queued", "running")
            attempts[job_id] = job["attempts"]
    return len(load.accepted), found, attempts


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
    name: str, daemon: RunningDaemon, seconds: float, fault: Any, long_jobs: bool = False
) -> tuple[RunningDaemon, dict[str, Any]]:
    load = Load(long_jobs=long_jobs)
    threads = run_load(daemon, load)
    time.sleep(seconds / 2)
    notes: list[str] = []
    daemon = fault(daemon, notes)
    time.sleep(seconds / 2)
    stop_load(load, threads)
    total, found, attempts = accounted(daemon, load)
    return daemon, {
        "phase": name,
        "accepted": total,
        "accounted": found,
        "attempts": attempts,
        "load": load,
        "notes": notes,
    }


def kill_worker(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
    with daemon.client() as client:
        pid = client.status()["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    return daemon


def hang_up_clients(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
    hang_ups(daemon, 50)
    return daemon


def restart_after(signum: int) -> Any:
    def fault(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
        daemon.stop(signum)
        return daemon.restart(env={"TAOTOKEN_API_KEY": KEY})

    return fault


def second_daemon(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
    """A second taogpud by hand, another socket, the same state directory: it must be refused
    as a start that may pass later (the directory is held), EXIT_MAY_PASS_LATER."""
    done = subprocess.run(
        daemon_command(daemon.home, "second.sock"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    notes.append(f"second daemon exit {done.returncode}: {done.stderr.strip()[:200]}")
    if done.returncode != EXIT_MAY_PASS_LATER:
        notes.append("FAULT NOT REFUSED")
    return daemon


def two_step_config(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
    """config.toml rewritten in place: the part before [scheduling] (which parses, with the
    default caps 8 and 1000), then the rest 0.25 s later."""
    whole = daemon.config_path.read_text()
    first, cut, rest = whole.partition("[scheduling]")
    with daemon.config_path.open("w") as out:
        out.write(first)
        out.flush()
        time.sleep(0.25)
        out.write(cut + rest + "\n")  # a change: the whole file is reloaded once
    return daemon


def full_disk(hold_s: float) -> Any:
    def fault(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
        if not os.path.ismount(daemon.state_dir.resolve()):
            notes.append("skipped: the state directory is not a tmpfs the soak mounted")
            return daemon
        filler = daemon.state_dir / "filler"
        with filler.open("wb") as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * (1 << 20))
        time.sleep(hold_s)
        filler.unlink()
        return daemon

    return fault


def dead_stdout_pipe(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
    """A restart into a stdout pipe nobody reads (closed at once), a second of load, SIGTERM
    (it must stop, exit 0, within 30 s), then a normal restart."""
    daemon.stop(signal.SIGTERM)
    env = {**os.environ, "TAOTOKEN_API_KEY": KEY}
    command = daemon_command(daemon.home)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    proc.stdout.close()
    time.sleep(3.0)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(30)
        notes.append(f"dead-pipe daemon stopped by SIGTERM in {time.monotonic() - started:.1f} s")
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
        notes.append("FAULT: SIGTERM did not stop the dead-pipe daemon in 30 s")
    notes.append(f"exit {code}")
    return daemon.restart(env={"TAOTOKEN_API_KEY": KEY})


def mount_state_fs(home: Path) -> str | None:
    """A tmpfs for the state directory (phase 8 fills it); None, or why it cannot be."""
    mount = home / "statefs"
    mount.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={STATE_FS_SIZE}", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return done.stderr.strip() or "mount failed"
    (home / "state").symlink_to(mount)
    return None


def runs_by_job(home: Path) -> Counter[str]:
    """job.running lines by job id, over every daemon's log."""
    runs: Counter[str] = Counter()
    for log in home.glob("logs/stdout-*.log"):
        runs.update(e["job_id"] for e in parsed(log) if e.get("event") == "job.running")
    return runs


KEY = "tk-soak-" + secrets.token_hex(12)  # made at run time: no key in any file


@dataclass
class Growth:
    """What the growth run saw at one count of jobs."""

    jobs: int
    largest_wal: int
    database: int
    rss_kib: int
    restart_s: float
    store_open_s: float  # of restart_s: the store opened, checked and read (the rest: workers)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def submit_tiny_jobs(daemon: RunningDaemon, count: int) -> int:
    """`count` noop jobs from CLIENTS threads, each waited for; the largest WAL seen, every
    500 jobs."""
    wal = daemon.state_dir / "jobs.sqlite3-wal"
    left, largest, lock = [count], [file_size(wal)], threading.Lock()

    def client_thread() -> None:
        with daemon.client() as client:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                    if left[0] % 500 == 0:
                        largest[0] = max(largest[0], file_size(wal))
                client.submit("noop", {}, wait_s=5)

    threads = [threading.Thread(target=client_thread) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return largest[0]


def growth(counts: list[int]) -> int:
    home = Path(tempfile.mkdtemp(prefix="tgd-soak-growth-", dir="/tmp"))
    config = deep_merge(CPU_CONFIG, {"scheduling": {"max_concurrent_tasks": MAX_CONCURRENT}})
    daemon = start_daemon(home, {"gpu": {"backend": "cpu"}}, config)
    rows, done = [], 0
    try:
        for count in counts:
            largest = submit_tiny_jobs(daemon, count - done)
            done = count
            rss = rss_kib(daemon.proc.pid)
            database = file_size(daemon.state_dir / "jobs.sqlite3")
            started = time.monotonic()
            daemon.stop()
            store_open_s = reopen_store(daemon.state_dir / "jobs.sqlite3")
            daemon = daemon.restart()
            restart_s = time.monotonic() - started - store_open_s
            rows.append(Growth(count, largest, database, rss, restart_s, store_open_s))
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)
    print("| jobs | largest WAL (MB) | database (MB) | daemon RSS (MB) | restart (s) | store (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row.jobs:,} | {row.largest_wal / 1e6:.1f} | {row.database / 1e6:.1f} "
            f"| {row.rss_kib / 1024:.0f} | {row.restart_s:.2f} | {row.store_open_s:.3f} |"
        )
    return 0


def reopen_store(path: Path) -> float:
    """Seconds to do what a start does with the store: open and check it, take back the
    unfinished jobs, bring the last finished ones into memory (lifecycle's RECENT_JOBS_SHOWN)."""
    started = time.monotonic()
    store = JobStore(path)
    store.unfinished()
    store.load_recent(RECENT_JOBS_SHOWN)
    took = time.monotonic() - started
    store.close()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds-per-phase", type=float, default=8.0)
    parser.add_argument("--fuzz-per-operation", type=int, default=200)
    parser.add_argument("--growth", help="job counts, e.g. 0,10000,100000")
    args = parser.parse_args()
    if args.growth:
        return growth([int(count) for count in args.growth.split(",")])
    home = Path(tempfile.mkdtemp(prefix="tgd-soak-", dir="/tmp"))
    no_tmpfs = mount_state_fs(home)
    scheduling = {**FUZZ_CONFIG["scheduling"], "max_concurrent_tasks": MAX_CONCURRENT}
    config = {**FUZZ_CONFIG, "scheduling": {**scheduling, "queue_limit": 200}}
    # the scheduling table last: phase 7 cuts the file before it
    config = {k: v for k, v in deep_merge(CPU_CONFIG, config).items() if k != "scheduling"}
    config["relay"] = {"enabled": True, "listen": "127.0.0.1:0"}  # a door to flood
    config["scheduling"] = {**scheduling, "queue_limit": 200}
    daemon = start_daemon(home, FUZZ_SETTINGS, config, env={"TAOTOKEN_API_KEY": KEY})
    assert "[" not in to_toml(config).partition("[scheduling]")[2], "scheduling is not last"
    hold_s = args.seconds_per_phase / 4
    results = []
    try:
        for name, fault, long_jobs in (
            ("kill -9 of a worker", kill_worker, False),
            ("clients hanging up while waiting", hang_up_clients, False),
            ("SIGTERM under load, restart", restart_after(signal.SIGTERM), False),
            ("kill -9 of the daemon, retryable jobs running, restart",
             restart_after(signal.SIGKILL), True),
            ("SIGTERM, jobs outliving the drain, restart", restart_after(signal.SIGTERM), True),
            ("a second daemon on the same state dir", second_daemon, False),
            ("config.toml written in two steps", two_step_config, False),
            (f"state dir full (ENOSPC) for {hold_s:g} s", full_disk(hold_s), False),
            ("dead stdout pipe, SIGTERM, restart", dead_stdout_pipe, False),
            ("idle flood of the relay's TCP port (no uid)",
             relay_flood(args.seconds_per_phase / 2), False),
            ("idle flood of the .shm socket (another uid)",
             shm_flood(args.seconds_per_phase / 2), False),
        ):  # fmt: skip
            daemon, result = phase(name, daemon, args.seconds_per_phase, fault, long_jobs)
            results.append(result)
        fuzzed = fuzz(daemon.socket_path, args.fuzz_per_operation)
    finally:
        daemon.stop()
    report = render(results, fuzzed, home, daemon)
    if no_tmpfs:
        report += f"\nstate dir on disk, not a tmpfs ({no_tmpfs}): phase 8 skipped"
    print(report)
    subprocess.run(["umount", "-l", str(home / "statefs")], capture_output=True, check=False)
    shutil.rmtree(home, ignore_errors=True)
    ok = all(r["accepted"] == r["accounted"] and not r["overrun"] for r in results)
    ok = ok and not fuzzed.failures and "FAULT" not in report
    return 0 if ok and "LEAK" not in report else 1


def render(results: list[dict[str, Any]], fuzzed: Any, home: Path, daemon: RunningDaemon) -> str:
    logs = sorted(home.glob("logs/stdout-*.log")) + sorted(home.glob("logs/stderr-*.log"))
    latencies = [s for r in results for s in r["load"].latencies_s]
    p99 = _p99_ms(latencies)
    answers = "".join(a for r in results for a in r["load"].answers)
    leaked = [p.name for p in logs if KEY in p.read_text()]
    leaked += ["API answers"] if KEY in answers else []
    runs = runs_by_job(home)
    for r in results:  # runs beyond 1 + attempts: a job run more often than its retries allow
        r["overrun"] = sum(runs[i] > 1 + a for i, a in r["attempts"].items())
        r["retried"] = sum(runs[i] > 1 for i in r["attempts"])
    lines = [
        "| fault | accepted (201) | accounted for | run more than allowed | run again (retry) "
        "| p99 ms | refused | notes |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    lines += [
        f"| {r['phase']} | {r['accepted']} | {r['accounted']} | {r['overrun']} | {r['retried']} "
        f"| {_p99_ms(r['load'].latencies_s):.1f} | {_refusals(r['load'].refused)} "
        f"| {'; '.join(r['notes'])} |"
        for r in results
    ]
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


def _p99_ms(latencies_s: list[float]) -> float:
    ordered = sorted(latencies_s)
    return ordered[int(0.99 * (len(ordered) - 1))] * 1e3 if ordered else float("nan")


def _refusals(refused: Counter[str]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(refused.items())) or "-"


if __name__ == "__main__":
    sys.exit(main())
