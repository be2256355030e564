"""How a finished (or given-up-on) job is reported: its summary or document, its outputs
saved, and the exit code that says how it went (taogpud.cli's table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taogpud.cli.output import (
    emit_json,
    emit_line,
    emit_mapping,
    job_problem,
    report_error,
    summary_line,
    warn,
    warn_if_fallback,
)
from taogpud.cli.program_run import program_status
from taogpud.client import Client, Job, is_finished
from taogpud.errors import EXIT_FAILED, EXIT_OK, EXIT_STILL_RUNNING, CliError
from taogpud.i18n import _


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
        return EXIT_STILL_RUNNING
    return _exit_status(job)


def _exit_status(job: Job) -> int:
    """A failed job's exit code: 1, or a program's own exit status when it has one."""
    if job.get("task") == "program":
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
