"""`taogpuctl doctor`: the setup guide's checklist as checks, each a small function.

    check            runs in   what it proves
    daemon           CLI       taogpud answers on its socket
    api_channel      daemon    the guide's ping, with the daemon's key (channel.py)
    probe_job        daemon    a probe job on every worker reports device=gpu:N backend=cuda,
                               and NVML sees that worker on that GPU
    recent_backends  daemon    the backends recent jobs really ran on
    cuda_driver      daemon*   the driver's CUDA version against the CuPy runtime's
    cuda_arch        daemon*   backend.cuda.cuda_arch against each card's compute capability
    gpu_memory       daemon*   memoryFraction × total against the memory free now, and who holds
                               the rest
    opencl           daemon*   the OpenCL platforms and devices, and the configured ones among them
    api_key          daemon    the daemon holds a key, and from which source
    shell_env        CLI       whether the calling shell has the key's env var (it need not)
    config_pair      daemon    settings.json and config.toml agree (the config's own rules)
    config_files     CLI       the files on disk load, and match what the daemon runs
    wsl              daemon*   WSL2 or not (about 4 % below native Linux is normal there)

    * run by the CLI itself, on the files it can read, when the daemon cannot be reached.

Each check returns a `Check`: pass | warn | fail | skip, a detail saying what was found and a
hint saying how to fix it. A check never raises: `guarded` turns a bug in one into a fail of
that check alone. Checks are pure functions of what they are given (tests feed them data).

    __init__.py  Check, Target, and the checks of the channel, the key, jobs and config
    gpu.py       the host's checks (cuda_driver, cuda_arch, gpu_memory, wsl) and their facts
    executor.py  the executor's checks
    run.py       gathering the data and running the checks: in the daemon, and in the CLI
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from taogpud.config.rules import check_pair
from taogpud.i18n import Text, joined, render
from taogpud.jobs.records import JobRecord, JobState
from taogpud.observability import nvml
from taogpud.observability.logging import get_logger

if TYPE_CHECKING:
    from taogpud.config import ConfigFile, ConfigSnapshot, SettingsFile
    from taogpud.provider.channel import PingResult

log = get_logger("taogpud.doctor")

CheckStatus = Literal["pass", "warn", "fail", "skip"]
ORDER = (
    "daemon",
    "api_channel",
    "relay",
    "probe_job",
    "recent_backends",
    "cuda_driver",
    "cuda_arch",
    "gpu_memory",
    "opencl",
    "api_key",
    "shell_env",
    "config_pair",
    "config_files",
    "wsl",
)
_RANK: dict[CheckStatus, int] = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str  # a Text (taogpud.i18n) is put into the reader's language where it is shown
    hint: str = ""

    def as_dict(self, language: str | None = None) -> dict[str, str]:
        """The check as the API and --json show it: English unless `language` is given."""
        return {
            "name": self.name,
            "status": self.status,
            "detail": render(self.detail, language),
            "hint": render(self.hint, language),
        }


def worst(statuses: Iterable[CheckStatus]) -> CheckStatus:
    return max(statuses, key=_RANK.__getitem__, default="skip")


def report_ok(checks: Iterable[Check]) -> bool:
    return all(check.status != "fail" for check in checks)


def in_order(checks: Iterable[Check]) -> list[Check]:
    position = {name: index for index, name in enumerate(ORDER)}
    return sorted(checks, key=lambda check: position.get(check.name, len(ORDER)))


def guarded(name: str, check: Callable[..., Check], *args: Any) -> Check:
    """Run one check; a bug in it fails that check, not the report."""
    try:
        return check(*args)
    except Exception as exc:
        log.exception("doctor.check_crashed", check=name)
        return Check(
            name,
            "fail",
            Text("the check itself failed: {kind}: {error}", kind=type(exc).__name__, error=exc),
            Text("a bug in taogpud; the log has the traceback"),
        )


@dataclass(frozen=True)
class Target:
    """What the config asks for, as far as the checks care."""

    backend: str  # gpu.backend: cuda | cpu | opencl
    allow_fallback: bool
    device_ids: Sequence[int] | Literal["all"]  # backend.cuda.device_id, as CUDA numbers them
    cuda_arch: str
    memory_fraction: float
    pool_size_mb: int = 0
    cuda_visible_devices: str | None = None  # the daemon's CUDA_VISIBLE_DEVICES

    @classmethod
    def of(cls, snapshot: ConfigSnapshot, environ: Mapping[str, str] | None = None) -> Target:
        env = os.environ if environ is None else environ
        return cls(
            backend=snapshot.settings.gpu.backend,
            allow_fallback=snapshot.settings.gpu.allow_fallback_to_cpu,
            device_ids=snapshot.cuda_device_ids(),
            cuda_arch=snapshot.config.backend.cuda.cuda_arch,
            memory_fraction=snapshot.settings.gpu.memory_fraction,
            pool_size_mb=snapshot.config.memory.pool_size_mb,
            cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        )

    @classmethod
    def of_defaults(cls) -> Target:
        """The seed's target (the embedded defaults), for when no config loads."""
        from taogpud.config import ConfigFile, SettingsFile

        settings, config = SettingsFile(), ConfigFile()
        return cls(
            backend=settings.gpu.backend,
            allow_fallback=settings.gpu.allow_fallback_to_cpu,
            device_ids=[0],
            cuda_arch=config.backend.cuda.cuda_arch,
            memory_fraction=settings.gpu.memory_fraction,
        )

    @property
    def wants_cuda(self) -> bool:
        return self.backend == "cuda"

    def severity(self) -> CheckStatus:
        """A GPU problem fails a cuda config and only warns on another backend."""
        return "fail" if self.wants_cuda else "warn"


# --- the API channel and the key ----------------------------------------------------------------


def check_api_channel(result: PingResult | None, skipped_because: str = "") -> Check:
    name = "api_channel"
    if result is None:
        if skipped_because:
            return Check(name, "skip", Text("not run ({why})", why=skipped_because))
        return Check(name, "skip", Text("not run"))
    tries = Text(", {n} attempts", n=result.attempts) if result.attempts > 1 else ""
    if result.ok:
        answered = Text(
            "{model} answered in {ms} ms at {url} (key from {source}{tries})",
            model=result.answered_model or result.model,
            ms=format(result.latency_ms or 0, ".0f"),
            url=result.url,
            source=result.key_source,
            tries=tries,
        )
        return Check(name, "pass", answered)
    return Check(name, "fail", f"{result.status}: {result.detail}", result.hint)


def check_api_key(
    key_source: str, env_name: str, tried: Sequence[str] = (), advice: str = ""
) -> Check:
    """Where the daemon's key comes from; without one, `advice` (channel.key_advice: how to
    give it one, the way the daemon was started) is the fix."""
    name = "api_key"
    if key_source == "credential":
        detail = Text("the daemon holds a key from the systemd credential taotoken_api_key")
        return Check(name, "pass", detail)
    if key_source == "env":
        detail = Text(
            "the daemon holds a key from its environment ({var} or a ${{VAR}} in apiKey)",
            var=env_name,
        )
        return Check(name, "pass", detail)
    if key_source == "file":
        return Check(
            name,
            "warn",
            Text("the daemon's key is a literal provider.apiKey in settings.json (plain text)"),
            Text(
                "move it to the systemd credential taotoken_api_key (LoadCredential=) or to "
                '{var}, and write "apiKey": "${{{var}}}"',
                var=env_name,
            ),
        )
    sources = "; ".join(tried) or "credential, env var, settings.json apiKey"
    fix = advice or Text(
        "give the daemon the key: LoadCredential=taotoken_api_key:PATH in its unit, or "
        "Environment=/EnvironmentFile= with {var}; then restart it",
        var=env_name,
    )
    return Check(
        name, "fail", Text("the daemon has no API key. Tried: {sources}", sources=sources), fix
    )


def check_shell_env(shell_has_key: bool, env_name: str, daemon_key_source: str | None) -> Check:
    """The calling shell never needs the key: taogpuctl sends none; the daemon has its own."""
    name = "shell_env"
    if shell_has_key:
        shell = Text("your shell exports {var}", var=env_name)
    else:
        shell = Text("your shell does not export {var}", var=env_name)
    if daemon_key_source is None:
        detail = Text(
            "{shell}; the daemon's key cannot be checked (daemon not reachable)", shell=shell
        )
        return Check(name, "skip", detail)
    if daemon_key_source == "none":
        if shell_has_key:
            return Check(
                name,
                "fail",
                Text(
                    "{shell} but the daemon has no key: a service does not inherit your "
                    "shell's environment",
                    shell=shell,
                ),
                Text(
                    "give the key to the daemon (LoadCredential= or EnvironmentFile= in its "
                    "unit) and restart it"
                ),
            )
        unneeded = Text("{shell}, and taogpuctl does not need it (see api_key)", shell=shell)
        return Check(name, "pass", unneeded)
    if shell_has_key:
        return Check(
            name,
            "pass",
            Text(
                "{shell}, but nothing uses it there: taogpuctl sends no key, the daemon uses "
                "its own (from {source})",
                shell=shell,
                source=daemon_key_source,
            ),
            Text("unset {var} in your shell profile if it is there only for taogpud", var=env_name),
        )
    own = Text("{shell}, and need not: the daemon holds its own key", shell=shell)
    return Check(name, "pass", own)


# --- jobs ---------------------------------------------------------------------------------------


def check_probe(
    target: Target,
    jobs: Sequence[JobRecord],
    inventory: nvml.Inventory,
    problems: Sequence[tuple[CheckStatus, str]] = (),
) -> Check:
    """One probe per worker; each must say where it ran, and on cuda NVML must agree."""
    name = "probe_job"
    findings = [_evidence(target, job, inventory, _probe_finding(job)) for job in jobs]
    findings += [
        (status, text, "`taogpuctl status` shows the workers") for status, text in problems
    ]
    if not findings:
        return Check(
            name, "fail", Text("no worker to probe"), Text("`taogpuctl status` shows the workers")
        )
    status = worst(status for status, _, _ in findings)
    detail: str = joined("; ", [text for _, text, _ in findings])
    reasons = dict.fromkeys(
        job.fallback_reason or "no reason recorded" for job in jobs if job.fallback
    )
    if reasons:
        detail += (
            f". {target.backend} is configured but the probes ran on the CPU fallback: "
            + " / ".join(reasons)
        )
    hints = dict.fromkeys(hint for _, _, hint in findings if hint)
    return Check(name, status, detail, joined(" ", list(hints)))


def _probe_finding(job: JobRecord) -> tuple[CheckStatus, str, str]:
    where = f"device={job.device or '-'} backend={job.backend or '-'}"
    if not job.status.finished:
        hint = Text("the workers are busy: run doctor again when the queue is shorter")
        still = Text(
            "probe {job_id} still {status} (no answer yet)", job_id=job.id, status=job.status.value
        )
        return "warn", still, hint
    if job.status is not JobState.succeeded:
        error = job.error.message if job.error else job.status.value
        ended = Text(
            "probe {job_id} {status} on {where}: {error}",
            job_id=job.id,
            status=job.status.value,
            where=where,
            error=error,
        )
        return "fail", ended, Text("see the daemon log")
    said = (job.result or {}).get("device")
    if said != job.device:
        text = Text("{where}, but the worker says it ran on {said}", where=where, said=said)
        return "fail", text, Text("a bug in taogpud: report it with `taogpuctl show ID`")
    return "pass", where, ""


def _evidence(
    target: Target, job: JobRecord, inventory: nvml.Inventory, found: tuple[CheckStatus, str, str]
) -> tuple[CheckStatus, str, str]:
    status, text, hint = found
    if status == "fail" or not job.status.finished:
        return found
    if job.fallback:
        return (
            target.severity(),
            f"{text} fallback=true",
            "fix the reason and restart taogpud; gpu.allowFallbackToCpu=true keeps the daemon "
            "up on the CPU instead of refusing to start, and every job then runs there",
        )
    if target.backend in ("cuda", "cpu") and job.backend != target.backend:
        return "fail", f"{text}: {target.backend} is configured", "see `taogpuctl status`"
    if job.backend != "cuda":
        return status, text, hint
    return _nvml_evidence(job, inventory, text)


def _nvml_evidence(
    job: JobRecord, inventory: nvml.Inventory, text: str
) -> tuple[CheckStatus, str, str]:
    card = next((d for d in inventory.devices if d.uuid and d.uuid == job.device_uuid), None)
    if card is None:
        why = inventory.reason or f"no GPU with UUID {job.device_uuid}"
        return "warn", f"{text}, but NVML cannot confirm it: {why}", "compare with `nvidia-smi -L`"
    if any(process.pid == job.worker_pid for process in card.processes):
        return (
            "pass",
            f"{text} ({card.name}, {card.uuid}; NVML sees worker pid {job.worker_pid})",
            "",
        )
    return (
        "warn",
        f"{text} ({card.name}, {card.uuid}), but NVML does not list worker pid {job.worker_pid} "
        "on it",
        "in a container NVML shows host pids; elsewhere compare with `nvidia-smi`",
    )


def check_recent_backends(target: Target, jobs: Sequence[JobRecord]) -> Check:
    name = "recent_backends"
    finished = [job for job in jobs if job.status.finished and job.backend]
    if not finished:
        return Check(name, "skip", Text("no finished jobs yet"))
    counts = Counter(f"{job.backend}{' (fallback)' if job.fallback else ''}" for job in finished)
    spread = ", ".join(f"{label} {count}" for label, count in counts.most_common())
    detail = Text("the last {n} finished jobs ran on: {spread}", n=len(finished), spread=spread)
    on_cpu = [job for job in finished if job.backend == "cpu"]
    if not target.wants_cuda or not on_cpu:
        return Check(name, "pass", detail)
    hint = Text(
        "`taogpuctl list` shows them; `journalctl -u taogpud BACKEND=cpu` lists their traces"
    )
    if target.allow_fallback:
        text = Text(
            "{detail}; {n} ran on the CPU fallback (allowFallbackToCpu=true)",
            detail=detail,
            n=len(on_cpu),
        )
        return Check(name, "warn", text, hint)
    text = Text(
        "{detail}; {n} ran on the CPU while allowFallbackToCpu=false", detail=detail, n=len(on_cpu)
    )
    return Check(name, "fail", text, hint)


# --- config and the host -------------------------------------------------------------------------


def check_config_pair(settings: SettingsFile, config: ConfigFile) -> Check:
    """The config's own cross-file rules (config.rules.check_pair), on the pair in use."""
    name = "config_pair"
    problems = check_pair(settings, config)
    if problems:
        status: CheckStatus = "fail" if any(p.severity == "error" for p in problems) else "warn"
        return Check(
            name,
            status,
            "; ".join(f"{p.file}: {p.key}: {p.message}" for p in problems),
            "; ".join(dict.fromkeys(p.fix for p in problems)),
        )
    agree = Text(
        "one channel ({url}), one backend ({backend}), device {device} in the set, timeouts "
        "{ms} ms = {seconds} s",
        url=settings.provider.base_url,
        backend=settings.gpu.backend,
        device=settings.gpu.device_id,
        ms=settings.provider.timeout_ms,
        seconds=format(config.api.request_timeout_s, "g"),
    )
    return Check(name, "pass", agree)


def check_config_files(
    paths: str,
    problems: Sequence[Any],
    running: Mapping[str, Any] | None,
    on_disk: Mapping[str, Any] | None,
    unreadable: str | None = None,
) -> Check:
    """The files as this shell reads them: do they load, and do they match the running pair?

    `problems` are config Problems (errors and warnings); `running` and `on_disk` are the
    redacted views (ConfigSnapshot.redacted()) of the daemon's pair and of the files here.
    """
    name = "config_files"
    if unreadable:
        text = f"cannot read {unreadable} here; the daemon's own check (config_pair) covers it"
        return Check(name, "skip", text, "run doctor as a member of group taogpu, or as root")
    errors = [p for p in problems if p.severity == "error"]
    if errors or on_disk is None:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        first = str(errors[0]) if errors else "they do not load"
        hint = "taogpuctl config validate shows every problem; the daemon keeps its running pair"
        return Check(name, "fail", f"{paths}: {first}{more}", hint)
    warnings = "; ".join(f"{p.key}: {p.message}" for p in problems)
    differ = _differences(running, on_disk) if running is not None else []
    if differ:
        shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        return Check(
            name,
            "warn",
            f"{paths} differ from what the daemon runs: {shown} (or env overrides differ "
            "between the daemon and this shell)",
            "reload the daemon (`taogpuctl config reload` or `systemctl reload taogpud`)",
        )
    if warnings:
        return Check(name, "warn", f"{paths}: {warnings}", "; ".join(p.fix for p in problems))
    if running is not None:
        return Check(
            name, "pass", Text("{paths} load cleanly and match what the daemon runs", paths=paths)
        )
    return Check(name, "pass", Text("{paths} load cleanly", paths=paths))


_NOT_COMPARED = {"settings.provider.apiKey"}  # its expansion depends on whose environment


def _differences(running: Mapping[str, Any], on_disk: Mapping[str, Any]) -> list[str]:
    before = dict(_flatten({k: running.get(k) for k in ("settings", "config")}))
    after = dict(_flatten({k: on_disk.get(k) for k in ("settings", "config")}))
    keys = sorted((before.keys() | after.keys()) - _NOT_COMPARED)
    return [
        f"{key} (daemon {before.get(key)!r}, files {after.get(key)!r})"
        for key in keys
        if before.get(key) != after.get(key)
    ]


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
