"""The setup guide's checks with the guide's own flags (README: "The guide's checklist").

    openclaw run --config "$OPENCLAW_CONFIG" --task vector_add --size 1000000
    taogpuctl run --config "$OPENCLAW_CONFIG" --task vector_add --size 1000000
      → job … succeeded task=vector_add device=gpu:0 backend=cuda fallback=false …

`run` is `submit --wait` spelt as the guide spells it. Its `--config` (and `--settings`) name
the files the guide's tool reads; the daemon runs with its own, so `run` says loudly when the
daemon's files are not those: the failure this project exists to make visible.

`show ID --evidence` prints the job's NVML evidence beside the `nvidia-smi` query that shows
the same thing, so the two can be read side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from taogpud.cli.context import connect
from taogpud.cli.inputs import build_params
from taogpud.cli.options import JsonFlag, ParamOption, SeedOption, SizeOption
from taogpud.cli.output import Progress, emit_json, emit_line, warn
from taogpud.cli.report import finish_waited
from taogpud.client import Job
from taogpud.errors import CliError
from taogpud.i18n import _
from taogpud.observability.nvml import NVIDIA_SMI


def run_command(
    ctx: typer.Context,
    task: Annotated[str, typer.Option("--task", help="The task to run (see `taogpuctl tasks`).")],
    *,
    config: Annotated[
        Path | None, typer.Option("--config", help="The guide's config.toml ($OPENCLAW_CONFIG).")
    ] = None,
    settings: Annotated[
        Path | None, typer.Option("--settings", help="The guide's settings.json.")
    ] = None,
    size: SizeOption = None,
    seed: SeedOption = None,
    param: ParamOption = None,
    json_out: JsonFlag = False,
) -> int:
    """The guide's check: run TASK, wait, print `device=… backend=…`; exit 1 unless it succeeded.

    Example: taogpuctl run --config "$OPENCLAW_CONFIG" --task vector_add --size 1000000
    """
    params = build_params(size, seed, param or [])
    refuse_missing_files(settings=settings, config=config)
    with connect(ctx) as client:
        warn_if_other_files(client.config(), settings, config)
        with Progress(quiet=json_out) as progress:
            job = client.run(task, params, on_update=progress.update)
        return finish_waited(client, job, json_out, None)


def refuse_missing_files(**given: Path | None) -> None:
    """A file named on the command line that is not there: a usage error (exit 2), before any
    job runs, so that the guide's check never passes on a path nobody could read."""
    for flag, path in given.items():
        if path is not None and not path.is_file():
            why = _("no such file") if not path.exists() else _("not a file")
            raise CliError(f"--{flag} {path}: {why}", _("give the path of the file the guide uses"))


def warn_if_other_files(
    running: dict[str, Any], settings: Path | None, config: Path | None
) -> None:
    """A warning for each file given here that is not the one the daemon runs with."""
    paths = running.get("paths") or {}
    for name, given in (("settings", settings), ("config", config)):
        if given is None:
            continue
        used = paths.get(name)
        if used is None or not Path(used).exists() or not same_file(Path(used), given):
            shown = used or _("its embedded defaults")
            text = _(
                "the daemon runs with {used}, not {given}: this job says nothing about {given}"
            )
            warn(text.format(used=shown, given=given))


def _xids(xids: list[dict[str, Any]]) -> str:
    """A program's XIDs on one line: "XID 79 on gpu:0 (GPU-…) at …", or "none"."""
    said = [
        _("XID {xid} on {gpu} ({uuid}) at {at}").format(
            xid=x.get("xid"), gpu=x.get("gpu"), uuid=x.get("uuid"), at=x.get("at")
        )
        for x in xids
    ]
    return "; ".join(said) or _("none")


def same_file(left: Path, right: Path) -> bool:
    try:
        return left.samefile(right)
    except OSError:
        return False


def emit_evidence(job: Job, json_out: bool) -> None:
    """The job's NVML evidence, each fact beside the nvidia-smi query that reads it too."""
    evidence = job.get("evidence") or {}
    if json_out:
        emit_json({"id": job["id"], "device": job.get("device"), "evidence": evidence})
        return
    emit_line(f"job {job['id']} device={job.get('device') or '-'} backend={job.get('backend')}")
    if not evidence:
        text = _("no NVML evidence: the job ran on {backend}, not a CUDA GPU")
        emit_line("  " + text.format(backend=job.get("backend")))
        return
    width = max(len(key) for key in evidence)
    for key, value in evidence.items():
        shown = _xids(value) if key == "xid_errors" else value
        emit_line(f"  {key.ljust(width)}  {shown}")
        if key in NVIDIA_SMI:
            emit_line(f"  {' ' * width}  ↔ {NVIDIA_SMI[key]}")
