"""taogpuctl's typer app: every command, its flags and help (the contract is in taogpud.cli).

`taogpud.cli.run` sends here every argv the hot path (cli/hot.py) does not answer itself.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from taogpud.cli import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from taogpud.cli import conventions as cli_conventions
from taogpud.cli import files as cli_files
from taogpud.cli import guide as cli_guide
from taogpud.cli import helptext as cli_helptext
from taogpud.cli import logs as cli_logs
from taogpud.cli import top as cli_top
from taogpud.cli import words as cli_words
from taogpud.cli.conventions import resolve_id, short_ids
from taogpud.cli.failures import CliError, explain
from taogpud.cli.options import ParamOption, SeedOption, SizeOption
from taogpud.cli.output import (
    Progress,
    check_lines,
    count_problems,
    describe_params,
    emit_json,
    emit_line,
    emit_mapping,
    emit_table,
    flatten,
    job_problem,
    one_line,
    ping_lines,
    problem_line,
    readable_job,
    report_error,
    state_word,
    summary_line,
    warn,
    warn_if_fallback,
)
from taogpud.cli.status import show_status
from taogpud.client import (
    NPY_MAGIC,
    ApiError,
    Client,
    DaemonUnreachable,
    Job,
    is_finished,
)
from taogpud.errors import ConfigError, Problem
from taogpud.i18n import Text, _, user_language
from taogpud.relay.cli import relay_app, relay_check

if TYPE_CHECKING:
    from taogpud.config import ConfigSnapshot

app = typer.Typer(
    name="taogpuctl",
    help="Run and inspect GPU compute jobs on this host's taogpud.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="The daemon's config: show, validate, status.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(relay_app, name="relay")  # taogpud/relay/cli.py

JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document.")]
SettingsFlag = Annotated[Path | None, typer.Option("--settings", help="The settings.json to use.")]
ConfigFlag = Annotated[Path | None, typer.Option("--config", help="The config.toml to use.")]


@dataclass(frozen=True)
class Globals:
    socket_path: Path | None  # None: taogpud.host.paths.client_sockets() chooses


@app.callback()
def global_options(
    ctx: typer.Context,
    socket_path: Annotated[
        Path | None,
        # readable=False: a socket's mode says nothing a connect() would not say better
        # (a user outside group taogpu gets the client's own message, not a usage error).
        typer.Option(
            "--socket",
            envvar="TAOGPUD_SOCKET",
            readable=False,
            help="The daemon's control socket (default: a daemon of your own, else "
            "/run/taogpud/taogpud.sock).",
        ),
    ] = None,
) -> None:
    """Run and inspect GPU compute jobs on this host's taogpud."""
    ctx.obj = Globals(socket_path)


@contextmanager
def connect(ctx: typer.Context) -> Iterator[Client]:
    globals_ = ctx.find_object(Globals)
    with Client(globals_.socket_path if globals_ else None) as client:
        yield client


# --- jobs: shared pieces -----------------------------------------------------------------


def parse_param(item: str) -> tuple[str, Any]:
    """`KEY=VALUE`; the value as JSON when it parses (`ms=50` → 50), else the text."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        bad = _("--param {item} is not KEY=VALUE").format(item=repr(item))
        raise CliError(bad, _("e.g. --param ms=50"))
    try:
        return key.strip(), orjson.loads(raw)
    except orjson.JSONDecodeError:
        return key.strip(), raw


def build_params(size: int | None, seed: int | None, items: Sequence[str]) -> dict[str, Any]:
    params = dict(parse_param(item) for item in items)
    for name, value in (("size", size), ("seed", seed)):
        if value is None:
            continue
        if name in params:
            raise CliError(
                _("{name} given twice").format(name=name),
                _("use either --{name} or --param {name}=").format(name=name),
            )
        params[name] = value
    return params


def read_npy(name_and_file: str) -> tuple[str, bytes]:
    """`NAME=FILE.npy` → the name and the file's bytes, checked to be a .npy file."""
    name, sep, file_name = name_and_file.partition("=")
    if not sep or not name or not file_name:
        bad = _("--input {item} is not NAME=FILE.npy").format(item=repr(name_and_file))
        raise CliError(bad, _("e.g. --input a=a.npy"))
    try:
        data = Path(file_name).read_bytes()
    except OSError as exc:
        reason = exc.strerror or exc
        raise CliError(
            _("cannot read {file}: {reason}").format(file=file_name, reason=reason)
        ) from exc
    if not data.startswith(NPY_MAGIC):
        not_npy = _("{file} is not a .npy file").format(file=file_name)
        raise CliError(not_npy, _("write it with numpy.save"))
    return name, data


def upload_inputs(client: Client, items: Sequence[str]) -> dict[str, str]:
    files = [read_npy(item) for item in items]  # every file read before any upload
    return {name: client.upload_array(data)["id"] for name, data in files}


def report_job(job: Job, json_out: bool, extra: dict[str, Any] | None = None) -> int:
    """Print a finished (or given-up-on) job; its exit code: 0 only if it succeeded."""
    if json_out:
        emit_json({**job, **(extra or {})})
    else:
        emit_line(summary_line(job))
        emit_mapping(job.get("result") or {}, indent="  ")
    warn_if_fallback(job)
    if job["status"] == "succeeded":
        return EXIT_OK
    report_error(*job_problem(job))
    if not is_finished(job):
        return cli_conventions.EXIT_STILL_RUNNING
    return _exit_status(job)


def _exit_status(job: Job) -> int:
    """A failed job's exit code: 1, or a program's own exit status when it has one."""
    if job.get("task") == "program":
        from taogpud.cli.programs import program_status

        status = program_status(job)
        if status:
            return status
    return EXIT_FAILED


def save_outputs(client: Client, job: Job, directory: Path) -> dict[str, str]:
    """Download every output of a finished job to DIR/NAME.npy; name → path written."""
    directory.mkdir(parents=True, exist_ok=True)
    saved: dict[str, str] = {}
    for output in job.get("outputs") or []:
        name = safe_file_stem(output["name"])
        target = directory / f"{name}.npy"
        target.write_bytes(client.download_output(job["id"], output["name"]))
        saved[output["name"]] = str(target)
    return saved


def safe_file_stem(name: str) -> str:
    if not name or name in {".", ".."} or Path(name).name != name:
        raise CliError(f"the daemon named an output {name!r}, not a plain file name", exit_code=1)
    return name


# --- jobs: commands ----------------------------------------------------------------------


@app.command("submit")
def submit_command(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="A task name (see `taogpuctl tasks`).")],
    *,
    size: SizeOption = None,
    seed: SeedOption = None,
    param: ParamOption = None,
    input_: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy, uploaded first.")
    ] = None,
    device: Annotated[int | None, typer.Option(min=0, help="Pin to this device index.")] = None,
    affinity: Annotated[str | None, typer.Option(help="Jobs of one key stay on one GPU.")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first (-1000..1000).")] = 0,
    timeout: Annotated[float | None, typer.Option(min=0.0, help="Job timeout, seconds.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it finished.")] = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Keep outputs; save them as DIR/NAME.npy.")
    ] = None,
    json_out: JsonFlag = False,
) -> int:
    """Submit a job; with --wait, show its progress and where it ran."""
    params = build_params(size, seed, param or [])
    cli_words.remember(body_priority=priority, body_timeout_s=timeout, body_device=device)
    with connect(ctx) as client:
        request: dict[str, Any] = {
            "inputs": upload_inputs(client, input_ or []),
            "device": device,
            "affinity": affinity,
            "priority": priority,
            "timeout_s": timeout,
            "keep_outputs": output is not None,
        }
        if not wait and output is None:
            job = client.submit(task, params, **request)
            if json_out:
                emit_json(job)
            else:
                emit_line(job["id"])
            return EXIT_OK
        with Progress(quiet=json_out) as progress:
            job = client.run(task, params, **request, on_update=progress.update)
        return finish_waited(client, job, json_out, output)


def finish_waited(client: Client, job: Job, json_out: bool, output: Path | None) -> int:
    """Report a waited job; with --output, save its outputs first."""
    if output is None or job["status"] != "succeeded":
        return report_job(job, json_out)
    saved = save_outputs(client, job, output)
    exit_code = report_job(job, json_out, {"saved_outputs": saved})
    if not saved:
        text = _("job {job_id} succeeded but kept no outputs to save in {directory}")
        warn(text.format(job_id=job["id"], directory=output))
    if not json_out:
        for name, target in saved.items():
            emit_line(_("saved {name} → {path}").format(name=name, path=target))
    return exit_code


@app.command(
    "exec",
    context_settings={"allow_interspersed_args": False},
    no_args_is_help=True,
)
def exec_command(
    ctx: typer.Context,
    program: Annotated[
        list[str], typer.Argument(metavar="-- PROGRAM [ARGS]...", help="What to run, as you.")
    ],
    *,
    gpus: Annotated[
        int | None, typer.Option(min=1, help="Devices at once, all or none (default 1).")
    ] = None,
    device: Annotated[int | None, typer.Option(min=0, help="This device index only.")] = None,
    mem: Annotated[
        str | None,
        typer.Option(help="Memory reservation, e.g. 4G (default: the device's whole cap)."),
    ] = None,
    share: Annotated[
        bool, typer.Option("--share", help="One slot of a device, not the whole device.")
    ] = False,
    affinity: Annotated[str | None, typer.Option(help="Jobs of one key stay on one GPU.")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first (-1000..1000).")] = 0,
    timeout: Annotated[float | None, typer.Option(min=0.0, help="Stop it after S seconds.")] = None,
    name: Annotated[str | None, typer.Option(help="A name for the job.")] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Print the job id and leave it running; see logs."),
    ] = False,
    json_out: JsonFlag = False,
) -> int:
    """Run your own program through the queue under a lease of devices (docs/programs.md);
    the exit status is the program's."""
    from taogpud.cli import programs as cli_programs

    if device is not None and gpus not in (None, 1):
        raise CliError("--device names one device", "give either --device I or --gpus N")
    request: dict[str, Any] = {
        "gpus": gpus or 1,
        "device": device,
        "mem_bytes": None if mem is None else cli_programs.parse_size(mem),
        "share": share,
        "affinity": affinity,
        "priority": priority,
        "timeout_s": timeout,
        "name": name,
    }
    with connect(ctx) as client:
        if detach:
            return cli_programs.detach_program(client, program, request, json_out)
        return cli_programs.exec_program(client, program, request, json_out)


@app.command("wait")
def wait_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job's id.")],
    timeout: Annotated[
        float | None, typer.Option(min=0.0, help="Give up after S seconds (exit 124).")
    ] = None,
    json_out: JsonFlag = False,
) -> int:
    """Wait for a job to finish; exit 1 if it failed, 124 if still running at --timeout."""
    with connect(ctx) as client, Progress(quiet=json_out) as progress:
        job_id = resolve_id(client, job_id)
        job = client.wait(job_id, timeout_s=timeout, on_update=progress.update)
    return report_job(job, json_out)


@app.command("show")
def show_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job's id.")],
    evidence: Annotated[
        bool, typer.Option("--evidence", help="Only its NVML evidence, beside nvidia-smi's.")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Everything the daemon knows about one job."""
    with connect(ctx) as client:
        job = client.get(resolve_id(client, job_id))
    if evidence:
        cli_guide.emit_evidence(job, json_out)
        return
    if json_out:
        emit_json(job)
        return
    emit_mapping(readable_job(job))
    warn_if_fallback(job)


@app.command("list")
def list_command(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most N jobs, newest first.")] = 100,
    json_out: JsonFlag = False,
) -> None:
    """Recent jobs, newest first."""
    cli_words.remember(query_status=status, query_limit=limit)
    with connect(ctx) as client:
        jobs = client.list_jobs(status=status, limit=limit)
    if json_out:
        emit_json(jobs)
        return
    columns = ("id", "task", "status", "backend", "device", "fallback", "queue_ms", "run_ms")
    short = short_ids([job["id"] for job in jobs])
    rows = [[short[job["id"]], *(job.get(column) for column in columns[1:])] for job in jobs]
    emit_table(columns, rows)


@app.command("cancel")
def cancel_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job's id.")],
    json_out: JsonFlag = False,
) -> None:
    """Cancel a queued or running job."""
    with connect(ctx) as client:
        job = client.cancel(resolve_id(client, job_id))
    if json_out:
        emit_json(job)
    else:
        emit_line(
            _("job {job_id} {status}").format(job_id=job["id"], status=state_word(job["status"]))
        )


@app.command("result")
def result_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job's id.")],
    output_file: Annotated[
        Path | None, typer.Option("--output", "-o", help="Save one output .npy here.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Which output (when there are several).")] = None,
    json_out: JsonFlag = False,
) -> int:
    """A job's result summary, or (-o FILE) one of its outputs as .npy."""
    with connect(ctx) as client:
        job = client.get(resolve_id(client, job_id))
        if job["status"] != "succeeded":
            raise CliError(*job_problem(job), exit_code=EXIT_FAILED)
        if output_file is None:
            return report_job(job, json_out)
        chosen = pick_output(job, name)
        output_file.write_bytes(client.download_output(job["id"], chosen))
    saved = {"id": job["id"], "name": chosen, "path": str(output_file)}
    if json_out:
        emit_json(saved)
    else:
        emit_line(_("saved {name} → {path}").format(name=chosen, path=output_file))
    return EXIT_OK


def pick_output(job: Job, name: str | None) -> str:
    names = [output["name"] for output in job.get("outputs") or []]
    if name is not None:
        return name
    if len(names) == 1:
        return str(names[0])
    if not names:
        hint = _("submit with --output DIR (keep_outputs) to keep them")
        raise CliError(_("job {job_id} kept no outputs").format(job_id=job["id"]), hint)
    several = _("job {job_id} has outputs {names}").format(job_id=job["id"], names=", ".join(names))
    raise CliError(several, _("choose one with --name"))


# --- the daemon --------------------------------------------------------------------------


@app.command("status")
def status_command(
    ctx: typer.Context,
    json_out: JsonFlag = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Redraw until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between redraws.")] = 2.0,
) -> None:
    """Backend, fallback, load against the caps, config generation, one row per worker."""
    globals_ = ctx.find_object(Globals)
    socket_path = globals_.socket_path if globals_ else None
    if watch:
        cli_logs.watch(lambda: show_status(socket_path, json_out), interval)
        return
    show_status(socket_path, json_out)


@app.command("tasks")
def tasks_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The tasks the daemon can run, with their params."""
    with connect(ctx) as client:
        catalog = client.tasks()
    if json_out:
        emit_json(catalog)
        return
    rows = [[task["name"], task.get("description"), describe_params(task)] for task in catalog]
    emit_table(("name", "description", "params"), rows)


@app.command("devices")
def devices_command(ctx: typer.Context, json_out: JsonFlag = False) -> int:
    """The GPUs the NVIDIA driver shows (NVML, read here), the OpenCL platforms and devices
    (asked of a child process here), and the devices the workers hold."""
    from taogpud.backends.opencl import probe as opencl_probe
    from taogpud.backends.opencl import report as opencl_report
    from taogpud.cli import devices as view
    from taogpud.observability import nvml

    unreachable: DaemonUnreachable | None = None
    workers: list[dict[str, Any]] | None = None
    try:
        with connect(ctx) as client:
            workers = client.devices()
    except DaemonUnreachable as exc:  # the driver's view is still worth showing
        unreachable = exc
    document = view.devices_document(nvml.inventory(), workers)
    document["opencl"] = opencl_report.opencl_document(opencl_probe.inventory(), workers)
    if json_out:
        emit_json(document)
    else:
        for line in view.header_lines(document):
            emit_line(line)
        if document["gpus"]:
            emit_table(view.GPU_COLUMNS, view.gpu_rows(document))
        for line in view.process_lines(document):
            emit_line(line)
        for line in opencl_report.header_lines(document["opencl"]):
            emit_line(line)
        if any(platform["devices"] for platform in document["opencl"]["platforms"]):
            emit_table(opencl_report.COLUMNS, opencl_report.rows(document["opencl"]))
        if workers is not None:
            emit_line("taogpud workers:")
            emit_table(view.WORKER_COLUMNS, view.worker_rows(document))
    if unreachable is not None:
        report_error(unreachable.message, unreachable.hint)
        return EXIT_UNREACHABLE
    return EXIT_OK


# --- config ------------------------------------------------------------------------------


def load_config_problems(
    settings: Path | None, config: Path | None
) -> tuple[ConfigSnapshot | None, list[Problem]]:
    """Load the pair offline: (the snapshot or None, every problem found, errors first)."""
    from taogpud import config as config_loader

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
    from taogpud.backends.cuda.backend import driver_installed

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


def emit_reload(view: dict[str, Any]) -> None:
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


# --- api ping and doctor ----------------------------------------------------------------------

api_app = typer.Typer(help="The API channel the daemon holds: ping it.", no_args_is_help=True)
app.add_typer(api_app, name="api")


class ModelRole(StrEnum):
    default = "default"
    coding = "coding"
    reasoning = "reasoning"


@api_app.command("ping")
def api_ping_command(
    ctx: typer.Context,
    model: Annotated[
        ModelRole, typer.Option("--model", help="Which of settings.json models.* to ask.")
    ] = ModelRole.default,
    timeout: Annotated[
        float, typer.Option(min=0.1, max=3600.0, help="Give up after S seconds, retries included.")
    ] = 90.0,
    json_out: JsonFlag = False,
) -> int:
    """The setup guide's ping, sent by the daemon with its key; exit 1 unless it answered."""
    with connect(ctx) as client:
        result = client.channel_ping(model.value, timeout_s=timeout)
    if json_out:
        emit_json(result)
    else:
        for line in ping_lines(result):
            emit_line(line)
    return EXIT_OK if result.get("ok") else EXIT_FAILED


@app.command("doctor")
def doctor_command(
    ctx: typer.Context,
    settings: SettingsFlag = None,
    config: ConfigFlag = None,
    ping: Annotated[
        bool, typer.Option("--ping/--no-ping", help="Ping the API channel (one tiny request).")
    ] = True,
    probe: Annotated[
        bool, typer.Option("--probe/--no-probe", help="Run a probe job on every worker.")
    ] = True,
    timeout: Annotated[
        float, typer.Option(min=0.1, max=600.0, help="Caps the ping and the probes' wait.")
    ] = 30.0,
    json_out: JsonFlag = False,
) -> int:
    """The setup guide's checklist, each check with its fix; exit 1 when any check fails.

    A daemon that cannot be reached is a failed check: the report still comes, with the
    checks that work without it (exit 1, not 3).
    """
    from taogpud.doctor import Check, in_order, report_ok
    from taogpud.doctor import run as doctor_run

    files, daemon = (settings, config), None
    try:
        with connect(ctx) as client:
            answer = client.doctor(ping=ping, probe=probe, timeout_s=timeout)
            running = client.config()
            daemon = answer.get("daemon")
            checks = doctor_run.cli_checks(answer, running, client.socket_path, files, os.environ)
            checks = in_order([*checks, relay_check(client)])
    except DaemonUnreachable as exc:
        checks = doctor_run.offline_checks(exc.message, exc.hint, files, os.environ)
        checks = in_order([*checks, Check("relay", "skip", "no daemon to relay through")])
    ok = report_ok(checks)
    if json_out:
        emit_json({"ok": ok, "checks": [check.as_dict() for check in checks], "daemon": daemon})
    else:
        for line in check_lines([check.as_dict(user_language()) for check in checks]):
            emit_line(line)
    return EXIT_OK if ok else EXIT_FAILED


@app.command("mcp")
def mcp_command(ctx: typer.Context) -> None:
    """Serve the daemon's jobs as MCP tools on stdio, for an AI agent (docs/agents.md).

    Register it with the agent: `claude mcp add taogpud -- taogpuctl mcp`.
    """
    from taogpud.agents.server import serve

    globals_ = ctx.find_object(Globals)
    socket_path = globals_.socket_path if globals_ else None
    serve(None if socket_path is None else str(socket_path))


app.command("completion")(cli_conventions.completion_command)
app.command("run")(cli_guide.run_command)
app.command("trace")(cli_logs.trace_command)
app.command("logs")(cli_logs.logs_command)
app.command("top")(cli_top.top_command)

# --- reserved --------------------------------------------------------------------------------
# `trace` lands here, one handler, reusing connect(), emit_json() and report-style exit codes.


# --- entry point ---------------------------------------------------------------------------


def run_app(argv: Sequence[str]) -> int:
    """Run one command through typer; every failure becomes one stderr line and an exit code."""
    command = typer.main.get_command(asked_app(argv))
    cli_conventions.install(command, argv)
    cli_helptext.translate(command)
    try:
        result = command.main(args=list(argv), prog_name="taogpuctl", standalone_mode=False)
    except Exception as exc:
        message, hint, exit_code = explain_any(exc)
        report_error(message, hint)
        return exit_code
    return result if isinstance(result, int) else EXIT_OK


ROOT_VALUE_OPTIONS = ("--socket",)  # the root's options that take a value


def asked_app(argv: Sequence[str]) -> typer.Typer:
    """The app with only the command argv names: typer turns every command's signature into
    click parameters at each start (~30 ms for all of them), and a call runs one. The whole
    app when argv names none, one it lacks (did-you-mean lists the others), or the shell asks
    for completions."""
    name = command_word(argv)
    if name is None or cli_conventions.COMPLETE_VAR in os.environ:
        return app
    commands = [info for info in app.registered_commands if info.name == name]
    groups = [info for info in app.registered_groups if info.name == name]
    if len(commands) + len(groups) != 1:
        return app
    asked = copy.copy(app)  # the module's app stays whole: run() may be called again
    asked.registered_commands, asked.registered_groups = commands, groups
    return asked


def command_word(argv: Sequence[str]) -> str | None:
    """The first word after the root's --socket; None at any other option first (-h,
    --version: the whole app answers them)."""
    words = iter(argv)
    for word in words:
        if word in ROOT_VALUE_OPTIONS:
            next(words, None)
        elif word.startswith(tuple(f"{option}=" for option in ROOT_VALUE_OPTIONS)):
            continue
        elif word.startswith("-"):
            return None
        else:
            return word
    return None


def explain_any(exc: Exception) -> tuple[str, str, int]:
    """(message, hint, exit code): typer's usage errors here, all else as cli/failures.py says."""
    if isinstance(exc, typer.TyperException | typer.Abort):
        return explain_usage(exc)
    return explain(exc)


def explain_usage(exc: typer.TyperException | typer.Abort) -> tuple[str, str, int]:
    """Typer's (vendored click's) parse errors: all usage errors."""
    if isinstance(exc, typer.Abort):
        return "aborted", "", EXIT_FAILED
    ctx = getattr(exc, "ctx", None)
    command_path = ctx.command_path if ctx is not None else "taogpuctl"
    # A missing sub-command has already printed the help, leaving the message empty.
    message = one_line(exc.format_message()) or f"{command_path} needs a command"
    return message, f"see `{command_path} --help`", EXIT_USAGE
