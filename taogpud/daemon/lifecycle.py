"""The daemon's lifecycle: startup → serve → drain → shutdown.

Signal handlers only record what was asked; `run` is the one place that acts on
it. SIGTERM or SIGINT stops taking jobs, lets running ones finish within
scheduling.drain_timeout_s, then exits; a second one skips the wait.

Exit codes, for systemd's RestartPreventExitStatus= and for scripts: 0 a clean stop;
2 a config error (the same files fail the same way: never restarted); 1 a start that
failed otherwise (the backend cannot start, the state directory is held by another
daemon, the socket is served already): it may pass later, so systemd retries it, within
the unit's start limit. A failed start says why in one line on stderr (the journal keeps
it) and in STATUS=, where `systemctl status` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import socket
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from taogpud import __version__, config
from taogpud.api.jobs import end_waits
from taogpud.daemon.compose import STORE_NAME, Options, Services, compose
from taogpud.daemon.reload import Reloader, watch_files
from taogpud.daemon.state import DaemonState, Phase
from taogpud.daemon.state_lock import lock_state_dir, not_ours
from taogpud.doors import HttpListener, serve_http
from taogpud.errors import (
    BackendUnavailable,
    ConfigError,
    HostCannotRun,
    StateDirLocked,
    StateDirNotOurs,
    StateDiskFull,
    TaogpudError,
)
from taogpud.host import heap, systemd
from taogpud.host.environ import keep_from_children
from taogpud.host.paths import default_socket, default_state_dir
from taogpud.host.unix_socket import bind_unix_socket
from taogpud.i18n import _, user_language
from taogpud.jobs.store import JobStore
from taogpud.memfd.protocol import socket_path_for
from taogpud.memfd.server import ShmServer
from taogpud.observability import logging as tlog
from taogpud.observability import nvml, trace
from taogpud.pool.leftovers import end_resource_tracker
from taogpud.relay import listen as relay_listen

WARM_TIMEOUT_S = 300.0  # CUDA kernel compilation on a cold cache can take minutes
WORKER_STOP_TIMEOUT_S = 10.0
PRIVATE_UMASK = 0o077  # everything the daemon and its workers create: 0700 folders, 0600 files
RECENT_JOBS_SHOWN = 1000  # finished jobs brought back into memory at start, for `list`
HOUSEKEEPING_EVERY_S = 600.0
PROGRAM_SAMPLE_S = 1.0  # NVML read for the programs under CUDA leases (proof.py)
KEEP_ALIVE_S = 5  # uvicorn's timeout_keep_alive: an idle connection closes after this
# Exit codes of a start that failed, each in the unit's RestartPreventExitStatus=: systemd
# does not retry a failed start (the next client on the socket, or a restart, tries again).
# 1 stays for a crash, which it does restart. 4 and 6 are the LSB codes systemctl names
# (status=4/NOPERMISSION, status=6/NOTCONFIGURED); 75 is sysexits' EX_TEMPFAIL.
EXIT_OK, EXIT_CONFIG = 0, 2
EXIT_NO_PERMISSION = 4  # the state directory or a file in it is another user's
EXIT_HOST_CANNOT_RUN = 6  # the configured backend, here, as installed: no driver or no CuPy
EXIT_MAY_PASS_LATER = 75  # a driver still loading, the state directory or socket held

log = tlog.get_logger("taogpud.daemon")


@dataclass
class _Listeners:
    """What serves, stopped in this order: the control socket, the relay's TCP port, `.shm`."""

    control: HttpListener
    relay: HttpListener | None
    shm: ShmServer | None


class Daemon:
    def __init__(
        self,
        snapshot: config.ConfigSnapshot,
        options: Options,
        notifier: systemd.Notifier | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.options = options  # options.owns_process False: the in-process harness's
        self.notifier = notifier or systemd.Notifier()
        self._lock_fd: int | None = None
        self._stop_requested = asyncio.Event()
        self._stop_watching = asyncio.Event()
        self._signals_seen = 0
        self._owns_socket_file = True
        self.exit_hooks_safe = True  # the pool's word, read once the store is closed

    @property
    def socket_path(self) -> Path:
        return self.options.socket_path

    @property
    def state_dir(self) -> Path:
        return self.options.state_dir

    async def run(self) -> int:
        try:
            return await self._run()
        finally:
            if not self.owns_process:
                self._unlock()

    def request_stop(self) -> None:
        """What SIGTERM does: stop taking jobs, drain, stop (a second call skips the drain)."""
        self._signals_seen += 1
        self._stop_requested.set()

    @property
    def owns_process(self) -> bool:
        return self.options.owns_process

    async def _run(self) -> int:
        services, listeners = await self._startup()
        state = services.state
        loop = asyncio.get_running_loop()
        watching = loop.create_task(self._watch(services.reloader))
        background = [
            loop.create_task(coroutine)
            for coroutine in (
                _heartbeat(self.notifier, state),
                _housekeeping(state),
                _watch_programs(state),
            )
        ]
        frozen = heap.freeze_start_up() if self.owns_process else 0  # workers warm, app built
        state.status.phase = Phase.ready
        log.info(
            "daemon.ready", socket=str(self.socket_path), frozen_objects=frozen, **_summary(state)
        )
        self.notifier.ready(state.status_line())
        await self._stop_requested.wait()
        self._stop_watching.set()
        await watching
        await self._shutdown(services, listeners)
        for task in background:
            task.cancel()
        state.scheduler.programs.close()
        state.store.close()
        self.exit_hooks_safe = state.pool.exit_hooks_safe
        return 0

    async def _startup(self) -> tuple[Services, _Listeners]:
        """Bind, warm every worker, take back what the store holds, then serve.

        The state directory's lock comes first, then the socket: a second daemon on the same
        state directory or a live socket fails before it touches either or spawns anything,
        and clients that connect while the workers warm wait in the backlog."""
        self._lock_fd = lock_state_dir(self.state_dir, self.socket_path)
        relay_sock, inherited = self._inherited_sockets()
        self._owns_socket_file = inherited is None  # systemd's socket unit owns its file
        sock = inherited or bind_unix_socket(self.socket_path)
        # After the bind (the socket's folder may be new, and its users must reach it): the
        # store, its WAL, kept outputs and the workers' files are created private, whatever
        # umask the daemon was started with, never chmod-ed afterwards.
        if self.owns_process:
            os.umask(PRIVATE_UMASK)
        try:
            services = compose(self.snapshot, self.options, self.notifier)
        except BaseException:
            self._remove_socket_file()
            raise
        state = services.state
        if self.owns_process:
            self._install_signal_handlers(services.reloader)
        try:
            await state.pool.start(state.scheduler, WARM_TIMEOUT_S)
            state.scheduler.recover(state.store.unfinished())
            state.store.load_recent(RECENT_JOBS_SHOWN)
            listeners = await self._serve(services, sock, relay_sock)
        except BaseException:
            state.pool.kill_all()
            self._remove_socket_file()
            raise
        return services, listeners

    def _inherited_sockets(self) -> tuple[socket.socket | None, socket.socket | None]:
        """The relay's and the control socket systemd passed, if any (the relay's taken
        first: listen_socket() closes the rest)."""
        if not self.owns_process:
            return None, None
        return relay_listen.inherited_socket(), systemd.listen_socket()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops its flock
            self._lock_fd = None

    async def _watch(self, reloader: Reloader) -> None:
        paths = reloader.watched_paths()
        try:
            await watch_files(paths, lambda: reloader.request("watch"), self._stop_watching)
        except Exception as exc:  # e.g. inotify limits: reload still works by SIGHUP and the API
            log.error("config.watch_failed", error=f"{type(exc).__name__}: {exc}")

    async def _serve(
        self, services: Services, sock: socket.socket, relay_sock: socket.socket | None
    ) -> _Listeners:
        state = services.state
        control = await serve_http(
            services.app,
            state.doors,
            "control",
            sock,
            lambda: _control_body_limit(state),
            str(self.socket_path),
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        relay_listener = await relay_listen.start(services.relay, relay_sock, state.doors)
        if services.shm is not None:  # local clients' own memory (memfd/server.py)
            services.shm.start(socket_path_for(self.socket_path), state.doors)
        return _Listeners(control, relay_listener, services.shm)

    async def _shutdown(self, services: Services, listeners: _Listeners) -> None:
        state = services.state
        state.status.phase = Phase.draining
        drain_s = (
            0.0
            if self._signals_seen > 1
            else state.status.snapshot.config.scheduling.drain_timeout_s
        )
        self.notifier.stopping(f"draining {state.scheduler.running_total} running jobs")
        log.info("daemon.draining", running=state.scheduler.running_total, drain_timeout_s=drain_s)
        left = await state.scheduler.drain(drain_s)
        if left:
            state.scheduler.interrupt_running()
        state.status.phase = Phase.stopping
        end_waits(state)
        await listeners.control.stop()
        await relay_listen.stop(listeners.relay, services.relay)
        if listeners.shm is not None:
            listeners.shm.close()
        await state.pool.stop(WORKER_STOP_TIMEOUT_S)
        if self.owns_process:  # the tracker is the process's, a harness's too
            end_resource_tracker()  # else systemd kills it as a left-over after the unit stops
        state.arrays.release_unused()  # /dev/shm is memory: keep only what queued jobs need
        self._remove_socket_file()
        trace.flush()  # the last jobs' lines before the daemon's own
        log.info("daemon.stopped", interrupted=left, jobs_total=state.scheduler.jobs_total)

    def _remove_socket_file(self) -> None:
        if self._owns_socket_file:
            self.socket_path.unlink(missing_ok=True)

    def _install_signal_handlers(self, reloader: Reloader) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, reloader.request, "SIGHUP")

    def _on_stop_signal(self, signum: int) -> None:
        """Recorded before anything is logged: a log line can never keep a stop from happening."""
        self.request_stop()
        log.info("daemon.signal", signal=signal.Signals(signum).name, count=self._signals_seen)


async def _heartbeat(notifier: systemd.Notifier, state: DaemonState) -> None:
    """STATUS= kept current, and WATCHDOG=1 only while every warm worker answers a ping."""

    async def healthy(timeout_s: float) -> bool:
        stuck = await state.pool.unresponsive(timeout_s)
        if stuck:
            devices = [w.label for w in stuck]
            log.warning("daemon.workers_unresponsive", devices=devices, timeout_s=timeout_s)
        return not stuck

    try:
        await systemd.heartbeat(notifier, state.status_line, healthy)
    except Exception:  # no more WATCHDOG=1: systemd restarts us; say why first
        log.exception("daemon.heartbeat_failed")
        raise


async def _watch_programs(state: DaemonState) -> None:
    """NVML, sampled while programs hold CUDA leases: the proof of each (taogpud/programs/proof.py),
    with the XIDs the driver reported meanwhile where NVML reports them."""
    xids = _XidEvents()
    try:
        while True:
            await asyncio.sleep(PROGRAM_SAMPLE_S)
            watching = state.scheduler.programs.watching
            found = await xids.read(watching)
            if not watching:
                continue
            seen = await asyncio.to_thread(nvml.inventory, False)
            if seen.available:
                state.scheduler.programs.observe(seen.devices, time.monotonic(), found)
    finally:
        await xids.read(False)


class _XidEvents:
    """NVML's XID events, registered while programs hold CUDA leases, let go between."""

    def __init__(self) -> None:
        self.watch: nvml.XidWatch | None = None
        self.opened = False  # tried: None then means NVML reports no XIDs here

    async def read(self, watching: bool) -> list[nvml.Xid] | None:
        """Those reported since the last read; None where none can be (and when not watching)."""
        if not watching:
            await self._close()
            return None
        if not self.opened:
            self.watch, self.opened = await asyncio.to_thread(nvml.XidWatch.open), True
        return None if self.watch is None else await asyncio.to_thread(self.watch.drain)

    async def _close(self) -> None:
        watch, self.watch, self.opened = self.watch, None, False
        if watch is not None:
            await asyncio.to_thread(watch.close)


async def _housekeeping(state: DaemonState) -> None:
    """Apply the store's age and count limits, and drop the outputs of jobs it forgot."""
    while True:
        try:
            pruned = state.store.prune()
        except (StateDiskFull, sqlite3.OperationalError) as exc:  # a full disk: next round
            log.warning("store.prune_skipped", error=str(exc))
            pruned = 0
        # A store started afresh (the old one was damaged) does not know whose outputs the
        # folder holds: they are kept, never pruned against a store that was not read.
        removed = (
            0
            if state.store.damaged_at_start
            else remove_forgotten_outputs(state.scheduler.outputs_dir, state.store)
        )
        if pruned or removed:
            log.info("store.pruned", jobs=pruned, output_dirs=removed)
        await asyncio.sleep(HOUSEKEEPING_EVERY_S)


def remove_forgotten_outputs(outputs_dir: Path, store: JobStore) -> int:
    if not outputs_dir.is_dir():
        return 0
    forgotten = [d for d in outputs_dir.iterdir() if d.is_dir() and store.get(d.name) is None]
    for folder in forgotten:
        shutil.rmtree(folder, ignore_errors=True)
    return len(forgotten)


def _summary(state: DaemonState) -> dict[str, object]:
    return {
        "backend": state.status.backend,
        "fallback": state.status.fallback,
        "fallback_reason": state.status.fallback_reason,
        "devices": [w.label for w in state.pool.workers],
        "config_digest": state.status.snapshot.digest,
        "key_source": state.status.snapshot.key_source,
    }


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="taogpud", description="Run GPU compute jobs for everyone on this host."
    )
    # Absolute at start: the reload watcher, doctor and `taogpuctl config` see the same
    # files whatever directory they run from.
    parser.add_argument("--settings", type=_absolute, help="settings.json (AI-tool side)")
    parser.add_argument("--config", type=_absolute, help="config.toml (scheduler side)")
    parser.add_argument("--socket", type=_absolute, help="the Unix socket to serve on")
    parser.add_argument("--state-dir", type=_absolute, help="where jobs and outputs are kept")
    parser.add_argument("--version", action="version", version=f"taogpud {__version__}")
    args = parser.parse_args(argv)
    return Options(
        settings=args.settings,
        config=args.config,
        socket_path=args.socket or default_socket(),
        state_dir=args.state_dir or default_state_dir(),
    )


def _absolute(value: str) -> Path:
    """A path made absolute against the directory taogpud started in; absolute(), not
    resolve(): a config that is a symlink is replaced where the link lives."""
    return Path(value).expanduser().absolute()


def raise_open_file_limit() -> None:
    """Every client connection is a file descriptor; 1024 is too few for a shared daemon."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _control_body_limit(state: DaemonState) -> int:
    """The largest body a route of the control socket takes: an array, or a relay request."""
    relay_bytes = state.status.snapshot.config.relay.max_body_mb << 20
    return max(state.limits.max_upload_bytes, state.limits.max_json_bytes, relay_bytes)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    raise_open_file_limit()
    notifier = systemd.Notifier()
    try:
        snapshot = config.load(options.settings, options.config)
    except ConfigError as exc:
        # A person at a terminal reads it in their language; STATUS= and the log, English.
        return _refuse(notifier, "config error: " + exc.render(None), EXIT_CONFIG, exc)
    if unusable := _configure_logging(snapshot):
        return _refuse(notifier, unusable, EXIT_CONFIG)
    tlog.set_secrets(*snapshot.secrets())
    keep_from_children(snapshot.config.api.api_key_env)
    for problem in snapshot.warnings:
        log.warning("config.warning", **problem.as_dict())
    return _run(Daemon(snapshot, options, notifier), notifier)


def _run(daemon: Daemon, notifier: systemd.Notifier) -> int:
    """The daemon's life on its event loop; a start that failed is refused with its reason."""
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            code = runner.run(daemon.run())
        tlog.flush_lines()  # what the log thread still holds for a slow stdout
        if not daemon.exit_hooks_safe:  # everything is saved; a library's exit hook would abort
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except BackendUnavailable as exc:
        log.error("daemon.backend_unavailable", error=exc.message, hint=exc.hint)
        line = f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message
        code = EXIT_HOST_CANNOT_RUN if isinstance(exc, HostCannotRun) else EXIT_MAY_PASS_LATER
        return _refuse(notifier, line, code, exc)
    except (StateDirLocked, StateDirNotOurs, sqlite3.Error, OSError) as exc:
        return _refuse(notifier, *_state_refusal(daemon.state_dir, exc))


def _state_refusal(state_dir: Path, exc: Exception) -> tuple[str, int]:
    """The line and exit code for a state directory the daemon cannot use."""
    if isinstance(exc, StateDirNotOurs):
        return str(exc), EXIT_NO_PERMISSION
    if isinstance(exc, PermissionError):  # a file in the state directory another user left
        return not_ours(state_dir, Path(exc.filename or state_dir)), EXIT_NO_PERMISSION
    if isinstance(exc, sqlite3.Error):  # busy or unreadable in a way that is not damage
        where = state_dir / STORE_NAME
        if where.exists() and not os.access(where, os.R_OK | os.W_OK):
            return not_ours(state_dir, where), EXIT_NO_PERMISSION
        return f"the job store {where} cannot be opened: {exc}", EXIT_MAY_PASS_LATER
    return str(exc), EXIT_MAY_PASS_LATER  # StateDirLocked, or an OSError that may pass


def _configure_logging(snapshot: config.ConfigSnapshot) -> str | None:
    """Logging as settings.json says; why its trace file cannot be written, else None."""
    tlog.configure(snapshot.settings.logging.level, snapshot.settings.logging.request_trace)
    tlog.keep_stdout_for_lines()  # a library's print goes to stderr, never among the lines
    if unusable := tlog.set_trace_file(snapshot.settings.logging.file):
        return f"settings.json logging.file cannot be written: {unusable}"
    return None


def _refuse(
    notifier: systemd.Notifier, line: str, code: int, error: TaogpudError | None = None
) -> int:
    """A start that failed: one line on stderr (the journal keeps it) and in STATUS=.
    Read at a terminal, `error` is in its user's language; the journal's line stays English."""
    shown = line
    if error is not None and sys.stderr.isatty():
        shown = _in_language(error, user_language())
    print(f"taogpud: {shown}", file=sys.stderr)
    notifier.status(f"failed to start: {line}")
    notifier.close()
    return code


def _in_language(error: TaogpudError, language: str | None) -> str:
    """A refusal's line as a person at a terminal reads it."""
    if isinstance(error, ConfigError):
        return _("config error: {error}").format(error=error.render(language))
    said = error.body(language)
    if not said.hint:
        return said.message
    return _("{message} (fix: {fix})").format(message=said.message, fix=said.hint)


def loop_factory() -> type[asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (the daemon's, and taogpud.testing's in-process one)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.Loop
