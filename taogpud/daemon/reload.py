"""Hot reload: both files re-read and validated as a pair, then swapped in one step.

Triggers — a save seen by watchfiles, SIGHUP, POST /v1/config/reload — all end in
`Reloader.reload`, one at a time. An invalid pair changes nothing: the error is
logged, kept for `taogpuctl config status` and shown in systemd's STATUS=. A valid
pair bumps the generation and logs the diff; scheduling, logging, channel and
memoryFraction keys apply at once, and keys that need new workers roll them one
device at a time, each drained first, so no accepted job is lost.

Editors save by writing a temporary file and renaming it over the old one, which
loses a watch on the file itself: the parent directories are watched and filtered
to the two paths.

A file written in place, in steps, can parse halfway (a config.toml cut before its
[scheduling] table is valid, with the defaults): a change the watcher saw is applied only
once both files have stood still (the same size, mtime and digest) for `reload.quiet_s`,
2 s by default: longer than an editor's two-step save, whose parts come about a second
apart. Our own quiet period, not watchfiles' `step` (its quiet time) set to 2 s: its
quiet is over every file of the watched folders (the filter runs after), so a log written
beside the config would hold a save back, and its stop event is checked once a step.
The safe way to edit is still an atomic rename (write a temporary file in the same
folder, then `mv` it over the old one), which no reader ever sees half-done.
SIGHUP and POST /v1/config/reload are an operator saying the files are ready: no wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchfiles import Change, awatch

from taogpud import config
from taogpud.arrayfiles.store import ArrayStore, array_budget_bytes, upload_quota_bytes
from taogpud.config.problem import Problem
from taogpud.config.ray import restart_only
from taogpud.daemon.state import DaemonStatus, Phase, status_line
from taogpud.errors import BackendUnavailable, ConfigError
from taogpud.host.environ import keep_from_children
from taogpud.host.systemd import Notifier
from taogpud.jobs.policy import Policy
from taogpud.jobs.scheduler import Scheduler
from taogpud.observability import logging as tlog
from taogpud.pool.interface import Pool
from taogpud.pool.plan import plan_workers
from taogpud.wire import ChangeView, ReloadView

WATCH_STEP_MS = 50  # quiet time after a change before it is acted on
WATCH_DEBOUNCE_MS = 400  # the most changes are grouped for (a file written in steps)
WARM_TIMEOUT_S = 300.0
SETTLE_POLL_S = 0.1  # how often the files are read while they settle
MAX_SETTLE_S = 10.0  # a file rewritten forever is read as it is after this long

log = tlog.get_logger("taogpud.reload")


class Reloader:
    """Reloads one at a time; it writes the daemon's status (the snapshot, the generation,
    the last reload, the backend after a roll) and tells the services what changed."""

    def __init__(
        self,
        status: DaemonStatus,
        services: tuple[Pool, Scheduler, ArrayStore],
        notifier: Notifier,
        settings_arg: Path | None,
        config_arg: Path | None,
    ) -> None:
        self.status = status
        self.pool, self.scheduler, self.arrays = services
        self.notifier = notifier
        self._args = (settings_arg, config_arg)
        self._lock = asyncio.Lock()
        self._waiting_triggers: list[str] = []  # requests not yet picked up by a reload
        self._tasks: set[asyncio.Task[ReloadView]] = set()

    def request(self, trigger: str) -> None:
        """From a signal handler or the watcher: reload soon. Requests that come while one
        waits join it (it reads the files after them) and are named in its trigger. Only a
        ready daemon reloads (as POST /v1/config/reload says): one still warming or already
        stopping drops the request, with a log line."""
        if self.status.phase is not Phase.ready:
            log.warning("config.reload_ignored", trigger=trigger, phase=self.status.phase.value)
            return
        self._waiting_triggers.append(trigger)
        if len(self._waiting_triggers) > 1:
            return
        task = asyncio.get_running_loop().create_task(self.reload(""))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self, trigger: str) -> ReloadView:
        """`trigger` "" takes the waiting requests' names ("watch+SIGHUP")."""
        async with self._lock:
            if not trigger:
                trigger = "+".join(dict.fromkeys(self._waiting_triggers)) or "request"
                self._waiting_triggers.clear()
            if "watch" in trigger.split("+"):
                await self._settled()
            self.notifier.reloading()
            try:
                view = await self._reload(trigger)
            finally:
                self.notifier.ready(status_line(self.status, self.pool, self.scheduler))
            self.status.last_reload = view
            return view

    async def _reload(self, trigger: str) -> ReloadView:
        old = self.status.snapshot
        try:
            new = config.load(*self._args, previous=old)
            changes = config.diff(old, new)
            # In a thread: planning may probe a backend in a child process (opencl: ~2 s),
            # and the API and the watchdog heartbeat must keep answering meanwhile.
            plan = (
                await asyncio.to_thread(plan_workers, new)
                if config.needs_restart(changes)
                else None
            )
        except ConfigError as exc:
            return self._rejected(trigger, exc.problems)
        except BackendUnavailable as exc:
            return self._rejected(trigger, [_backend_problem(exc)])
        warnings = tuple(w.as_dict() for w in new.warnings)
        if not changes:
            log.info("config.unchanged", trigger=trigger, generation=self.status.generation)
            return ReloadView(
                ok=True,
                at=time.time(),
                trigger=trigger,
                generation=self.status.generation,
                warnings=warnings,
            )
        warnings += tuple(p.as_dict() for p in restart_only(changes))  # executor: next start
        self._swap(new, changes, trigger, restart=plan is not None)
        errors: tuple[dict[str, str], ...] = ()
        if plan is not None:
            problems = await self.pool.roll(plan.specs, WARM_TIMEOUT_S)
            self.status.backend, self.status.fallback_reason = plan.backend, plan.fallback_reason
            errors = tuple(_worker_problem(p).as_dict() for p in problems)
        return ReloadView(
            ok=not errors,
            at=time.time(),
            trigger=trigger,
            generation=self.status.generation,
            changes=tuple(ChangeView(key=k, old=o, new=n) for k, o, n in changes),
            restarted_workers=plan is not None,
            errors=errors,
            warnings=warnings,
        )

    def _swap(
        self, new: config.ConfigSnapshot, changes: list[Any], trigger: str, restart: bool
    ) -> None:
        """Everything live changes here, in one step, before anything awaits."""
        old = self.status.snapshot
        self.status.snapshot = new
        self.status.generation += 1
        self.scheduler.apply_policy(Policy.from_snapshot(new))
        self.arrays.budget_bytes = array_budget_bytes(new)  # the quota's default follows it
        self.arrays.user_quota_bytes = upload_quota_bytes(new, self.arrays)
        keep_from_children(new.config.api.api_key_env)  # workers rolled from now on
        tlog.set_level(new.settings.logging.level)
        tlog.set_request_trace(new.settings.logging.request_trace)
        new_file = new.settings.logging.file
        if new_file != old.settings.logging.file and (problem := tlog.set_trace_file(new_file)):
            log.warning("logging.file_unusable", problem=problem)
        tlog.set_secrets(*old.secrets(), *new.secrets())
        if new.settings.gpu.memory_fraction != old.settings.gpu.memory_fraction:
            self.pool.set_memory_fraction(new.settings.gpu.memory_fraction)
        log.info(
            "config.reloaded",
            trigger=trigger,
            generation=self.status.generation,
            restart_workers=restart,
            changes=[{"key": k, "old": o, "new": n} for k, o, n in changes],
        )

    def _rejected(self, trigger: str, problems: list[Problem]) -> ReloadView:
        errors = [p.as_dict() for p in problems]
        log.error(
            "config.reload_failed",
            trigger=trigger,
            generation=self.status.generation,
            errors=errors,
        )
        return ReloadView(
            ok=False,
            at=time.time(),
            trigger=trigger,
            generation=self.status.generation,
            errors=tuple(errors),
        )

    async def _settled(self) -> None:
        """Wait until the files have not changed for reload.quiet_s (see the module's doc)."""
        paths = self.watched_paths()
        quiet_s = self.status.snapshot.config.reload.quiet_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MAX_SETTLE_S
        seen, changed_at = _fingerprints(paths), loop.time()
        while loop.time() - changed_at < quiet_s and loop.time() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)
            now = _fingerprints(paths)
            if now != seen:
                log.debug("config.settling", files=[str(p) for p in paths])
                seen, changed_at = now, loop.time()

    def watched_paths(self) -> list[Path]:
        snapshot = self.status.snapshot
        chosen = (
            arg or path
            for arg, path in zip(
                self._args, (snapshot.settings_path, snapshot.config_path), strict=True
            )
        )
        return [path for path in chosen if path is not None]


async def watch_files(
    paths: list[Path], on_change: Callable[[], None], stop: asyncio.Event
) -> None:
    """Call on_change after each burst of changes to any of `paths` (saved, renamed, removed)."""
    # absolute(), not resolve(): a config that is a symlink is replaced where the link lives
    targets = {path.absolute() for path in paths}
    folders = sorted({t.parent for t in targets if t.parent.is_dir()})
    if not folders:
        return

    def ours(_: Change, path: str) -> bool:
        return Path(path).absolute() in targets

    log.info("config.watching", files=sorted(str(t) for t in targets))
    async for _ in awatch(
        *folders,
        watch_filter=ours,
        recursive=False,
        step=WATCH_STEP_MS,
        debounce=WATCH_DEBOUNCE_MS,
        stop_event=stop,
    ):
        on_change()


def _fingerprints(paths: list[Path]) -> list[tuple[int, int, str] | None]:
    """Size, mtime and digest of each file (None: missing or unreadable, itself a state)."""
    prints: list[tuple[int, int, str] | None] = []
    for path in paths:
        try:
            data = path.read_bytes()
            prints.append((len(data), path.stat().st_mtime_ns, hashlib.sha256(data).hexdigest()))
        except OSError:
            prints.append(None)
    return prints


def _backend_problem(exc: BackendUnavailable) -> Problem:
    return Problem(
        "settings.json", "gpu.backend", exc.message, exc.hint or "keep the current backend"
    )


def _worker_problem(message: str) -> Problem:
    fix = "the new config is in force; the daemon log says why the worker failed, it is retried"
    return Problem("config.toml", "workers", message, fix)
