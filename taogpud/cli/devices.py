"""What `taogpuctl devices` shows: the GPUs as the NVIDIA driver sees them (NVML, read by
taogpuctl on this host) beside the devices the daemon's workers hold.

Pure functions of an `nvml.Inventory` and the daemon's device list: tests feed both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taogpud.observability import nvml
from taogpud.wire import DeviceJson

GIB = 1024**3
MIB = 1024**2

GPU_COLUMNS = (
    "index",
    "uuid",
    "name",
    "cc",
    "total",
    "used",
    "free",
    "util",
    "worker",
)


def devices_document(
    inventory: nvml.Inventory, workers: Sequence[DeviceJson] | None
) -> dict[str, Any]:
    """The `--json` answer: {driver, gpus, workers}; workers is None when the daemon is down."""
    return {
        "driver_version": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "nvml": "ok" if inventory.available else inventory.reason,
        "gpus": [_gpu(card, workers or ()) for card in inventory.devices],
        "workers": list(workers) if workers is not None else None,
    }


def _gpu(card: nvml.GpuDevice, workers: Sequence[DeviceJson]) -> dict[str, Any]:
    return {
        "index": card.index,
        "uuid": card.uuid,
        "name": card.name,
        "pci_bus_id": card.pci_bus_id,
        "compute_capability": card.compute_capability,
        "memory_total_bytes": card.memory_total_bytes,
        "memory_used_bytes": card.memory_used_bytes,
        "memory_free_bytes": card.memory_free_bytes,
        "utilization_percent": card.utilization_percent,
        "worker": _worker_on(card, workers),
        "processes": [
            {"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes} for p in card.processes
        ],
    }


def _worker_on(card: nvml.GpuDevice, workers: Sequence[DeviceJson]) -> str | None:
    """The daemon's device label ("gpu:0") on this card, matched by UUID, never by index."""
    return next(
        (str(w.get("device")) for w in workers if card.uuid and w.get("uuid") == card.uuid), None
    )


def gpu_rows(document: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            gpu["index"],
            gpu["uuid"],
            gpu["name"],
            gpu["compute_capability"],
            _gib(gpu["memory_total_bytes"]),
            _gib(gpu["memory_used_bytes"]),
            _gib(gpu["memory_free_bytes"]),
            "-" if gpu["utilization_percent"] is None else f"{gpu['utilization_percent']}%",
            gpu["worker"],
        ]
        for gpu in document["gpus"]
    ]


def header_lines(document: dict[str, Any]) -> list[str]:
    if document["nvml"] != "ok":
        return [f"NVIDIA driver: none found ({document['nvml']})"]
    return [
        f"NVIDIA driver {document['driver_version'] or '?'}, "
        f"CUDA driver version {document['cuda_driver_version'] or '?'}, "
        f"{len(document['gpus'])} GPU(s)"
    ]


def process_lines(document: dict[str, Any]) -> list[str]:
    lines = []
    for gpu in document["gpus"]:
        for process in gpu["processes"]:
            used = process["used_bytes"]
            shown = "? MiB" if used is None else f"{used // MIB} MiB"
            name = f" ({process['name']})" if process["name"] else ""
            lines.append(f"gpu {gpu['index']}: pid {process['pid']}{name} {shown}")
    return lines


def worker_rows(document: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            worker.get("device"),
            worker.get("backend"),
            worker.get("name"),
            worker.get("uuid"),
            worker.get("compute_capability"),
            _gib(worker.get("memory_cap_bytes")),
        ]
        for worker in document["workers"] or ()
    ]


WORKER_COLUMNS = ("device", "backend", "name", "uuid", "compute_capability", "memory_cap")


def _gib(value: Any) -> str:
    return "-" if not value else f"{value / GIB:.1f} GiB"
