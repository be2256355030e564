"""The daemon's config: `config validate|show|status|reload`, the pair loaded here or asked of
the daemon."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from taogpud.cli import files as cli_files
from taogpud.cli.context import connect
from taogpud.cli.options import ConfigFlag, JsonFlag, SettingsFlag
from taogpud.cli.output import count_problems, emit_json, emit_line, flatten, problem_line
from taogpud.client import ApiError, DaemonUnreachable
from taogpud.errors import EXIT_OK, EXIT_USAGE, ConfigError
from taogpud.i18n import Text, _, user_language
from taogpud.wire import ReloadJson

if TYPE_CHECKING:
    from taogpud.config import ConfigSnapshot
    from taogpud.config.problem import Problem

config_app = typer.Typer(help="The daemon's config: show, validate, status.", no_args_is_help=True)


def load_config_problems(
    settings: Path | None, config: Path | None
) -> tuple[ConfigSnapshot | None, list[Problem]]:
    """Load the pair offline: (the snapshot or None, every problem found, errors first)."""
    from taogpud import config as config_loader  # pydantic: ~370 ms no other command pays

    try:
        snapshot = config_loader.load(settings, config)
    except ConfigError as exc:
        return None, sorted(exc.problems, key=lambda problem: problem.severity != "error")
    return snapshot, list(snapshot.warnings)


def the_daemons_files(ctx: typer.Context) -> tuple[Path | None, Path | None]:
    """The settings.json and config.toml the reachable daemon runs (None: the defaults, where
    no daemon answers or it runs on its embedded defaults)."""
    try:
        with connect(ctx) as client:
            paths = client.config().get("paths") or {}
    except (DaemonUnreachable, ApiError):
        return None, None
    settings, config = paths.get("settings"), paths.get("config")
    return (Path(settings) if settings else None), (Path(config) if config else None)


def host_problems(snapshot: ConfigSnapshot) -> list[Problem]:
    """What keeps this host from running a valid pair: CUDA without an NVIDIA driver (the
    daemon would refuse to start, or fall back to the CPU where allowFallbackToCpu says so)."""
    # the CUDA backend's module: ~50 ms, for `config validate` alone
    from taogpud.backends.cuda.backend import driver_installed
    from taogpud.config.problem import Problem  # the config is loaded: no cost here

    gpu = snapshot.settings.gpu
    if gpu.backend != "cuda" or driver_installed():
        return []
    where = str(snapshot.settings_path or "settings.json")
    if gpu.allow_fallback_to_cpu:
        outcome = Text("taogpud would run every job on the CPU fallback")
    else:
        outcome = Text("taogpud would refuse to start with this pair")
    message = Text(
        '"cuda", and this host has no NVIDIA driver (no /proc/driver/nvidia, no nvidia-smi): '
        "{outcome}",
        outcome=outcome,
    )
    fix = Text(
        "on this host use the CPU pair (packaging/examples/cpu/, or "
        "/usr/share/doc/taogpud/examples/cpu/ from the package), or install the driver"
    )
    severity = "warning" if gpu.allow_fallback_to_cpu else "error"
    return [Problem.of(where, "gpu.backend", message, fix, severity=severity)]


@config_app.command("validate")
def config_validate_command(
    ctx: typer.Context,
    settings: SettingsFlag = None,
    config: ConfigFlag = None,
    json_out: JsonFlag = False,
) -> int:
    """Check the two config files (the reachable daemon's, else the defaults) and whether this
    host can run them; exit 2 on errors."""
    if settings is None and config is None:
        settings, config = the_daemons_files(ctx)
    snapshot, problems = load_config_problems(settings, config)
    if snapshot is not None:
        problems = sorted(
            [*problems, *host_problems(snapshot)], key=lambda problem: problem.severity != "error"
        )
    errors = [problem for problem in problems if problem.severity == "error"]
    warnings = [problem for problem in problems if problem.severity != "error"]
    files = cli_files.checked_files(settings, config, os.environ)
    if json_out:
        emit_json(
            {
                "ok": not errors,
                "errors": [problem.as_dict() for problem in errors],
                "warnings": [problem.as_dict() for problem in warnings],
                "files": files,
            }
        )
    else:
        for line in cli_files.checked_lines(files):
            emit_line(line)
        language = user_language()
        for problem in problems:
            emit_line(problem_line(problem.in_language(language).as_dict()))
        verdict = _("config invalid: {counts}") if errors else _("config ok: {counts}")
        emit_line(verdict.format(counts=count_problems(errors, warnings)))
    return EXIT_USAGE if errors else EXIT_OK


@config_app.command("show")
def config_show_command(
    ctx: typer.Context,
    settings: SettingsFlag = None,
    config: ConfigFlag = None,
    offline: Annotated[bool, typer.Option("--offline", help="Load the files here.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """The effective config, redacted: the daemon's, or (with files or --offline) loaded here."""
    if settings or config or offline:
        document = load_config_offline(settings, config)
    else:
        with connect(ctx) as client:
            document = client.config()
    if json_out:
        emit_json(document)
        return
    for key, value in flatten(document):
        emit_line(f"{key} = {orjson.dumps(value).decode()}")


def load_config_offline(settings: Path | None, config: Path | None) -> dict[str, Any]:
    snapshot, problems = load_config_problems(settings, config)
    if snapshot is None:
        raise ConfigError(problems)
    return snapshot.redacted()


@config_app.command("status")
def config_status_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The config generation in use and how the last reload went."""
    with connect(ctx) as client:
        view = client.config_status()
    if json_out:
        emit_json(view)
        return
    last = view.get("last_reload") or {}
    generation = _("generation {generation}  digest {digest}")
    emit_line(generation.format(generation=view["generation"], digest=view.get("digest", "-")))
    if last.get("ok"):
        emit_line(_("last reload: ok"))
    else:
        emit_line(_("last reload: FAILED (the old config stays)"))
    for problem in [*last.get("errors", []), *last.get("warnings", [])]:
        emit_line(f"  {problem_line(problem)}")


@config_app.command("reload")
def config_reload_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Re-read both files now (as SIGHUP does); exit 2 when the new pair is invalid."""
    with connect(ctx) as client:
        view = client.reload_config()
    if json_out:
        emit_json(view)
    else:
        emit_reload(view)
    if not view.get("ok"):
        raise typer.Exit(EXIT_USAGE)


def emit_reload(view: ReloadJson) -> None:
    generation = view.get("generation")
    if not view.get("ok"):
        emit_line(
            _("reload FAILED; generation {generation} stays in force").format(generation=generation)
        )
    elif not view.get("changes"):
        emit_line(_("no change; generation {generation}").format(generation=generation))
    elif view.get("restarted_workers"):
        emit_line(
            _("reloaded: generation {generation} (workers rolled)").format(generation=generation)
        )
    else:
        emit_line(_("reloaded: generation {generation}").format(generation=generation))
    for change in view.get("changes", []):
        emit_line(f"  {change['key']}: {change['old']!r} -> {change['new']!r}")
    for problem in [*view.get("errors", []), *view.get("warnings", [])]:
        emit_line(f"  {problem_line(problem)}")
