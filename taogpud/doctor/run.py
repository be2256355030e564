"""Running the doctor: gathering what the checks need, in the daemon and in taogpuctl.

    GET /v1/doctor  → daemon_checks(state, peer, options)      the daemon's view: its key, its
                                                               channel, its workers, its host
    taogpuctl doctor → cli_checks(answer, running_config, …)   adds what only the caller knows:
                                                               its shell, the files it reads
                    → offline_checks(why, …)                   the daemon cannot be reached:
                                                               everything that works without it

Exit code (DESIGN §11): 1 when any check fails, and an unreachable daemon is a failed check
("daemon"), so doctor exits 1 there too and still prints the report; `api ping` exits 3.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

from taogpud import __version__
from taogpud.config.problem import Problem
from taogpud.doctor import (
    Check,
    CheckStatus,
    Target,
    check_api_channel,
    check_api_key,
    check_config_files,
    check_config_pair,
    check_probe,
    check_recent_backends,
    check_shell_env,
    guarded,
    in_order,
)
from taogpud.doctor.executor import executor_checks
from taogpud.doctor.gpu import (
    CudaRuntime,
    HostFacts,
    check_wsl,
    gather_host,
    host_checks,
    read_proc_version,
)
from taogpud.errors import ConfigError, TaogpudError
from taogpud.i18n import Text
from taogpud.jobs.records import JobRecord, Peer
from taogpud.observability import nvml
from taogpud.observability.logging import get_logger
from taogpud.provider.channel import ChannelSettings, key_advice, key_sources_tried, ping

if TYPE_CHECKING:
    from taogpud.config import ConfigSnapshot
    from taogpud.daemon.state import DaemonState

log = get_logger("taogpud.doctor")

PROBE_PRIORITY = 1000  # ahead of the queue: the probe says where jobs run, not how busy it is
RECENT_JOBS = 1000
DAEMON_ONLY = ("api_channel", "probe_job", "recent_backends", "api_key")
NEEDS_THE_DAEMON = Text("needs the daemon, which cannot be reached")
HOST_CHECKS = ("config_pair", "cuda_driver", "cuda_arch", "gpu_memory", "wsl")
DEFAULT_KEY_ENV = "TAOTOKEN_API_KEY"


@dataclass(frozen=True)
class Options:
    ping: bool = True  # the API channel ping (one tiny request to the provider)
    probe: bool = True  # a probe job on every worker
    timeout_s: float = 30.0  # caps the ping, and the wait for the probes


# --- in the daemon --------------------------------------------------------------------------


async def daemon_checks(state: DaemonState, peer: Peer, options: Options) -> list[Check]:
    """Every daemon-side check; the ping, the probes and the host facts run at once."""
    snapshot = state.status.snapshot
    target = Target.of(snapshot)
    pinged = asyncio.create_task(_ping_check(snapshot, options))
    host = asyncio.create_task(asyncio.to_thread(_host_facts))
    probed = asyncio.create_task(_probe_all(state, peer, options))
    opencl = asyncio.create_task(asyncio.to_thread(_opencl_check, snapshot))
    facts, api_channel, (probes, problems) = await asyncio.gather(host, pinged, probed)
    if options.probe:
        probe = guarded("probe_job", check_probe, target, probes, facts.inventory, problems)
    else:
        probe = Check("probe_job", "skip", Text("not run ({why})", why="--no-probe"))
    own_pids = [worker.pid for worker in state.pool.workers if worker.pid]
    recent = state.store.recent(limit=RECENT_JOBS)
    api = snapshot.config.api
    tried = key_sources_tried(snapshot, os.environ)
    return in_order(
        [
            api_channel,
            probe,
            guarded("recent_backends", check_recent_backends, target, recent),
            *host_checks(target, facts, own_pids),
            await opencl,
            guarded(
                "api_key",
                check_api_key,
                snapshot.key_source,
                api.api_key_env,
                tried,
                key_advice(os.environ, api.api_key_env),  # the daemon's own environment
            ),
            guarded("config_pair", check_config_pair, snapshot.settings, snapshot.config),
            *executor_checks(state.pool),  # executor "ray" only: the cluster and its actors
        ]
    )


def daemon_facts(state: DaemonState) -> dict[str, Any]:
    """Who answered: what the CLI needs to add its own checks (no secrets)."""
    snapshot = state.status.snapshot
    return {
        "version": __version__,
        "pid": os.getpid(),
        "backend": state.status.backend,
        "fallback": state.status.fallback,
        "fallback_reason": state.status.fallback_reason,
        "key_source": snapshot.key_source,
        "api_key_env": snapshot.config.api.api_key_env,
        "settings_path": str(snapshot.settings_path) if snapshot.settings_path else None,
        "config_path": str(snapshot.config_path) if snapshot.config_path else None,
        "config_digest": snapshot.digest,
        "config_generation": state.status.generation,
    }


async def _ping_check(snapshot: ConfigSnapshot, options: Options) -> Check:
    if not options.ping:
        return check_api_channel(None, "--no-ping")
    try:
        result = await ping(
            ChannelSettings.from_snapshot(snapshot), "default", deadline_s=options.timeout_s
        )
    except Exception as exc:  # ping classifies every failure; this is a bug
        log.exception("doctor.ping_crashed")
        return Check("api_channel", "fail", f"the ping itself failed: {type(exc).__name__}")
    return check_api_channel(result)


async def _probe_all(
    state: DaemonState, peer: Peer, options: Options
) -> tuple[list[JobRecord], list[tuple[CheckStatus, str]]]:
    """A probe pinned to each worker (retired ones aside), waited for together."""
    from taogpud.wire import JobRequest

    jobs: list[JobRecord] = []
    problems: list[tuple[CheckStatus, str]] = []
    if not options.probe:
        return jobs, problems
    for worker in state.pool.workers:
        if getattr(worker, "retired", False):
            continue
        if worker.state.value != "warm":
            status: CheckStatus = "fail" if worker.state.value == "dead" else "warn"
            text = (
                f"{worker.label}: the worker is {worker.state.value} (restarts {worker.restarts})"
            )
            problems.append((status, text))
            continue
        request = JobRequest(
            task="probe",
            params={},
            inputs={},
            device=worker.spec.index,
            priority=PROBE_PRIORITY,
            timeout_s=options.timeout_s,
        )
        try:
            jobs.append(state.scheduler.submit(request, peer))
        except TaogpudError as exc:
            problems.append(("fail", f"{worker.label}: the probe was refused: {exc.message}"))
    await asyncio.gather(*(state.store.wait(job.id, options.timeout_s) for job in jobs))
    return [state.store.get(job.id) or job for job in jobs], problems


def _opencl_check(snapshot: ConfigSnapshot) -> Check:
    """OpenCL as a child process finds it (PoCL may abort the process that builds a kernel).
    Guarded whole: starting that child can fail too (seen once: EFAULT from the spawn in a
    daemon whose Ray head had just been killed), and that is a failed check, not a 500."""
    return guarded("opencl", _probe_and_check_opencl, snapshot)


def _probe_and_check_opencl(snapshot: ConfigSnapshot) -> Check:
    from taogpud.backends.opencl import probe as opencl_probe
    from taogpud.doctor.opencl import check_opencl

    opencl = snapshot.config.backend.opencl
    wanted = snapshot.opencl_device_ids()
    build_on = (opencl.platform_index, wanted) if snapshot.backend == "opencl" else None
    found = opencl_probe.inventory(build_on=build_on)
    return check_opencl(snapshot.backend, opencl.platform_index, wanted, found)


def _host_facts() -> HostFacts:
    try:
        return gather_host()
    except Exception as exc:  # each part catches its own failures; this is a bug
        log.exception("doctor.host_facts_crashed")
        reason = f"reading the host failed: {type(exc).__name__}: {exc}"
        return HostFacts(nvml.Inventory(reason=reason), CudaRuntime(None, None, reason), "")


# --- in taogpuctl ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OfflineConfig:
    """The pair as this shell reads it."""

    label: str  # "settings.json PATH + config.toml PATH"
    snapshot: ConfigSnapshot | None
    problems: list[Problem]
    unreadable: str | None = None  # a path that exists but this user may not read


def load_offline(
    settings: Path | None, config: Path | None, environ: Mapping[str, str]
) -> OfflineConfig:
    from taogpud.config import load, resolve_paths

    settings_at, config_at, _, _ = resolve_paths(settings, config, environ=environ)
    label = (
        f"settings.json {settings_at or '(embedded defaults)'} + "
        f"config.toml {config_at or '(embedded defaults)'}"
    )
    for path in (settings_at, config_at):
        if path is not None and path.exists() and not os.access(path, os.R_OK):
            return OfflineConfig(label, None, [], str(path))
    try:
        snapshot = load(settings_at, config_at, environ=environ)
    except ConfigError as exc:
        return OfflineConfig(label, None, list(exc.problems))
    return OfflineConfig(label, snapshot, list(snapshot.warnings))


def cli_checks(
    answer: Mapping[str, Any],
    running_config: Mapping[str, Any] | None,
    socket_path: str,
    files: tuple[Path | None, Path | None],
    environ: Mapping[str, str],
) -> list[Check]:
    """The daemon's report (GET /v1/doctor) plus the checks only the caller can make."""
    daemon = answer.get("daemon") or {}
    checks = [_check_from(entry) for entry in answer.get("checks") or []]
    env_name = str(daemon.get("api_key_env") or DEFAULT_KEY_ENV)
    settings = files[0] or _path(daemon.get("settings_path"))
    config = files[1] or _path(daemon.get("config_path"))
    offline = load_offline(settings, config, environ)
    on_disk = offline.snapshot.redacted() if offline.snapshot else None
    return in_order(
        [
            _reachable(daemon, socket_path),
            *checks,
            check_shell_env(bool(environ.get(env_name)), env_name, daemon.get("key_source")),
            check_config_files(
                offline.label, offline.problems, running_config, on_disk, offline.unreadable
            ),
        ]
    )


def offline_checks(
    message: str, hint: str, files: tuple[Path | None, Path | None], environ: Mapping[str, str]
) -> list[Check]:
    """The report when the daemon cannot be reached: a fail for that, and what works without it."""
    offline = load_offline(*files, environ)
    snapshot = offline.snapshot
    env_name = snapshot.config.api.api_key_env if snapshot else DEFAULT_KEY_ENV
    checks = [
        Check("daemon", "fail", message, hint),
        check_shell_env(bool(environ.get(env_name)), env_name, None),
        check_config_files(
            offline.label,
            offline.problems,
            None,
            None if snapshot is None else snapshot.redacted(),
            offline.unreadable,
        ),
        *(Check(name, "skip", NEEDS_THE_DAEMON) for name in DAEMON_ONLY),
    ]
    if snapshot is None:
        why = Text("the config does not load here (see config_files)")
        checks += [Check(name, "skip", why) for name in HOST_CHECKS if name != "wsl"]
        checks.append(check_wsl(read_proc_version(), Target.of_defaults()))
    else:
        checks.append(check_config_pair(snapshot.settings, snapshot.config))
        checks += host_checks(Target.of(snapshot, environ), _host_facts())
        checks.append(_opencl_check(snapshot))
    return in_order(checks)


def _reachable(daemon: Mapping[str, Any], socket_path: str) -> Check:
    backend = daemon.get("backend", "?")
    if daemon.get("fallback"):
        backend += f" (FALLBACK: {daemon.get('fallback_reason')})"
    answers = Text(
        "taogpud {version} (pid {pid}) answers on {socket}: backend {backend}, config "
        "generation {generation}",
        version=daemon.get("version", "?"),
        pid=daemon.get("pid", "?"),
        socket=socket_path,
        backend=backend,
        generation=daemon.get("config_generation"),
    )
    return Check("daemon", "pass", answers)


def _check_from(entry: Mapping[str, Any]) -> Check:
    given = str(entry.get("status"))
    status = cast(CheckStatus, given) if given in get_args(CheckStatus) else "fail"
    name, detail, hint = (str(entry.get(key, "")) for key in ("name", "detail", "hint"))
    return Check(name or "?", status, detail, hint)


def _path(value: Any) -> Path | None:
    return Path(value) if isinstance(value, str) and value else None
