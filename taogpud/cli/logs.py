"""Live views: `trace` (the daemon's JSON lines, grep'd), `logs ID [-f]` (one job's lines as
they happen) and `status --watch`, all read through the API, not the daemon's stdout."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import orjson
import typer

from taogpud import wire
from taogpud.cli.context import connect
from taogpud.cli.output import emit_line
from taogpud.cli.program_run import follow_log
from taogpud.client.ids import resolve_id

# a job line's fields shown in `logs`, in this order, after its time and event
LOG_FIELDS: tuple[str, ...] = ("status", "task", "backend", "device", "fallback", "queue_ms")
LOG_FIELDS += ("run_ms", "worker_pid", "error_code", "error", "fallback_reason")
LOG_FIELDS += ("tool", "ok")  # an mcp.call line naming the job (docs/agents.md)


def trace_command(
    ctx: typer.Context,
    grep: Annotated[str | None, typer.Option(help="Only lines holding this text.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=20_000, help="At most N past lines.")] = 1000,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = (
        False
    ),
) -> None:
    """The daemon's trace, one JSON line per event, as journald has it (`trace --grep backend`)."""
    from taogpud.client.stream import stream_lines  # see logs_command

    query = {"limit": limit, "follow": str(follow).lower(), **({"grep": grep} if grep else {})}
    with connect(ctx) as client:
        client.health()  # an absent daemon is exit 3, said as every command says it
        socket_path = client.socket_path
    for event in stream_lines(socket_path, wire.TRACE.url(query)):
        sys.stdout.write(orjson.dumps(event).decode() + "\n")
        sys.stdout.flush()  # a follower piped into grep sees each line as it comes


def logs_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job's id (or a prefix).")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Until the job ends, print lines as they come.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="The raw JSON lines.")] = False,
) -> None:
    """One job's trace lines: queued, running, where it ran, how it ended; a program's own
    output (taogpuctl exec --detach)."""
    # http.client, with email and ssl: ~40 ms that every other command would pay
    from taogpud.client.stream import stream_lines

    with connect(ctx) as client:
        job_id = resolve_id(client, job_id)
        socket_path = client.socket_path
        if not json_out and client.get(job_id).get("task") == "program":
            follow_log(client, job_id, follow)  # its own output, kept by the daemon
            return
    path = wire.JOB_EVENTS.url({"follow": str(follow).lower()}, job_id=job_id)
    for event in stream_lines(socket_path, path):
        emit_line(orjson.dumps(event).decode() if json_out else log_line(event))


def log_line(event: dict[str, Any]) -> str:
    """`2026-12-01T20:45:01.123456Z job.succeeded status=succeeded backend=cpu …`."""
    parts = [str(event.get("timestamp", "-")), str(event.get("event", "-"))]
    for key in LOG_FIELDS:
        if event.get(key) is not None:
            value = event[key]
            parts.append(
                f"{key}={value if isinstance(value, str) else orjson.dumps(value).decode()}"
            )
    return " ".join(parts)


def watch(show: Any, interval_s: float) -> None:
    """Call `show()` every interval_s on a cleared screen until Ctrl-C (as watch(1) does)."""
    from taogpud.cli.output import stdout  # a rich console, made on first use (output.py)

    try:
        while True:
            stdout.clear()
            emit_line(f"every {interval_s:g}s, at {time.strftime('%H:%M:%S')} (Ctrl-C to stop)")
            show()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return
