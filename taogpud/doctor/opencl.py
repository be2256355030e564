"""The doctor's OpenCL check: whether the configured platform and devices are there (and
can build a kernel), as a child process finds them (backends/opencl/probe.py).

A pure function of an `OpenclInventory`: tests feed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from taogpud.backends.opencl.probe import OpenclInventory, problem
from taogpud.doctor import Check


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
