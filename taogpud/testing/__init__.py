"""The harness: a real taogpud as a process on a temporary state directory and socket.

What the tests, the benchmarks and the scripts share, written once (as structlog ships
`structlog.testing`): the config writers, a daemon started and stopped as a real process, a
client bound to it, `taogpuctl` aimed at its socket, and polling with a deadline. No pytest
here: tests/conftest.py wraps these in fixtures, and bench/ and scripts/ call them directly.

    with running() as daemon:                 # the CPU pair, ready, stopped and swept after
        with daemon.client() as client:
            client.run("noop", {})
        daemon.ctl("status", "--json")        # taogpuctl against its socket

A daemon always gets `--state-dir` (never the host's /var/lib/taogpud) and a socket under a
short folder in /tmp: sun_path holds 108 bytes and pytest's tmp_path is often longer.
Failures raise `HarnessError`, an AssertionError, so a test reads them as a failed assertion.
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
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from taogpud.arrayfiles import images
from taogpud.client import ApiError, Client, DaemonUnreachable

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
CTL_TIMEOUT_S = 90.0
# What picks taogpuctl's socket and files besides its flags: a harness run never inherits them.
CONTROL_ENV = ("TAOGPUD_SOCKET", "TAOGPUD_SETTINGS", "TAOGPUD_CONFIG", "OPENCLAW_CONFIG")
# What chooses the language a person reads (taogpud.i18n): not inherited by a test's children.
LANGUAGE_ENV = ("TAOGPUD_LANG", "LC_ALL", "LC_MESSAGES", "LANGUAGE", "LANG")
KEY_ENV = "TAOTOKEN_API_KEY"
KEYS_GIVEN: set[str] = set()  # every API key handed to a daemon here: no log may contain one

# The setup guide's files switched to the CPU, with two CPU devices so placement can be seen.
CPU_SETTINGS: dict[str, Any] = {"gpu": {"backend": "cpu"}, "logging": {"level": "info"}}
CPU_CONFIG: dict[str, Any] = {
    "runtime": {"device_type": "cpu", "thread_num": 1, "cpu_devices": 2},
    "backend": {"cuda": {"enabled": False, "stream_count": 2}},
}

FINISHED_EVENTS = {
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.timed_out",
    "job.interrupted",
}


class HarnessError(AssertionError):
    """A daemon did not start, stop or say what was waited for in time."""


# --- config writers ---------------------------------------------------------------------------


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`, table by table; neither is changed."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def to_toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """Enough TOML for test configs: scalars, lists and nested tables."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, Mapping)}
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{key} = {json.dumps(value)}" for key, value in scalars.items()]
    for key, table in tables.items():
        lines.append(to_toml(table, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines) + "\n"


class Pair(NamedTuple):
    """Where a settings.json and its config.toml were written (`load(*pair)` takes it)."""

    settings: Path
    config: Path

    def flags(self) -> list[str]:
        """The command-line flags that name both files."""
        return ["--settings", str(self.settings), "--config", str(self.config)]


def write_text(path: Path, text: str, atomic: bool = False) -> None:
    """Write `path`; atomic: as editors save, a temporary file renamed over the old one."""
    if not atomic:
        path.write_text(text)
        return
    temporary = path.with_name(f".{path.name}.swp")
    temporary.write_text(text)
    temporary.rename(path)


def write_pair(
    directory: Path,
    settings: Mapping[str, Any] | str,
    config: Mapping[str, Any] | str,
    atomic: bool = False,
) -> Pair:
    """settings.json and config.toml in `directory`, as given: a mapping is serialised (JSON,
    TOML), a string is written as it is. Nothing is merged: see `cpu_pair` for that."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / "settings.json", directory / "config.toml")
    write_text(
        pair.settings, settings if isinstance(settings, str) else json.dumps(settings), atomic
    )
    write_text(pair.config, config if isinstance(config, str) else to_toml(config), atomic)
    return pair


def cpu_pair(
    settings: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The CPU pair with these overrides merged over it (settings, config)."""
    return deep_merge(CPU_SETTINGS, settings or {}), deep_merge(CPU_CONFIG, config or {})


# --- polling ----------------------------------------------------------------------------------


def wait_until(
    condition: Callable[[], bool], what: str, timeout_s: float = 10.0, poll_s: float = 0.01
) -> None:
    """Return once `condition()` is true; HarnessError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise HarnessError(f"never happened within {timeout_s} s: {what}")
        time.sleep(poll_s)


# --- children ---------------------------------------------------------------------------------


def source_root() -> Path | None:
    """The checkout this taogpud was imported from; None for an installed package."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def same_code_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this checkout first on PYTHONPATH: a daemon or taogpuctl started from another
    folder runs the code the harness imported, not whichever taogpud the venv holds. An
    installed package is left to the interpreter (its site-packages never goes before the
    standard library)."""
    root = source_root()
    if root is None:
        return dict(env)
    path = [str(root), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


# --- taogpuctl --------------------------------------------------------------------------------


Ctl = Callable[..., subprocess.CompletedProcess[str]]  # taogpuctl ARGS, bound to a socket


def ctl_command(socket_path: Path | None = None) -> list[str]:
    """`python -m taogpud.cli [--socket S]`: taogpuctl with this interpreter, for Popen."""
    command = [sys.executable, "-m", "taogpud.cli"]
    return [*command, "--socket", str(socket_path)] if socket_path is not None else command


def ctl_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the control variables, the API key and the
    user's language (children speak English unless `env` gives one), then `env`."""
    dropped = (*CONTROL_ENV, KEY_ENV, *LANGUAGE_ENV)
    child_env = {k: v for k, v in os.environ.items() if k not in dropped}
    return same_code_env({**child_env, "LANG": "C.UTF-8", **(env or {})})


def taogpuctl(
    *args: str,
    socket_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = CTL_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run taogpuctl ARGS as a subprocess (text output captured, any exit status)."""
    return subprocess.run(
        [*ctl_command(socket_path), *args],
        capture_output=True,
        text=True,
        env=ctl_env(env),
        timeout=timeout_s,
        check=False,
    )


# --- traces -----------------------------------------------------------------------------------


def parse_trace(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a daemon's stdout, parsed (anything else is skipped)."""
    return [json.loads(line) for line in whole_lines(text).splitlines() if line.startswith("{")]


def whole_lines(text: str) -> str:
    """`text` up to its last newline. A file the daemon is writing can be read in the middle
    of a write, so its last line may not be whole yet; it will be at the next read."""
    return text[: text.rfind("\n") + 1]


def most_running(events: Iterable[Mapping[str, Any]]) -> int:
    """The most jobs running at once, by job id: a job leaves at any finished event."""
    running_ids: set[str] = set()
    most = 0
    for event in events:
        if event.get("event") == "job.running":
            running_ids.add(event["job_id"])
            most = max(most, len(running_ids))
        elif event.get("event") in FINISHED_EVENTS:
            running_ids.discard(event.get("job_id", ""))
    return most


# --- a daemon ---------------------------------------------------------------------------------


def log_paths(home: Path, run: int) -> tuple[Path, Path]:
    """stdout (the JSON trace) and stderr of a daemon's run, in a folder of their own: never
    beside the config pair, whose folder the daemon watches (each log line would wake the
    watcher, as no real install's logs do)."""
    return home / "logs" / f"stdout-{run}.log", home / "logs" / f"stderr-{run}.log"


class RunningDaemon:
    """A taogpud process started by `launch`, its files under `home`."""

    def __init__(self, proc: subprocess.Popen[bytes], home: Path, run: int = 0) -> None:
        self.proc = proc
        self.home = home
        self.run = run  # 0 for the first start in this home, then 1, 2, … after restarts
        self.socket_path = home / "taogpud.sock"
        self.log_path, self.err_path = log_paths(home, run)
        self.settings_path = home / "settings.json"
        self.config_path = home / "config.toml"
        self.state_dir = home / "state"

    def restart(self, env: Mapping[str, str] | None = None) -> RunningDaemon:
        """A new daemon on the same files, socket and state directory (stop this one first)."""
        return launch(self.home, env, run=self.run + 1)

    def client(self, timeout_s: float = 60.0) -> Client:
        """A client bound to this daemon's socket."""
        return Client(self.socket_path, timeout_s=timeout_s)

    def ctl(
        self, *args: str, env: Mapping[str, str] | None = None, timeout_s: float = CTL_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """taogpuctl ARGS against this daemon's socket."""
        return taogpuctl(*args, socket_path=self.socket_path, env=env, timeout_s=timeout_s)

    def healthy(self) -> bool:
        """Its socket answers /v1/health with ok (a killed daemon's socket file may linger)."""
        if not self.socket_path.exists():
            return False
        with contextlib.suppress(DaemonUnreachable), self.client(timeout_s=5) as client:
            return bool(client.health().get("ok"))
        return False

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """Every JSON line the daemon (and its workers) wrote to stdout, parsed."""
        records = parse_trace(self.stdout_text())
        return [r for r in records if event is None or r.get("event") == event]

    def stdout_text(self) -> str:
        """The daemon's stdout as written so far, raw and in whole lines, every line deferred
        before now in it."""
        self._trace_barrier()
        return whole_lines(self.log_path.read_text())

    def _trace_barrier(self) -> None:
        """Job and request lines are written just after the daemon's current loop callback
        (observability/trace.py), so a line can follow the answer it belongs to by a moment. A
        request answered now is a barrier: every line deferred before it came in is written."""
        if self.proc.poll() is not None or not self.socket_path.exists():
            return
        with contextlib.suppress(OSError, ApiError, DaemonUnreachable), self.client(5) as client:
            client.health()

    def wait_for_event(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """The first trace line for which `predicate` holds, once the daemon has written it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in self.events():
                if predicate(record):
                    return record
            time.sleep(0.05)
        raise HarnessError(
            f"no matching event within {timeout_s} s; log:\n{self.log_path.read_text()[-4000:]}"
        )

    def wait_running(self, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The job.running trace line of `job_id`, once the daemon has written it."""
        return self.wait_for_event(
            lambda e: e.get("event") == "job.running" and e.get("job_id") == job_id, timeout_s
        )

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send `signum` (a drain by default) and wait; kill -9 after `timeout_s`. Its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> int:
        """kill -9, as a crash would: nothing is drained or cleaned up. Its exit code."""
        return self.stop(signal.SIGKILL)

    def stderr(self) -> str:
        """What it wrote to stderr (the human-readable start and exit lines), if to its log."""
        return self.err_path.read_text() if self.err_path.exists() else ""


def daemon_command(
    home: Path, socket_name: str = "taogpud.sock", state_name: str = "state"
) -> list[str]:
    """`python -m taogpud` on the pair in `home`, with its socket and state directory there
    (other names: a second daemon on the same state directory or socket, which must refuse)."""
    return [
        sys.executable, "-m", "taogpud",
        "--settings", str(home / "settings.json"),
        "--config", str(home / "config.toml"),
        "--socket", str(home / socket_name),
        "--state-dir", str(home / state_name),
    ]  # fmt: skip


def launch(
    home: Path, env: Mapping[str, str] | None, wait_ready: bool = True, run: int = 0
) -> RunningDaemon:
    """Start taogpud on the pair already in `home` (this environment, then `env`)."""
    child_env = same_code_env({**os.environ, **(env or {})})
    if len(child_env.get(KEY_ENV, "")) >= 8:
        KEYS_GIVEN.add(child_env[KEY_ENV])
    out_path, err_path = log_paths(home, run)
    out_path.parent.mkdir(exist_ok=True)
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            daemon_command(home), stdout=out, stderr=err, env=child_env, cwd=home
        )
    daemon = RunningDaemon(proc, home, run)
    if wait_ready:
        try:
            wait_for_ready(daemon)
        except BaseException:
            daemon.kill()  # never leave a daemon behind a failed start
            raise
    return daemon


def wait_for_ready(
    daemon: RunningDaemon, timeout_s: float = READY_TIMEOUT_S, poll_s: float = 0.05
) -> None:
    """Return once the daemon answers its health check; HarnessError if it exits or is late."""
    deadline = time.monotonic() + timeout_s
    while not daemon.healthy():
        if daemon.proc.poll() is not None:
            raise HarnessError(f"taogpud exited {daemon.proc.returncode}: {daemon.stderr()}")
        if time.monotonic() >= deadline:
            raise HarnessError(f"taogpud was not ready within {timeout_s} s: {daemon.stderr()}")
        time.sleep(poll_s)


def start_daemon(
    home: Path,
    settings: Mapping[str, Any] | None,
    config: Mapping[str, Any] | None,
    env: Mapping[str, str] | None = None,
    wait_ready: bool = True,
    files: tuple[Path, Path] | None = None,
) -> RunningDaemon:
    """Write the pair in `home` (overrides merged over the CPU pair), or copy `files` as they
    are, and launch a daemon on it."""
    home.mkdir(parents=True, exist_ok=True)
    if files is not None:
        shutil.copy(files[0], home / "settings.json")
        shutil.copy(files[1], home / "config.toml")
    else:
        write_pair(home, *cpu_pair(settings, config))
    return launch(home, env, wait_ready=wait_ready)


# --- homes ------------------------------------------------------------------------------------


class ClientProcess:
    """A Python client in a process of its own, to be killed mid-job (`kill`): the script runs
    with `c`, a Client bound to the socket, and says it is ready by printing `ready`."""

    def __init__(self, socket_path: Path, script: str) -> None:
        prelude = (
            "import sys, numpy as np\nfrom taogpud.client import Client\nc = Client(sys.argv[1])\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", prelude + script, str(socket_path)],
            stdout=subprocess.PIPE,
            env=same_code_env(os.environ),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != b"ready\n":
            self.kill()
            raise HarnessError(f"the client process never said ready (it printed {line!r})")

    def kill(self) -> None:
        """kill -9, as a client that dies mid-job."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def new_home(prefix: str = "tgd-") -> Path:
    """A new short folder under /tmp for daemons (sun_path holds 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def key_leaks(home: Path) -> list[str]:
    """The logs under `home` that hold an API key given to a daemon here."""
    logs = home.rglob("*.log")
    return sorted({log.name for log in logs for key in KEYS_GIVEN if key in log.read_text()})


def remove_home(home: Path) -> None:
    """Remove `home` and the arrays its daemons kept in /dev/shm for a restart."""
    for state_dir in [home / "state", *home.glob("*/state")]:  # what a killed daemon left too
        for image in images.SHM_DIR.glob(f"{images.PREFIX}{images.namespace_of(state_dir)}.*"):
            image.unlink(missing_ok=True)
    shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def running(
    settings: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    prefix: str = "tgd-",
) -> Iterator[RunningDaemon]:
    """A ready daemon on the CPU pair with these overrides, in a home of its own; afterwards it
    is stopped (SIGTERM, then kill -9) and its home and /dev/shm arrays are gone."""
    home = new_home(prefix)
    try:
        daemon = start_daemon(home, settings, config, env)
        try:
            yield daemon
        finally:
            daemon.stop()
    finally:
        remove_home(home)
