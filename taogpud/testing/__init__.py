"""The harness: a real taogpud as a process on a temporary state directory and socket.

What the tests, the benchmarks and the scripts share, written once (as structlog ships
`structlog.testing`): the config writers, a daemon started and stopped as a real process, a
client bound to it, `taogpuctl` aimed at its socket, and polling with a deadline. No pytest
here: tests/conftest.py wraps these in fixtures, and bench/ and scripts/ call them directly.

    with running() as daemon:                 # the CPU pair, ready, stopped and swept after
        with daemon.client() as client:
            client.run("noop", {})
        daemon.ctl("status", "--json")        # taogpuctl against its socket

    with in_process() as daemon:              # the same daemon in a thread of this process
        ...

A daemon always gets `--state-dir` (never the host's /var/lib/taogpud) and a socket under a
short folder in /tmp: sun_path holds 108 bytes and pytest's tmp_path is often longer.
Failures raise `HarnessError`, an AssertionError, so a test reads them as a failed assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, Self

import structlog

from taogpud import config as config_files
from taogpud.arrayfiles import images
from taogpud.client import ApiError, Client, DaemonUnreachable
from taogpud.daemon import lifecycle
from taogpud.errors import HarnessError as HarnessError  # drawn in errors.py; raised from here
from taogpud.host import systemd
from taogpud.host.environ import keep_from_children
from taogpud.observability import logging as tlog
from taogpud.observability import trace

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


class DaemonHandle:
    """What a test reaches a daemon by, however it runs: its socket, a client and taogpuctl
    bound to it, and the JSON trace it writes to `log_path`. RunningDaemon and
    InProcessDaemon each say whether it still runs and how it is stopped."""

    trace_start = 0  # the byte of `log_path` this handle's trace begins at (trace_from_now)

    def __init__(self, home: Path, log_path: Path, err_path: Path) -> None:
        self.home = home
        self.socket_path = home / "taogpud.sock"
        self.log_path, self.err_path = log_path, err_path
        self.settings_path = home / "settings.json"
        self.config_path = home / "config.toml"
        self.state_dir = home / "state"

    def ended(self) -> str | None:
        """How it ended ("exited 2"), or None while it runs."""
        raise NotImplementedError

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """A drain (SIGTERM), then gone; its exit code."""
        raise NotImplementedError

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
        """Every JSON line of its trace so far, parsed."""
        records = parse_trace(self.stdout_text())
        return [r for r in records if event is None or r.get("event") == event]

    def stdout_text(self) -> str:
        """The daemon's trace as written so far, raw and in whole lines, every line deferred
        before now in it."""
        self._trace_barrier()
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self.trace_start)
            return whole_lines(log.read().decode())

    def trace_from_now(self) -> Self:
        """This daemon with its trace begun now: `events`, `stdout_text` and `wait_for_event`
        of the copy leave out every line written before (a test that shares a daemon with
        other tests reads its own lines only). The same daemon: stopping the copy stops it."""
        view = copy.copy(self)
        view.trace_start = self.trace_start + len(self.stdout_text().encode())
        return view

    def _trace_barrier(self) -> None:
        """Job and request lines are written just after the daemon's current loop callback
        (observability/trace.py), so a line can follow the answer it belongs to by a moment. A
        request answered now is a barrier: every line deferred before it came in is written."""
        if self.ended() is not None or not self.socket_path.exists():
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
            f"no matching event within {timeout_s} s; log:\n{self.stdout_text()[-4000:]}"
        )

    def wait_running(self, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The job.running trace line of `job_id`, once the daemon has written it."""
        return self.wait_for_event(
            lambda e: e.get("event") == "job.running" and e.get("job_id") == job_id, timeout_s
        )

    def stderr(self) -> str:
        """What it wrote to stderr (the human-readable start and exit lines), if to its log."""
        return self.err_path.read_text() if self.err_path.exists() else ""


class RunningDaemon(DaemonHandle):
    """A taogpud process started by `launch`, its files under `home`: its stdout (the JSON
    trace) and stderr in logs/."""

    def __init__(self, proc: subprocess.Popen[bytes], home: Path, run: int = 0) -> None:
        super().__init__(home, *log_paths(home, run))
        self.proc = proc
        self.run = run  # 0 for the first start in this home, then 1, 2, … after restarts

    def restart(self, env: Mapping[str, str] | None = None) -> RunningDaemon:
        """A new daemon on the same files, socket and state directory (stop this one first)."""
        return launch(self.home, env, run=self.run + 1)

    def ended(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"exited {code}"

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
    daemon: DaemonHandle, timeout_s: float = READY_TIMEOUT_S, poll_s: float = 0.05
) -> None:
    """Return once the daemon answers its health check; HarnessError if it ends or is late."""
    deadline = time.monotonic() + timeout_s
    while not daemon.healthy():
        if (ended := daemon.ended()) is not None:
            raise HarnessError(f"taogpud {ended}: {daemon.stderr()}")
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


# --- a daemon in this process ----------------------------------------------------------------


class InProcessDaemon(DaemonHandle):
    """taogpud's own Daemon (the composition `python -m taogpud` runs: its Unix socket,
    uvicorn, the relay, the worker processes) on an event loop in a thread of this process.

    For API and scheduling behaviour: no interpreter to start, so a test's daemon is ready
    in the time its workers warm. What is the whole process's stays the test's: no signal
    handlers, umask, os.environ or garbage-collector changes (Daemon(owns_process=False)).
    Signals, kill -9, durability across restarts, systemd, real users and the process's own
    stdout and stderr are a process's: test those with RunningDaemon.

    Its trace goes to `log_path` (settings.json logging.file where the test sets one), from
    the daemon's side; its workers' own few lines (worker.warm_failed) go to this process's
    stdout. `stderr()` holds what the standard library's logging said at WARNING and above
    while it ran (uvicorn's and asyncio's tracebacks). Logging is configured for the whole
    process, so one in-process daemon runs at a time in a process."""

    def __init__(self, home: Path, snapshot: config_files.ConfigSnapshot) -> None:
        trace_file = snapshot.settings.logging.file
        logs = home / "logs"
        super().__init__(home, trace_file or logs / "trace.log", logs / "stderr.log")
        self.exit_code: int | None = None
        self.failure: BaseException | None = None  # what ended the daemon's run, if it raised
        flags = [*Pair(self.settings_path, self.config_path).flags()]
        flags += ["--socket", str(self.socket_path), "--state-dir", str(self.state_dir)]
        options = replace(lifecycle.parse_args(flags), owns_process=False)
        self._daemon: lifecycle.Daemon | None = lifecycle.Daemon(
            snapshot,
            options,
            systemd.Notifier({}),  # never systemd's, whatever this process was given
        )
        self._loop: asyncio.AbstractEventLoop | None = None  # made by start()
        self._thread = threading.Thread(
            target=self._serve, name=f"taogpud-{home.name}", daemon=True
        )  # daemon: a loop that never stopped (HarnessError said so) cannot hold the exit
        self._stopped = False

    def start(self) -> None:
        if not _IN_PROCESS.acquire(blocking=False):
            raise HarnessError("one in-process daemon at a time: stop the other one first")
        assert self._daemon is not None  # until its stop
        _process_logging(self._daemon.snapshot, self.log_path, self.err_path)
        # Made here, run there: a stop asked at once reaches the loop it will run on.
        self._loop = (lifecycle.loop_factory() or asyncio.SelectorEventLoop)()
        self._thread.start()

    def ended(self) -> str | None:
        if self._thread.is_alive() or self._thread.ident is None:
            return None
        return f"ended: {self.failure!r}" if self.failure else f"exited {self.exit_code}"

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """What SIGTERM does (a drain, within scheduling.drain_timeout_s), asked of the loop;
        after `timeout_s` a second ask skips the drain, as a second SIGTERM does. Then its
        workers are checked gone and the process's logging put back. Its exit code: 0, or
        HarnessError with what ended it otherwise."""
        if signum != signal.SIGTERM:
            raise HarnessError(f"an in-process daemon is stopped as by SIGTERM, not {signum}")
        if self._thread.ident is None:
            return 0  # never started: nothing to stop
        if not self._stopped:
            self._ask_stop(timeout_s)  # raises while it still runs: nothing is put back then
            self._stopped = True
            _process_logging_back()
            _IN_PROCESS.release()
            self._let_go()
        if self.failure is not None or self.exit_code is None:
            raise HarnessError(f"the in-process daemon {self.ended()}") from self.failure
        if self.socket_path.exists():
            raise HarnessError(f"the stopped daemon left its socket {self.socket_path}")
        return self.exit_code

    def _let_go(self) -> None:
        """Its workers gone, and what held their pipes: a spawned process's own pipe closes
        when its Process object is collected (multiprocessing's finalizer), which the Daemon
        holds through its pool."""
        _kill_left_workers()  # and multiprocessing's list of children forgets them
        self._daemon = None
        gc.collect()

    def _ask_stop(self, timeout_s: float) -> None:
        for wait_s in (timeout_s, STOP_TIMEOUT_S):  # the drain, then no drain
            if not self._thread.is_alive():
                return
            if (loop := self._loop) is not None and (daemon := self._daemon) is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(daemon.request_stop)
            self._thread.join(wait_s)
        if self._thread.is_alive():
            raise HarnessError(f"the in-process daemon did not stop within {timeout_s} s")

    def _serve(self) -> None:
        """The thread: the daemon's run on a loop of its own, as lifecycle._run runs it."""
        loop, daemon = self._loop, self._daemon
        assert loop is not None and daemon is not None  # start() made the loop
        try:
            with asyncio.Runner(loop_factory=lambda: loop) as runner:  # closes it after
                self.exit_code = runner.run(daemon.run())
        except BaseException as exc:  # a start that failed: the test's thread raises it
            self.failure = exc


_IN_PROCESS = threading.Lock()  # held while an in-process daemon runs (logging is global)
_STDLIB_HANDLER: list[logging.Handler] = []
_STRUCTLOG_BEFORE: list[dict[str, Any]] = []


def _process_logging(snapshot: config_files.ConfigSnapshot, trace_path: Path, err: Path) -> None:
    """What lifecycle.main sets before a daemon runs, minus what is the process's alone: the
    JSON lines (to stdout and `trace`), the secrets they never hold, the key's variables kept
    from workers, and the standard library's warnings in `err`."""
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    err.parent.mkdir(parents=True, exist_ok=True)
    _STRUCTLOG_BEFORE.append(structlog.get_config())
    tlog.configure(
        snapshot.settings.logging.level,
        snapshot.settings.logging.request_trace,
        for_process=False,
    )
    if unusable := tlog.set_trace_file(trace_path):
        raise HarnessError(f"the trace file cannot be written: {unusable}")
    tlog.set_secrets(*snapshot.secrets())
    keep_from_children(snapshot.config.api.api_key_env)
    handler = logging.FileHandler(err, encoding="utf-8")
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    _STDLIB_HANDLER.append(handler)


def _process_logging_back() -> None:
    """The trace file closed, the secrets and level as an unconfigured process has them."""
    trace.flush()  # what the daemon's last turn deferred (its stop flushed the rest)
    tlog.set_trace_file(None)
    tlog.set_secrets()
    tlog.set_level("info")
    tlog.set_request_trace(True)
    while _STRUCTLOG_BEFORE:  # the chain the test process had (capture_logs swaps that one)
        structlog.configure(**_STRUCTLOG_BEFORE.pop())
    while _STDLIB_HANDLER:
        handler = _STDLIB_HANDLER.pop()
        logging.getLogger().removeHandler(handler)
        handler.close()


def _kill_left_workers() -> None:
    """Workers a stopped daemon left (none, when its stop went as it should) are killed, and
    that is a failure: nothing of a daemon outlives its stop."""
    left = [p for p in multiprocessing.active_children() if p.name.startswith("taogpud-worker")]
    for process in left:
        process.kill()
        process.join(5)
    if left:
        raise HarnessError(f"workers outlived their daemon's stop: {[p.pid for p in left]}")


def start_in_process(
    home: Path,
    settings: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    wait_ready: bool = True,
) -> InProcessDaemon:
    """Write the pair in `home` (overrides merged over the CPU pair) and start a daemon on it
    in this process; ready (its socket answers) unless `wait_ready` is False."""
    pair = write_pair(home, *cpu_pair(settings, config))
    daemon = InProcessDaemon(home, config_files.load(*pair))
    daemon.start()
    if wait_ready:
        try:
            wait_for_ready(daemon)
        except BaseException:
            with contextlib.suppress(HarnessError):
                daemon.stop()  # never leave a daemon behind a failed start
            raise
    return daemon


@contextlib.contextmanager
def in_process(
    settings: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    prefix: str = "tgd-",
) -> Iterator[InProcessDaemon]:
    """`running()`'s in-process twin: a ready daemon in a thread of this process, on the
    CPU pair with these overrides; afterwards stopped, its home and /dev/shm arrays gone."""
    home = new_home(prefix)
    try:
        daemon = start_in_process(home, settings, config)
        try:
            yield daemon
        finally:
            daemon.stop()
    finally:
        remove_home(home)


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
