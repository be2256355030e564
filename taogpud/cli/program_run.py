"""`taogpuctl exec`: your own program through the queue, under a lease (docs/programs.md).

taogpuctl queues it, says where it stands while it waits, starts it here as you once the
lease is granted (in this directory, with this environment plus the lease's devices), streams
its output to this terminal and exits with its exit status. Ctrl-C (SIGINT), SIGTERM and
SIGHUP go to the program's process group, and the job ends `cancelled`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from taogpud.cli.output import emit_json, emit_line, report_error, state_word, warn
from taogpud.client import Client, Job
from taogpud.client.program import Outcome, ProgramRun, forwarding
from taogpud.errors import EXIT_INTERRUPTED, EXIT_OK, CliError
from taogpud.i18n import _
from taogpud.wire import LeaseJson

UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`4G`, `512MiB`, `1.5g`, `1048576` → bytes (binary units)."""
    match = SIZE.match(text)
    if match is None or float(match[1]) <= 0:
        not_size = _("--mem {text} is not a size").format(text=repr(text))
        raise CliError(not_size, _("e.g. --mem 4G, --mem 512M, --mem 1.5GiB"))
    return int(float(match[1]) * UNITS[match[2].lower()])


def exec_program(client: Client, argv: list[str], request: dict[str, Any], json_out: bool) -> int:
    """Run `argv` under a lease; taogpuctl's exit status is the program's."""
    run = ProgramRun(client, argv, reap_descendants=True, on_queued=_say_queued, **request)
    try:
        with forwarding(run):
            outcome = run.run()
    except KeyboardInterrupt:  # Ctrl-C before the program started: the job goes with it
        if run.job is not None:
            client.cancel(run.job["id"])
            warn(
                _("job {job_id} cancelled before its program started").format(job_id=run.job["id"])
            )
        return EXIT_INTERRUPTED
    return _report(outcome, json_out)


def detach_program(client: Client, argv: list[str], request: dict[str, Any], json_out: bool) -> int:
    """Leave a supervisor (taogpud/client/supervise.py) to queue and run it; print its id."""
    spec = {"socket": client.socket_path, "argv": argv, "request": request}
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "taogpud.client.supervise", json.dumps(spec)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not this terminal's: a hang-up or Ctrl-C here is not its
    )
    assert supervisor.stdout is not None
    said = json.loads(supervisor.stdout.readline() or '{"error": {"message": "it exited"}}')
    supervisor.stdout.close()
    if "error" in said:
        supervisor.wait()
        not_queued = _("the program was not queued: {reason}")
        raise CliError(not_queued.format(reason=said["error"]["message"]),
                       said["error"].get("hint") or "")  # fmt: skip
    job = said["job"]
    if json_out:
        emit_json(job)
    else:
        emit_line(job["id"])
    return EXIT_OK


def program_status(job: Job) -> int | None:
    """A finished program's exit status as a shell gives it (128+N: killed by signal N)."""
    result = job.get("result") or {}
    if result.get("signal"):
        return 128 + int(getattr(signal, result["signal"], 0))
    code = result.get("exit_code")
    return int(code) if isinstance(code, int) else None


def follow_log(client: Client, job_id: str, follow: bool) -> None:
    """A program's log to stdout, as it comes with `follow`, until its job ended."""
    offset = 0
    while True:
        piece = client.program_log(job_id, offset, wait_s=30.0 if follow else 0.0)
        sys.stdout.buffer.write(piece["data"])
        sys.stdout.buffer.flush()
        offset = piece["next"]
        if piece["ended"] or not (follow or piece["data"]):
            return


def _say_queued(lease: LeaseJson) -> None:
    job = lease["job"]
    position = lease["queue_position"]
    queued = _("job {job_id} queued, position {position} in the queue")
    sys.stderr.write(f"taogpuctl: {queued.format(job_id=job['id'], position=position)}\n")
    sys.stderr.flush()


def _report(outcome: Outcome, json_out: bool) -> int:
    job = outcome.job
    if json_out:
        emit_json({**job, "exit_status": outcome.exit_status})
    elif job.get("status") not in ("succeeded", None):
        error: Mapping[str, Any] = job.get("error") or {}
        ended = _("job {job_id} {status}: {detail}")
        message = ended.format(
            job_id=job["id"], status=state_word(job["status"]), detail=error.get("message", "")
        )
        report_error(message, error.get("hint") or "")
    return outcome.exit_status
