"""`taogpuctl status`: the daemon's backend, fallback, load against its caps, its workers.

One function for both ways in: the typer command (cli/system.py, also under --watch) and the
hot path (cli/hot.py), so the two print exactly the same.
"""

from __future__ import annotations

from pathlib import Path

from taogpud.cli.output import emit_json, emit_line, emit_table, format_cell, warn
from taogpud.client import Client
from taogpud.i18n import _
from taogpud.wire import ArraysJson, StatusJson

WORKER_COLUMNS = ("device", "index", "pid", "state", "running", "slots", "jobs_done", "restarts")


def show_status(socket_path: Path | None, json_out: bool) -> None:
    """Ask the daemon at `socket_path` (None: the client's default) and print its answer."""
    with Client(socket_path) as client:  # no body sent: orjson is never imported
        view = client.status()
    if json_out:
        emit_json(view)
        return
    for line in status_lines(view):
        emit_line(line)
    workers = view["workers"]
    emit_table(WORKER_COLUMNS, [[worker.get(c) for c in WORKER_COLUMNS] for worker in workers])
    if view["fallback"]:
        text = _("running on CPU fallback workers, not a GPU: {reason}")
        warn(text.format(reason=view.get("fallback_reason")))


def status_lines(view: StatusJson) -> list[str]:
    """The lines above the worker table."""
    first = _(
        "state {state}  backend {backend}  fallback {fallback}  config generation {generation}"
    )
    second = _(
        "running {running}/{cap} (max_concurrent_tasks)  queued {queued}/{queue_limit}  "
        "strategy {strategy}  jobs total {total}"
    )
    lines = [
        first.format(
            state=view["state"],
            backend=view["backend"],
            fallback=format_cell(view["fallback"]),
            generation=view["config_generation"],
        ),
        second.format(
            running=view["running"],
            cap=view["max_concurrent_tasks"],
            queued=view["queued"],
            queue_limit=view.get("queue_limit", "-"),
            strategy=view.get("strategy", "-"),
            total=view.get("jobs_total", "-"),
        ),
    ]
    arrays = view.get("arrays")
    if arrays:
        lines.append(arrays_line(arrays))
    return lines


def arrays_line(arrays: ArraysJson) -> str:
    text = _(
        "uploads {used}/{budget} MiB  in progress {reserved} MiB  "
        "yours pending {pending}/{quota} MiB (quota; past it your oldest unused go)"
    )
    return text.format(
        used=_mib(arrays["used_bytes"]),
        budget=_mib(arrays["budget_bytes"]),
        reserved=_mib(arrays.get("reserved_bytes", 0)),
        pending=_mib(arrays["your_pending_bytes"]),
        quota=_mib(arrays["user_quota_bytes"]),
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f}"
