"""Can OpenCL run here, and what does it offer? Asked of a child process, never this one.

PoCL aborts the whole process (SIGABRT) when it cannot link a kernel (no `ld`), and a
process that used OpenCL must not fork: so the daemon, `taogpuctl devices` and doctor
run `python -m taogpud.backends.opencl.probe` and read one JSON object from it.

    inventory(build_on=(platform, [devices]))   platforms and devices; with build_on, a
                                                test kernel is built and run on each of those
    problem(inventory, platform, devices)       None, or one sentence: what is wrong, the fix
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from taogpud.host.environ import child_env  # a leaf: imports nothing of taogpud
from taogpud.host.install_hints import install_hint

PROBE_TIMEOUT_S = 120.0  # a cold PoCL build is about a second; a GPU driver's first can be more
INSTALL_HINT = install_hint("opencl")
DRIVER_HINT = (
    "install an OpenCL driver (ICD): pocl-opencl-icd for the CPU, or the GPU vendor's; "
    "`clinfo -l` lists what the ICD loader finds"
)
_TEST_KERNEL = """
__kernel void square(__global float *x) { size_t i = get_global_id(0); x[i] = x[i] * x[i]; }
"""


@dataclass(frozen=True)
class OpenclDevice:
    index: int
    name: str
    type: str  # GPU | CPU | ACCELERATOR | CUSTOM | OTHER
    vendor: str
    version: str
    global_mem_bytes: int
    max_alloc_bytes: int
    fp64: bool


@dataclass(frozen=True)
class OpenclPlatform:
    index: int
    name: str
    vendor: str
    version: str
    devices: tuple[OpenclDevice, ...] = ()


@dataclass(frozen=True)
class OpenclInventory:
    platforms: tuple[OpenclPlatform, ...] = ()
    reason: str | None = None  # why OpenCL cannot be used here; None when it answered
    built_on: tuple[int, ...] = ()  # devices the test kernel was built and run on

    @property
    def available(self) -> bool:
        return self.reason is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the daemon's side -----------------------------------------------------------------------


def inventory(
    build_on: tuple[int, Sequence[int] | Literal["all"]] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> OpenclInventory:
    """What the child process found; never raises. With build_on=(platform, devices), a test
    kernel is built and run on each device (where PoCL would abort without `ld`)."""
    if importlib.util.find_spec("pyopencl") is None:  # no child needed to say that
        return OpenclInventory(reason=f"pyopencl is not installed: {INSTALL_HINT}")
    command = [sys.executable, "-m", "taogpud.backends.opencl.probe"]
    if build_on is not None:
        platform, devices = build_on
        command += ["--platform", str(platform), "--devices", _devices_arg(devices)]
    try:
        done = subprocess.run(
            command,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_env(),  # never the API key
        )
    except subprocess.TimeoutExpired:
        return OpenclInventory(
            reason=f"the OpenCL probe did not answer within {timeout_s:.0f} s",
            platforms=(),
        )
    except OSError as exc:  # the child could not even start (no memory, no such interpreter)
        return OpenclInventory(reason=f"the OpenCL probe could not start: {exc}", platforms=())
    if done.returncode != 0:
        return OpenclInventory(reason=_crash_reason(done.returncode, done.stderr))
    try:
        return _from_json(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        return OpenclInventory(reason=f"the OpenCL probe answered nonsense ({exc}): {done.stderr}")


def _devices_arg(devices: Sequence[int] | Literal["all"]) -> str:
    return "all" if devices == "all" else ",".join(str(index) for index in devices)


def _crash_reason(returncode: int, stderr: str) -> str:
    tail = " ".join(stderr.strip().splitlines()[-3:])
    if returncode == -signal.SIGABRT:
        return (
            "the OpenCL driver aborted the probe while it built a test kernel (SIGABRT); PoCL "
            "does this when the linker `ld` is missing: install binutils"
            + (f" ({tail})" if tail else "")
        )
    if returncode < 0:
        return f"the OpenCL probe was killed by signal {-returncode} ({tail or 'no output'})"
    return f"the OpenCL probe failed with exit status {returncode}: {tail or 'no output'}"


def _from_json(data: dict[str, Any]) -> OpenclInventory:
    platforms = tuple(
        OpenclPlatform(
            **{k: v for k, v in p.items() if k != "devices"},
            devices=tuple(OpenclDevice(**d) for d in p["devices"]),
        )
        for p in data["platforms"]
    )
    return OpenclInventory(platforms, data.get("reason"), tuple(data.get("built_on", ())))


def problem(
    found: OpenclInventory, platform_index: int, device_ids: Sequence[int] | Literal["all"]
) -> str | None:
    """None when the platform and every device exist (and built the test kernel, if asked);
    otherwise one sentence saying what is wrong and how to fix it."""
    if found.reason is not None:
        return found.reason
    if not found.platforms:
        return f"the OpenCL ICD loader finds no platform: {DRIVER_HINT}"
    if platform_index >= len(found.platforms):
        names = "; ".join(f"{p.index}: {p.name}" for p in found.platforms)
        return (
            f"backend.opencl.platform_index is {platform_index} but this host has "
            f"{len(found.platforms)} OpenCL platform(s) ({names}): set platform_index to one "
            "of them"
        )
    platform = found.platforms[platform_index]
    count = len(platform.devices)
    wanted = range(count) if device_ids == "all" else device_ids
    missing = [index for index in wanted if not 0 <= index < count]
    if count == 0 or missing:
        listed = "; ".join(f"{d.index}: {d.name} ({d.type})" for d in platform.devices) or "none"
        return (
            f"backend.opencl.device_index asks for device {', '.join(map(str, missing)) or 0} "
            f"but platform {platform_index} ({platform.name}) has {count} device(s) ({listed}): "
            "set device_index to one of them"
        )
    return None


def device_count(found: OpenclInventory, platform_index: int) -> int:
    return len(found.platforms[platform_index].devices)


# --- the child's side ------------------------------------------------------------------------


def device_type_name(cl: Any, bits: int) -> str:
    """GPU, CPU or ACCELERATOR from CL_DEVICE_TYPE (PoCL also sets the DEFAULT bit)."""
    for name in ("GPU", "CPU", "ACCELERATOR", "CUSTOM"):
        if bits & getattr(cl.device_type, name):
            return name
    return "OTHER"


def _read_platforms(cl: Any) -> list[OpenclPlatform]:
    found = []
    for p_index, platform in enumerate(cl.get_platforms()):
        try:
            devices = platform.get_devices()
        except cl.Error:  # DEVICE_NOT_FOUND: a platform with no device right now
            devices = []
        described = tuple(
            OpenclDevice(
                index=d_index,
                name=device.name.strip(),
                type=device_type_name(cl, device.type),
                vendor=device.vendor.strip(),
                version=device.version.strip(),
                global_mem_bytes=int(device.global_mem_size),
                max_alloc_bytes=int(device.max_mem_alloc_size),
                fp64="cl_khr_fp64" in device.extensions,
            )
            for d_index, device in enumerate(devices)
        )
        found.append(
            OpenclPlatform(
                p_index,
                platform.name.strip(),
                platform.vendor.strip(),
                platform.version.strip(),
                described,
            )
        )
    return found


def _build_and_run(cl: Any, device: Any) -> str | None:
    """Build and run a test kernel; None when 2² came back as 4."""
    import numpy as np

    context = cl.Context([device])
    queue = cl.CommandQueue(context)
    try:
        program = cl.Program(context, _TEST_KERNEL).build()
    except cl.Error as exc:
        return f"a test kernel failed to build on {device.name.strip()}: {build_log(exc)}"
    host = np.full(4, 2.0, dtype=np.float32)
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    cl.Kernel(program, "square")(queue, (4,), None, buffer)
    cl.enqueue_copy(queue, host, buffer)
    queue.finish()
    if not np.all(host == 4.0):
        return f"a test kernel computed {host.tolist()} on {device.name.strip()}, not 4.0"
    return None


def build_log(exc: BaseException, limit: int = 600) -> str:
    """A build failure on one line: the compiler's error lines first, then the rest."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "clBuildProgram" not in line]
    text = " | ".join(dict.fromkeys(errors or lines))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _probe(platform_index: int | None, devices_arg: str | None) -> OpenclInventory:
    try:
        import pyopencl as cl
    except ModuleNotFoundError as exc:
        return OpenclInventory(reason=f"pyopencl is not installed ({exc}): {INSTALL_HINT}")
    try:
        platforms = tuple(_read_platforms(cl))
    except cl.Error as exc:  # PLATFORM_NOT_FOUND_KHR (-1001): the ICD loader found no driver
        return OpenclInventory(
            reason=f"the OpenCL ICD loader finds no platform ({exc}): {DRIVER_HINT}"
        )
    found = OpenclInventory(platforms)
    if platform_index is None or devices_arg is None:
        return found
    wanted: Sequence[int] | Literal["all"] = (
        "all" if devices_arg == "all" else [int(i) for i in devices_arg.split(",")]
    )
    why = problem(found, platform_index, wanted)
    if why is not None:
        return found
    chosen = cl.get_platforms()[platform_index].get_devices()
    indices = range(len(chosen)) if wanted == "all" else wanted
    for index in indices:
        failure = _build_and_run(cl, chosen[index])
        if failure is not None:
            return OpenclInventory(platforms, failure)
    return OpenclInventory(platforms, None, tuple(indices))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", type=int, default=None)
    parser.add_argument("--devices", default=None, help='"0,1" or "all"')
    args = parser.parse_args(argv)
    print(json.dumps(_probe(args.platform, args.devices).as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
