"""Jobs: `submit`, `wait`, `show`, `list`, `cancel`, `result` (reported as cli/report.py says)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from taogpud.cli import guide as cli_guide
from taogpud.cli import words as cli_words
from taogpud.cli.context import connect
from taogpud.cli.conventions import short_ids
from taogpud.cli.inputs import build_params, upload_inputs
from taogpud.cli.options import JsonFlag, ParamOption, SeedOption, SizeOption
from taogpud.cli.output import (
    Progress,
    emit_json,
    emit_line,
    emit_mapping,
    emit_table,
    job_problem,
    readable_job,
    state_word,
    warn_if_fallback,
)
from taogpud.cli.report import finish_waited, report_job
from taogpud.client import Job
from taogpud.client.ids import resolve_id
from taogpud.errors import EXIT_FAILED, EXIT_OK, CliError
from taogpud.i18n import _


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
