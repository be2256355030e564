"""OpenCL beside CUDA in `taogpuctl devices` and `doctor`: the platforms and devices the ICD
loader shows (backends/opencl/probe.py asks a child process), which worker holds which, and
whether the configured platform and devices are there.

Pure functions of an `OpenclInventory` and the daemon's device list: tests feed both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from taogpud.backends.opencl.probe import OpenclInventory, problem
from taogpud.doctor import Check

GIB = 1024**3
COLUMNS = ("platform", "index", "type", "name", "vendor", "memory", "fp64", "worker")


def opencl_document(
    found: OpenclInventory, workers: Sequence[dict[str, Any]] | None
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


def check_opencl(
    backend: str,
    platform_index: int,
    device_ids: Sequence[int] | Literal["all"],
    found: OpenclInventory,
) -> Check:
    """fail when gpu.backend is opencl and its platform or devices are missing (or cannot
    build a kernel); otherwise what is there, as a pass (opencl) or a skip (another backend)."""
    name = "opencl"
    listed = _listing(found)
    if backend != "opencl":
        return Check(name, "skip", f"gpu.backend is {backend}, so OpenCL is not used; {listed}")
    why = problem(found, platform_index, device_ids)
    if why is not None:
        hint = (
            "fix the OpenCL driver or [backend.opencl] in config.toml (`clinfo -l` lists "
            "platforms and devices), or set gpu.allowFallbackToCpu to run on the CPU"
        )
        return Check(name, "fail", why, hint)
    return Check(name, "pass", f"platform {platform_index}, devices {_ids(device_ids)}: {listed}")


def _listing(found: OpenclInventory) -> str:
    if found.reason is not None:
        return f"none usable: {found.reason}"
    if not found.platforms:
        return "the ICD loader finds no platform"
    return "; ".join(
        f"platform {p.index} {p.name}: "
        + (", ".join(f"{d.index} {d.name} ({d.type})" for d in p.devices) or "no device")
        for p in found.platforms
    )


def _ids(device_ids: Sequence[int] | Literal["all"]) -> str:
    return "all" if device_ids == "all" else ", ".join(map(str, device_ids))
