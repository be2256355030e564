"""Programs: `taogpuctl exec`, your own program through the queue under a lease of devices
(docs/programs.md); running it here is cli/program_run.py's."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from taogpud.cli import program_run
from taogpud.cli.context import connect
from taogpud.cli.options import JsonFlag
from taogpud.errors import CliError

EXEC_SETTINGS: dict[str, Any] = {"allow_interspersed_args": False}  # the program keeps its flags


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
    if device is not None and gpus not in (None, 1):
        raise CliError("--device names one device", "give either --device I or --gpus N")
    request: dict[str, Any] = {
        "gpus": gpus or 1,
        "device": device,
        "mem_bytes": None if mem is None else program_run.parse_size(mem),
        "share": share,
        "affinity": affinity,
        "priority": priority,
        "timeout_s": timeout,
        "name": name,
    }
    with connect(ctx) as client:
        if detach:
            return program_run.detach_program(client, program, request, json_out)
        return program_run.exec_program(client, program, request, json_out)
