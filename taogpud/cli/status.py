"""`taogpuctl status`: the daemon's backend, fallback, load against its caps, its workers.

One function for both ways in: the typer command (cli/app.py, also under --watch) and the
hot path (cli/hot.py), so the two print exactly the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taogpud.cli.output import emit_json, emit_line, emit_table, format_cell, warn
from taogpud.client import Client

WORKER_COLUMNS = ("device", "index", "pid", "state", "running", "slots", "jobs_done", "restarts")


def show_status(socket_path: Path | None, json_out: bool) -> None:
    """Ask the daemon at `socket_path` (None: the client's default) and print its answer."""
    with Client(socket_path, stdlib_json=True) as client:  # one call: no orjson to import
        view = client.status()
    if json_out:
        emit_json(view)
        return
    for line in status_lines(view):
        emit_line(line)
    workers = view["workers"]
    emit_table(WORKER_COLUMNS, [[worker.get(c) for c in WORKER_COLUMNS] for worker in workers])
    if view["fallback"]:
        warn(f"running on CPU fallback workers, not a GPU: {view.get('fallback_reason')}")


def status_lines(view: dict[str, Any]) -> list[str]:
    """The lines above the worker table."""
    lines = [
        f"state {view['state']}  backend {view['backend']}  "
        f"fallback {format_cell(view['fallback'])}  config generation {view['config_generation']}",
        f"running {view['running']}/{view['max_concurrent_tasks']} (max_concurrent_tasks)  "
        f"queued {view['queued']}/{view.get('queue_limit', '-')}  "
        f"strategy {view.get('strategy', '-')}  jobs total {view.get('jobs_total', '-')}",
    ]
    if view.get("arrays"):
        arrays = view["arrays"]
        lines.append(
            f"uploads {_mib(arrays['used_bytes'])}/{_mib(arrays['budget_bytes'])} MiB  "
            f"in progress {_mib(arrays.get('reserved_bytes', 0))} MiB  "
            f"yours pending {_mib(arrays['your_pending_bytes'])}/"
            f"{_mib(arrays['user_quota_bytes'])} MiB (quota; past it your oldest unused go)"
        )
    return lines


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f}"
