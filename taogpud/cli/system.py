"""The daemon and this host: `status`, `tasks`, `devices`, `doctor`, `api ping`, `mcp`."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated

import typer

from taogpud.cli import logs as cli_logs
from taogpud.cli.context import connect, socket_of
from taogpud.cli.options import ConfigFlag, JsonFlag, SettingsFlag
from taogpud.cli.output import (
    check_lines,
    describe_params,
    emit_json,
    emit_line,
    emit_table,
    ping_lines,
    report_error,
)
from taogpud.cli.relay import relay_check
from taogpud.cli.status import show_status
from taogpud.client import DaemonUnreachable
from taogpud.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from taogpud.i18n import user_language
from taogpud.wire import DeviceJson

api_app = typer.Typer(help="The API channel the daemon holds: ping it.", no_args_is_help=True)


def status_command(
    ctx: typer.Context,
    json_out: JsonFlag = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Redraw until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between redraws.")] = 2.0,
) -> None:
    """Backend, fallback, load against the caps, config generation, one row per worker."""
    socket_path = socket_of(ctx)
    if watch:
        cli_logs.watch(lambda: show_status(socket_path, json_out), interval)
        return
    show_status(socket_path, json_out)


def tasks_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The tasks the daemon can run, with their params."""
    with connect(ctx) as client:
        catalog = client.tasks()
    if json_out:
        emit_json(catalog)
        return
    rows = [[task["name"], task.get("description"), describe_params(task)] for task in catalog]
    emit_table(("name", "description", "params"), rows)


def devices_command(ctx: typer.Context, json_out: JsonFlag = False) -> int:
    """The GPUs the NVIDIA driver shows (NVML, read here), the OpenCL platforms and devices
    (asked of a child process here), and the devices the workers hold."""
    # NVML, the OpenCL report and their tables: ~40 ms that only `devices` uses
    from taogpud.backends.opencl import probe as opencl_probe
    from taogpud.backends.opencl import report as opencl_report
    from taogpud.cli import devices as view
    from taogpud.observability import nvml

    unreachable: DaemonUnreachable | None = None
    workers: list[DeviceJson] | None = None
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
    # pydantic-settings and every check: ~700 ms, the doctor's alone
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


def mcp_command(ctx: typer.Context) -> None:
    """Serve the daemon's jobs as MCP tools on stdio, for an AI agent (docs/agents.md).

    Register it with the agent: `claude mcp add taogpud -- taogpuctl mcp`.
    """
    from taogpud.agents.server import serve  # the MCP SDK: ~300 ms, `mcp` alone

    socket_path = socket_of(ctx)
    serve(None if socket_path is None else str(socket_path))
