"""Real daemons for tests: a `taogpud` process per test, reached through its real socket.

Socket paths live in a short directory under /tmp because sun_path holds 108
bytes and pytest's tmp_path is often longer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taogpud.client import ApiError, Client, DaemonUnreachable
from taogpud.pool import shm

READY_TIMEOUT_S = 60.0
KEYS_GIVEN: set[str] = set()  # every API key a test handed a daemon: no log may contain one

# The setup guide's files switched to the CPU, with two CPU devices so placement can be seen.
CPU_SETTINGS: dict[str, Any] = {"gpu": {"backend": "cpu"}, "logging": {"level": "info"}}
CPU_CONFIG: dict[str, Any] = {
    "runtime": {"device_type": "cpu", "thread_num": 1, "cpu_devices": 2},
    "backend": {"cuda": {"enabled": False, "stream_count": 2}},
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Enough TOML for test configs: scalars, lists and nested tables."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{key} = {json.dumps(value)}" for key, value in scalars.items()]
    for key, table in tables.items():
        lines.append(to_toml(table, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines) + "\n"


def log_paths(home: Path, run: int) -> tuple[Path, Path]:
    """stdout (the JSON trace) and stderr of a daemon's run, in a folder of their own: never
    beside the config pair, whose folder the daemon watches (each log line would wake the
    watcher, as no real install's logs do)."""
    return home / "logs" / f"stdout-{run}.log", home / "logs" / f"stderr-{run}.log"


class RunningDaemon:
    def __init__(self, proc: subprocess.Popen[bytes], home: Path, run: int = 0) -> None:
        self.proc = proc
        self.home = home
        self.run = run  # 0 for the first start in this home, then 1, 2, … after restarts
        self.socket_path = home / "taogpud.sock"
        self.log_path, self.err_path = log_paths(home, run)
        self.settings_path = home / "settings.json"
        self.config_path = home / "config.toml"
        self.state_dir = home / "state"

    def restart(self, env: dict[str, str] | None = None) -> RunningDaemon:
        """A new daemon on the same files, socket and state directory (stop this one first)."""
        return launch(self.home, env, run=self.run + 1)

    def client(self, timeout_s: float = 60.0) -> Client:
        return Client(self.socket_path, timeout_s=timeout_s)

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """Every JSON line the daemon (and its workers) wrote to stdout, parsed."""
        self._trace_barrier()
        parsed = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if event is None or record.get("event") == event:
                    parsed.append(record)
        return parsed

    def _trace_barrier(self) -> None:
        """Job and request lines are written just after the daemon's current loop callback
        (taogpud.trace), so a line can follow the answer it belongs to by a moment. A request
        answered now is a barrier: every line deferred before it came in is written."""
        if self.proc.poll() is not None or not self.socket_path.exists():
            return
        with contextlib.suppress(OSError, ApiError, DaemonUnreachable), self.client(5) as client:
            client.health()

    def wait_for_event(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in self.events():
                if predicate(record):
                    return record
            time.sleep(0.05)
        raise AssertionError(
            f"no matching event within {timeout_s} s; log:\n{self.log_path.read_text()[-4000:]}"
        )

    def wait_running(self, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The job.running trace line of `job_id`, once the daemon has written it."""
        return self.wait_for_event(
            lambda e: e.get("event") == "job.running" and e.get("job_id") == job_id, timeout_s
        )

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stderr(self) -> str:
        return self.err_path.read_text()


def start_daemon(
    home: Path,
    settings: dict[str, Any] | None,
    config: dict[str, Any] | None,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    files: tuple[Path, Path] | None = None,
) -> RunningDaemon:
    """Write the pair (overrides merged over the CPU pair), or copy `files` as they are."""
    home.mkdir(parents=True, exist_ok=True)
    if files is not None:
        shutil.copy(files[0], home / "settings.json")
        shutil.copy(files[1], home / "config.toml")
    else:
        (home / "settings.json").write_text(json.dumps(deep_merge(CPU_SETTINGS, settings or {})))
        (home / "config.toml").write_text(to_toml(deep_merge(CPU_CONFIG, config or {})))
    return launch(home, env, wait_ready=wait_ready)


def launch(
    home: Path, env: dict[str, str] | None, wait_ready: bool = True, run: int = 0
) -> RunningDaemon:
    command = [
        sys.executable, "-m", "taogpud",
        "--settings", str(home / "settings.json"),
        "--config", str(home / "config.toml"),
        "--socket", str(home / "taogpud.sock"),
        "--state-dir", str(home / "state"),
    ]  # fmt: skip
    child_env = {**os.environ, **(env or {})}
    if len(child_env.get("TAOTOKEN_API_KEY", "")) >= 8:
        KEYS_GIVEN.add(child_env["TAOTOKEN_API_KEY"])
    out_path, err_path = log_paths(home, run)
    out_path.parent.mkdir(exist_ok=True)
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=child_env, cwd=home)
    daemon = RunningDaemon(proc, home, run)
    if wait_ready:
        try:
            _wait_ready(daemon)
        except BaseException:
            daemon.stop(signal.SIGKILL)  # never leave a daemon behind a failed start
            raise
    return daemon


def _wait_ready(daemon: RunningDaemon) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise AssertionError(f"taogpud exited {daemon.proc.returncode}: {daemon.stderr()}")
        if daemon.socket_path.exists():
            with daemon.client(timeout_s=5) as client, contextlib.suppress(DaemonUnreachable):
                if client.health().get("ok"):  # a killed daemon's socket file may linger
                    return
        time.sleep(0.05)
    raise AssertionError(f"taogpud was not ready within {READY_TIMEOUT_S} s: {daemon.stderr()}")


@pytest.fixture
def daemon_home() -> Iterator[Path]:
    """A short folder for daemons (sun_path); afterwards no log in it may hold a given API key."""
    home = Path(tempfile.mkdtemp(prefix="tgd-", dir="/tmp"))
    yield home
    leaks = [
        log.name for log in home.rglob("*.log") for key in KEYS_GIVEN if key in log.read_text()
    ]
    for state_dir in home.glob("*/state"):  # what a killed daemon left in /dev/shm
        for image in shm.SHM_DIR.glob(f"{shm.PREFIX}{shm.namespace_of(state_dir)}.*"):
            image.unlink(missing_ok=True)
    shutil.rmtree(home, ignore_errors=True)
    assert leaks == [], f"an API key was written to {leaks}"


@pytest.fixture
def daemon_factory(daemon_home: Path) -> Iterator[Callable[..., RunningDaemon]]:
    """Start daemons with setting/config overrides merged over the CPU pair; stops them all."""
    started: list[RunningDaemon] = []

    def factory(
        settings: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        files: tuple[Path, Path] | None = None,
    ) -> RunningDaemon:
        home = daemon_home / f"d{len(started)}"
        daemon = start_daemon(home, settings, config, env, wait_ready, files)
        started.append(daemon)
        return daemon

    yield factory
    for daemon in started:
        daemon.stop(signal.SIGTERM, timeout_s=15)


@pytest.fixture
def daemon(daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    """A ready daemon on the CPU backend: 2 devices, 2 slots each, the seed's caps."""
    return daemon_factory()


HOST_STATE_DIR = Path("/var/lib/taogpud")  # a root daemon's default: the booted containers
# overlay the host's /var, so a test that left a file there would break the systemd tier


@pytest.fixture(autouse=True, scope="session")
def _host_state_dir_untouched() -> Iterator[None]:
    """No test may start a daemon on the host's default state directory (pass --state-dir)."""
    existed = HOST_STATE_DIR.exists()
    yield
    if not existed and HOST_STATE_DIR.exists() and os.geteuid() == 0:
        lock = HOST_STATE_DIR / "taogpud.lock"  # names the daemon's pid and socket
        holder = lock.read_text() if lock.exists() else "no lock file"
        shutil.rmtree(HOST_STATE_DIR, ignore_errors=True)  # leave the host as it was, then say
        pytest.fail(f"a daemon used {HOST_STATE_DIR} ({holder}): start daemons with --state-dir")


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size_mb: int) -> Iterator[Path]:
    """A small tmpfs mounted at `folder`, for a real ENOSPC (CI runs as root; skipped with the
    reason where mounting is not allowed)."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
