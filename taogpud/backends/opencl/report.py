"""OpenCL beside CUDA in `taogpuctl devices`: the platforms and devices the ICD loader shows
(backends/opencl/probe.py asks a child process), and which worker holds which. Whether the
configured platform and devices are there is the doctor's check (doctor/opencl.py).

Pure functions of an `OpenclInventory` and the daemon's device list: tests feed both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taogpud.backends.opencl.probe import OpenclInventory

GIB = 1024**3
COLUMNS = ("platform", "index", "type", "name", "vendor", "memory", "fp64", "worker")


def opencl_document(
    found: OpenclInventory, workers: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    """The `devices --json` part: {"status": "ok" | why not, "platforms": [… with devices]}."""
    held = {
        (w.get("platform_index"), w.get("index")): w.get("device")
        for w in workers or ()
        if w.get("backend") == "opencl"
    }
    platforms = [
        {
            "index": platform.index,
            "name": platform.name,
            "vendor": platform.vendor,
            "version": platform.version,
            "devices": [
                {**_device(device), "worker": held.get((platform.index, device.index))}
                for device in platform.devices
            ],
        }
        for platform in found.platforms
    ]
    return {"status": found.reason or "ok", "platforms": platforms}


def _device(device: Any) -> dict[str, Any]:
    return {
        "index": device.index,
        "name": device.name,
        "type": device.type,
        "vendor": device.vendor,
        "version": device.version,
        "global_mem_bytes": device.global_mem_bytes,
        "max_alloc_bytes": device.max_alloc_bytes,
        "fp64": device.fp64,
    }


def header_lines(document: dict[str, Any]) -> list[str]:
    if document["status"] != "ok":
        return [f"OpenCL: none usable ({document['status']})"]
    if not document["platforms"]:
        return ["OpenCL: the ICD loader finds no platform"]
    return [
        f"OpenCL platform {p['index']}: {p['name']} ({p['version']}), {len(p['devices'])} device(s)"
        for p in document["platforms"]
    ]


def rows(document: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            platform["index"],
            device["index"],
            device["type"],
            device["name"],
            device["vendor"],
            f"{device['global_mem_bytes'] / GIB:.1f} GiB",
            "yes" if device["fp64"] else "no",
            device["worker"],
        ]
        for platform in document["platforms"]
        for device in platform["devices"]
    ]
