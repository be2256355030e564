"""`taogpuctl top`: a live, job-aware view of the host, as nvitop is for processes.

Per device: utilisation, memory, temperature and power (NVML, read here, when a driver is
present), its worker (pid, state, slots in use) and the job in each slot (user, task,
elapsed); then the queue. A CPU-only host shows its CPU workers with `-` for the NVML
fields and the driver's reason on the header line. `--once` prints one frame and exits (for
scripts, and for a terminal without a live display).

`frame()` is pure (the daemon's answers and NVML's inventory in, a rich renderable out), so
the layout is tested on fed data; the command only fetches and redraws.
"""

from __future__ import annotations

import functools
import pwd
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from taogpud.cli.context import connect
from taogpud.cli.conventions import short_ids
from taogpud.cli.output import gibibytes, heading
from taogpud.i18n import _, ngettext

if TYPE_CHECKING:  # rich is imported when a frame is drawn: taogpuctl's start skips it
    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

QUEUE_SHOWN = 10
PIPE_WIDTH = 160
NVML_COLUMNS = ("util", "memory", "temp", "power")


@dataclass(frozen=True)
class Snapshot:
    """What one frame shows: the daemon's status and jobs, NVML's devices, and when."""

    status: dict[str, Any]
    running: list[dict[str, Any]]
    queued: list[dict[str, Any]]
    gpus: dict[int, Any]  # NVML index → nvml.GpuDevice
    nvml_reason: str | None  # why there are no NVML fields (no driver), else None
    now: float

    @functools.cached_property
    def short_ids(self) -> dict[str, str]:
        """The jobs' ids as tables show them (taogpuctl.cli.conventions.short_ids)."""
        return short_ids([str(job["id"]) for job in (*self.running, *self.queued)])


def top_command(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between redraws.")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """A live view: devices (NVML), workers and slots, the job in each slot, the queue."""
    from rich.live import Live  # rich: ~45 ms, a terminal's only

    from taogpud.cli.output import stdout  # a rich console, made on first use (output.py)

    with connect(ctx) as client:
        if once:  # into a pipe: wide enough that no column wraps
            stdout.print(frame(fetch(client)), width=None if stdout.is_terminal else PIPE_WIDTH)
            return
        try:
            with Live(frame(fetch(client)), console=stdout, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame(fetch(client)), refresh=True)
        except KeyboardInterrupt:
            return


def fetch(client: Any) -> Snapshot:
    from taogpud.observability import nvml  # ~10 ms, top's alone

    inventory = nvml.inventory(read_process_names=False)
    return Snapshot(
        status=client.status(),
        running=client.list_jobs(status="running", limit=1000),
        queued=client.list_jobs(status="queued", limit=1000),
        gpus={device.index: device for device in inventory.devices},
        nvml_reason=None if inventory.available else inventory.reason,
        now=time.time(),
    )


def frame(snapshot: Snapshot) -> RenderableType:
    """The whole screen: a header line, one table of devices and slots, the queue."""
    from rich.console import Group

    return Group(header(snapshot), device_table(snapshot), queue_table(snapshot))


def header(snapshot: Snapshot) -> Text:
    from rich.text import Text

    view = snapshot.status
    said = _(
        "taogpud {state}  backend {backend}{fallback}  running {running}/{cap}  "
        "queued {queued}/{queue_limit}  at {time}"
    )
    line = said.format(
        state=view["state"],
        backend=view["backend"],
        fallback=_("  FALLBACK (CPU)") if view.get("fallback") else "",
        running=view["running"],
        cap=view["max_concurrent_tasks"],
        queued=view["queued"],
        queue_limit=view.get("queue_limit", "-"),
        time=time.strftime("%H:%M:%S", time.localtime(snapshot.now)),
    )
    if snapshot.nvml_reason:
        line += f"\nNVML: {snapshot.nvml_reason}"
    return Text(line, style="bold red" if view.get("fallback") else "")


DEVICE_COLUMNS: tuple[str, ...] = ("device", "util", "memory", "temp", "power", "worker", "state")
DEVICE_COLUMNS += ("slot", "job", "user", "task", "elapsed")


def device_table(snapshot: Snapshot) -> Table:
    """One row per slot of each worker: the device's figures on its first row only. Without
    a GPU worker the NVML columns are left out (a CPU-only host)."""
    from rich import box
    from rich.table import Table

    workers = snapshot.status.get("workers", [])
    with_nvml = any(str(worker["device"]).startswith("gpu") for worker in workers)
    columns = [c for c in DEVICE_COLUMNS if with_nvml or c not in NVML_COLUMNS]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        table.add_column(heading(column), no_wrap=True)
    by_device: dict[str, list[dict[str, Any]]] = {}
    for job in snapshot.running:
        by_device.setdefault(str(job.get("device")), []).append(job)
    for worker in workers:
        jobs = by_device.get(str(worker["device"]), [])
        slots = max(int(worker.get("slots") or 1), len(jobs))
        device_cells = nvml_cells(worker, snapshot.gpus)[: 5 if with_nvml else 1]
        for slot in range(slots):
            first = slot == 0
            in_slot = jobs[slot] if slot < len(jobs) else None
            table.add_row(
                *(device_cells if first else [""] * len(device_cells)),
                str(worker.get("pid") or "-") if first else "",
                str(worker.get("state") or "-") if first else "",
                f"{slot + 1}/{slots}",
                *job_cells(in_slot, snapshot),
            )
    return table


def nvml_cells(worker: dict[str, Any], gpus: dict[int, Any]) -> list[str]:
    """device, util, memory, temp, power: NVML's figures for a gpu worker, else `-`."""
    gpu = gpus.get(worker.get("index", -1)) if str(worker["device"]).startswith("gpu") else None
    if gpu is None:
        return [str(worker["device"]), "-", "-", "-", "-"]
    util = "-" if gpu.utilization_percent is None else f"{gpu.utilization_percent}%"
    memory = f"{gibibytes(gpu.memory_used_bytes)} / {gibibytes(gpu.memory_total_bytes)}"
    temp = "-" if gpu.temperature_c is None else f"{gpu.temperature_c}°C"
    power = "-" if gpu.power_w is None else f"{gpu.power_w:.0f} W"
    return [f"{worker['device']} {gpu.name}", util, memory, temp, power]


def job_cells(job: dict[str, Any] | None, snapshot: Snapshot) -> list[str]:
    """job id (short), user, task, elapsed; an idle slot reads `idle`."""
    if job is None:
        return [_("idle"), "", "", ""]
    started = job.get("started_at") or job.get("created_at") or snapshot.now
    short = snapshot.short_ids[str(job["id"])]
    return [short, user_name(job), str(job["task"]), elapsed(snapshot.now - started)]


def queue_table(snapshot: Snapshot) -> Table:
    """The queue in the order it will run (higher priority, then older, first)."""
    from rich import box
    from rich.table import Table

    queued = sorted(
        snapshot.queued, key=lambda job: (-(job.get("priority") or 0), job.get("created_at") or 0)
    )
    title = ngettext("queue: {n} job", "queue: {n} jobs", len(queued)).format(n=len(queued))
    columns = [heading(name) for name in ("job", "user", "task", "priority", "waiting")]
    table = Table(*columns, title=title, box=box.SIMPLE_HEAD)
    table.title_justify = "left"
    for job in queued[:QUEUE_SHOWN]:
        waiting = elapsed(snapshot.now - (job.get("created_at") or snapshot.now))
        short = snapshot.short_ids[str(job["id"])]
        table.add_row(short, user_name(job), job["task"], str(job.get("priority", 0)), waiting)
    if len(queued) > QUEUE_SHOWN:
        more = _("… {n} more").format(n=len(queued) - QUEUE_SHOWN)
        table.add_row(more, "", "", "", "")
    return table


def user_name(job: dict[str, Any]) -> str:
    uid = (job.get("peer") or {}).get("uid")
    if uid is None:
        return "-"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def elapsed(seconds: float) -> str:
    """`0.4s`, `12s`, `3m05s`, `1h02m`."""
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
