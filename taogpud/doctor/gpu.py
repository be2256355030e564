"""The doctor's host checks: the CUDA driver against CuPy, cuda_arch against the cards, GPU
memory against memoryFraction, and WSL. Pure functions of `HostFacts` (NVML, the CuPy runtime,
/proc/version), which `gather_host` reads; tests feed facts in.

They run in the daemon (its environment is the one that matters) and, when the daemon cannot be
reached, in taogpuctl itself against the files it reads. A host without a GPU gets a skip when
the config does not want CUDA, and one plain fail (cuda_driver) when it does.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from taogpud.backends.cuda.kernels import same_arch
from taogpud.doctor import Check, CheckStatus, Target, guarded, worst
from taogpud.host.install_hints import install_hint
from taogpud.i18n import Text
from taogpud.observability import nvml

GIB = 1024**3
RECOMMENDED_CUDA_MAJOR = 12  # the guide's recommendation
CUPY_INSTALL_HINT = install_hint("cuda")
DRIVER_HINT = Text(
    "install the NVIDIA driver so that `nvidia-smi` lists the GPU (in a container, pass the GPU "
    "in; on WSL2, install the Windows driver only), or set gpu.backend to cpu"
)


# --- facts from the host ---------------------------------------------------------------------


@dataclass(frozen=True)
class CudaRuntime:
    """The CUDA runtime CuPy was built for, or why there is none."""

    version: str | None  # "12.9"
    package: str | None  # "cupy-cuda12x 14.2.0"
    reason: str | None = None


@dataclass(frozen=True)
class HostFacts:
    inventory: nvml.Inventory
    runtime: CudaRuntime
    proc_version: str


def cuda_runtime() -> CudaRuntime:
    try:
        import cupy
    except ModuleNotFoundError:
        return CudaRuntime(None, None, "CuPy is not installed")
    except (ImportError, OSError, RuntimeError) as exc:
        return CudaRuntime(None, None, f"CuPy failed to import ({type(exc).__name__}: {exc})")
    try:
        encoded = int(cupy.cuda.runtime.runtimeGetVersion())
    except (ImportError, OSError, RuntimeError) as exc:
        return CudaRuntime(None, _cupy_package(), f"CuPy cannot load the CUDA runtime ({exc})")
    return CudaRuntime(nvml.cuda_version(encoded), _cupy_package())


def _cupy_package() -> str | None:
    for name in ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def read_proc_version(path: Path = Path("/proc/version")) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def gather_host() -> HostFacts:
    """NVML, CuPy and the kernel, as this process sees them (blocking: run it in a thread)."""
    return HostFacts(nvml.inventory(), cuda_runtime(), read_proc_version())


def host_checks(target: Target, facts: HostFacts, own_pids: Iterable[int] = ()) -> list[Check]:
    """The checks that need only the config and this host: daemon-side, or the CLI's own."""
    return [
        guarded("cuda_driver", check_cuda_driver, target, facts.inventory, facts.runtime),
        guarded("cuda_arch", check_cuda_arch, target, facts.inventory),
        guarded("gpu_memory", check_gpu_memory, target, facts.inventory, set(own_pids)),
        guarded("wsl", check_wsl, facts.proc_version, target),
    ]


# --- CUDA: driver, runtime, architecture, memory -----------------------------------------------


def check_cuda_driver(target: Target, inventory: nvml.Inventory, runtime: CudaRuntime) -> Check:
    name = "cuda_driver"
    if not inventory.available:
        if not target.wants_cuda:
            text = Text(
                "{reason}; gpu.backend is {backend}, so none is needed",
                reason=inventory.reason,
                backend=target.backend,
            )
            return Check(name, "skip", text)
        text = Text("gpu.backend is cuda but {reason}", reason=inventory.reason)
        return Check(name, "fail", text, DRIVER_HINT)
    driver = Text(
        "driver {version} supports CUDA {cuda}",
        version=inventory.driver_version or "?",
        cuda=inventory.cuda_driver_version or "?",
    )
    if runtime.version is None:
        text = Text("{driver}, but {reason}", driver=driver, reason=runtime.reason)
        if not target.wants_cuda:
            skipped = Text("{text} (gpu.backend is {backend})", text=text, backend=target.backend)
            return Check(name, "skip", skipped)
        return Check(name, "fail", text, CUPY_INSTALL_HINT)
    status, found, hint = _compare_cuda(target, inventory.cuda_driver_version, runtime)
    return Check(name, status, Text("{driver}; {found}", driver=driver, found=found), hint)


def _compare_cuda(
    target: Target, driver_cuda: str | None, runtime: CudaRuntime
) -> tuple[CheckStatus, str, str]:
    wanted = Text(
        "CuPy ({package}) is built for CUDA {version}",
        package=runtime.package or "cupy",
        version=runtime.version,
    )
    have, need = _version(driver_cuda), _version(runtime.version)
    if have is None or need is None:
        return "warn", wanted, Text("compare with `nvidia-smi`")
    if have[0] < need[0]:
        hint = Text(
            "upgrade the driver, or install the CuPy for CUDA {major}: {how}",
            major=have[0],
            how=CUPY_INSTALL_HINT,
        )
        return (
            target.severity(),
            Text("{wanted}: the driver is too old for it", wanted=wanted),
            hint,
        )
    if have < need:
        text = Text(
            "{wanted}: a little newer than the driver (minor-version compatibility covers most)",
            wanted=wanted,
        )
        return "warn", text, Text("upgrade the driver to be safe")
    if need[0] < RECOMMENDED_CUDA_MAJOR:
        return "warn", wanted, Text("the guide recommends CUDA 12.x: {how}", how=CUPY_INSTALL_HINT)
    if need[0] > RECOMMENDED_CUDA_MAJOR:
        text = Text(
            "{wanted} (the guide recommends 12.x; this driver runs {major}.x)",
            wanted=wanted,
            major=need[0],
        )
        return "pass", text, ""
    return "pass", wanted, ""


def _version(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def configured_cards(
    target: Target, inventory: nvml.Inventory
) -> tuple[list[tuple[int, nvml.GpuDevice]], list[int]]:
    """([(cuda index, card)], [configured indices with no card]) in CUDA's numbering."""
    cards = nvml.cuda_order(inventory, target.cuda_visible_devices)
    ids = range(len(cards)) if target.device_ids == "all" else target.device_ids
    found = [(index, cards[index]) for index in ids if 0 <= index < len(cards)]
    missing = [index for index in ids if not 0 <= index < len(cards)]
    return found, missing


def check_cuda_arch(target: Target, inventory: nvml.Inventory) -> Check:
    name = "cuda_arch"
    if not target.wants_cuda:
        text = Text("gpu.backend is {backend}: cuda_arch is not used", backend=target.backend)
        return Check(name, "skip", text)
    if not inventory.devices:
        return Check(name, "skip", Text("no GPU visible to compare with (see cuda_driver)"))
    found, missing = configured_cards(target, inventory)
    if missing:
        return Check(
            name,
            "fail",
            Text(
                "backend.cuda.device_id lists {missing} but CUDA sees {n} GPU(s)",
                missing=", ".join(map(str, missing)),
                n=len(nvml.cuda_order(inventory, target.cuda_visible_devices)),
            ),
            Text("set backend.cuda.device_id to GPUs that exist (`nvidia-smi -L`)"),
        )
    cards = ", ".join(f"gpu:{index} {card.name} is {card.arch}" for index, card in found)
    if target.cuda_arch == "auto":
        return Check(name, "pass", f'cuda_arch = "auto": {cards}')
    wrong = [(i, card) for i, card in found if not same_arch(target.cuda_arch, card.arch or "")]
    if not wrong:
        text = Text('cuda_arch = "{arch}" matches: {cards}', arch=target.cuda_arch, cards=cards)
        return Check(name, "pass", text)
    arches = sorted({card.arch or "?" for _, card in found})
    detail = "; ".join(
        f'cuda_arch = "{target.cuda_arch}" but gpu:{index} ({card.name}) has compute capability '
        f"{card.compute_capability}"
        for index, card in wrong
    )
    if len(arches) == 1:
        hint = f'set cuda_arch = "{arches[0]}" (or "auto") under [backend.cuda] in config.toml'
    else:
        hint = f'the cards differ ({", ".join(arches)}): set cuda_arch = "auto" in config.toml'
    return Check(name, "fail", detail, hint)


def check_gpu_memory(target: Target, inventory: nvml.Inventory, own_pids: set[int]) -> Check:
    name = "gpu_memory"
    if not target.wants_cuda:
        text = Text("gpu.backend is {backend}: no GPU memory is used", backend=target.backend)
        return Check(name, "skip", text)
    if not inventory.devices:
        return Check(name, "skip", Text("no GPU visible (see cuda_driver)"))
    found, _ = configured_cards(target, inventory)
    if not found:
        return Check(name, "skip", Text("none of the configured GPUs is visible (see cuda_arch)"))
    lines = [_memory_line(target, index, card, own_pids) for index, card in found]
    status = worst(status for status, _ in lines)
    hint = ""
    if status == "warn":
        hint = Text(
            "free that memory (the processes above), or lower gpu.memoryFraction; until then "
            "jobs that do not fit what is free wait in the queue"
        )
    return Check(name, status, "; ".join(text for _, text in lines), hint)


def _memory_line(
    target: Target, index: int, card: nvml.GpuDevice, own_pids: set[int]
) -> tuple[CheckStatus, str]:
    total = card.memory_total_bytes
    cap = math.floor(total * target.memory_fraction)
    ours = sum(p.used_bytes or 0 for p in card.processes if p.pid in own_pids)
    others = [p for p in card.processes if p.pid not in own_pids]
    usable = card.memory_free_bytes + ours
    text = (
        f"gpu:{index}: memoryFraction {target.memory_fraction:g} × {_gib(total)} = {_gib(cap)}, "
        f"{_gib(card.memory_free_bytes)} free now"
        + (f" (+{_gib(ours)} held by taogpud's workers)" if ours else "")
    )
    if others:
        text += "; other processes hold " + ", ".join(_holder(p) for p in others)
    if cap <= usable:
        return "pass", text
    fits = max(0.0, usable / total) if total else 0.0
    short = f"the cap is {_gib(cap - usable)} more than can be had now (fraction ≤ {fits:.2f} fits)"
    return "warn", f"{text}; {short}"


def _holder(process: nvml.GpuProcess) -> str:
    used = _gib(process.used_bytes) if process.used_bytes is not None else "? GiB"
    return f"pid {process.pid}{f' ({process.name})' if process.name else ''} {used}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


# --- WSL ----------------------------------------------------------------------------------------


def check_wsl(proc_version: str, target: Target) -> Check:
    """WSL2 works (through the Windows driver, about 4 % slower); WSL1 has no GPU."""
    name = "wsl"
    text = proc_version.lower()
    if "microsoft" not in text:
        return Check(name, "pass", Text("not WSL (a native Linux kernel)"))
    if "wsl2" in text or "microsoft-standard" in text:
        return Check(
            name,
            "pass",
            Text(
                "WSL2: GPU work goes through the Windows driver; about 4 % below native Linux "
                "is normal"
            ),
            Text(
                "install the NVIDIA driver on Windows only, never a Linux driver inside WSL "
                "(libcuda comes from /usr/lib/wsl/lib)"
            ),
        )
    return Check(
        name,
        target.severity(),
        Text("WSL1: it has no GPU access"),
        Text("convert the distribution: `wsl --set-version <distro> 2` (from Windows)"),
    )
