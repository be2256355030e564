"""What the NVIDIA driver says about this host's GPUs (NVML, via nvidia-ml-py's `pynvml`).

A leaf: nothing central depends on it. `inventory()` never raises: without a driver (or
without nvidia-ml-py) it returns no devices and the reason, in one sentence.

NVML numbers devices in PCI bus order, which is CUDA's order only under
CUDA_DEVICE_ORDER=PCI_BUS_ID (the workers set it); match devices by UUID where it matters.
Process ids are the host's: inside a container's PID namespace they do not match ours.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from taogpud.host.install_hints import install_hint

T = TypeVar("T")

# a job's evidence key (backends/cuda/evidence.py) → the nvidia-smi query that reads the same
# fact on the host: `taogpuctl show --evidence` and the MCP tools print them side by side
NVIDIA_SMI = {
    "gpu_uuid": "nvidia-smi --query-gpu=uuid --format=csv,noheader",
    "pci_bus_id": "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader",
    "pid_seen_on_gpu": "nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
    "gpu_pids": "nvidia-smi --query-compute-apps=pid --format=csv,noheader",
    "utilization_peak_percent": "nvidia-smi --query-gpu=utilization.gpu --format=csv -lms 100",
    "energy_j": "nvidia-smi --query-gpu=total_energy_consumption --format=csv",
    "xid_errors": "journalctl -k | grep -i xid  (or: dmesg | grep -i xid)",
}


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where the driver does not say (some containers, MIG)
    name: str | None  # /proc/PID/comm where this host can read it


@dataclass(frozen=True)
class GpuDevice:
    index: int  # NVML's index: PCI bus order
    name: str
    uuid: str | None
    pci_bus_id: str | None
    compute_capability: str | None  # "8.9"
    memory_total_bytes: int
    memory_free_bytes: int
    memory_used_bytes: int
    utilization_percent: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    temperature_c: int | None = None  # the GPU die (NVML_TEMPERATURE_GPU)
    power_w: float | None = None  # the board's draw now
    energy_mj: int | None = None  # total energy since the driver loaded, mJ (Volta and later)

    @property
    def arch(self) -> str | None:
        """The cuda_arch this card wants: compute capability 8.9 → "sm_89"."""
        if not self.compute_capability:
            return None
        return "sm_" + self.compute_capability.replace(".", "")


@dataclass(frozen=True)
class Inventory:
    devices: tuple[GpuDevice, ...] = ()
    driver_version: str | None = None  # "580.65.06"
    cuda_driver_version: str | None = None  # the CUDA version the driver supports: "13.0"
    reason: str | None = None  # why there is nothing to say; None when NVML answered
    problems: tuple[str, ...] = field(default_factory=tuple)  # per-field failures, for the log

    @property
    def available(self) -> bool:
        return self.reason is None


def inventory(read_process_names: bool = True) -> Inventory:
    """Every device NVML sees, with memory and compute processes; empty with a reason."""
    pynvml = _import_pynvml()
    if pynvml is None:
        return Inventory(reason=f"nvidia-ml-py is not installed: {install_hint('nvml')}")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Inventory(reason=_init_problem(pynvml, exc))
    try:
        return _read(pynvml, read_process_names)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _import_pynvml() -> Any:
    """nvidia-ml-py's module, or None where it is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated `pynvml` shim warns
            import pynvml
    except ImportError:
        return None
    return pynvml


@dataclass(frozen=True)
class Xid:
    """One XID error the driver reported (NVML's XidCriticalError event): the same event the
    kernel logs as `NVRM: Xid (PCI:…): 79, …` (`journalctl -k | grep -i xid`)."""

    uuid: str | None
    index: int | None  # NVML's index: PCI bus order
    code: int  # the XID number: 79 fell off the bus, 48 a double-bit ECC error, 13 a bad access
    at: float  # time.time() when the daemon read it: NVML's event carries no time

    @property
    def at_utc(self) -> str:
        """`at` as the evidence says it: "2026-12-04T21:00:00.000Z"."""
        at = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds")
        return at.replace("+00:00", "Z")


class XidWatch:
    """NVML's XID events, registered on every device that reports them, held open while
    programs hold CUDA leases and read at each sample (never waiting). `open()` returns None
    where there is nothing to watch (no nvidia-ml-py, no driver, no device reporting XIDs):
    the caller records no XIDs and says nothing."""

    MAX_PER_DRAIN = 1000  # a storm of events is read over several samples, never in one loop

    def __init__(self, pynvml: Any, event_set: Any) -> None:
        self._nvml = pynvml
        self._set = event_set

    @classmethod
    def open(cls, uuids: Collection[str] | None = None) -> XidWatch | None:
        """The watch on every device, or on those of `uuids` alone (a CUDA worker's own)."""
        pynvml = _import_pynvml()
        if pynvml is None:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        watch = cls._registered(pynvml, uuids)
        if watch is None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
        return watch

    @classmethod
    def _registered(cls, pynvml: Any, uuids: Collection[str] | None) -> XidWatch | None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError:
            return None
        registered = [_register_xids(pynvml, i, event_set, uuids) for i in range(count)]
        if any(registered):
            return cls(pynvml, event_set)
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlEventSetFree(event_set)
        return None

    def drain(self) -> list[Xid]:
        """The XIDs reported since the last read, oldest first."""
        found: list[Xid] = []
        for _ in range(self.MAX_PER_DRAIN):
            try:
                event = self._nvml.nvmlEventSetWait_v2(self._set, 0)
            except self._nvml.NVMLError:  # NVML_ERROR_TIMEOUT: none left
                break
            if event.eventType & self._nvml.nvmlEventTypeXidCriticalError:
                found.append(self._xid(event))
        return found

    def _xid(self, event: Any) -> Xid:
        def ask(call: Callable[[Any], T]) -> T | None:
            try:
                return call(event.device)
            except self._nvml.NVMLError:
                return None

        uuid = _text(ask(self._nvml.nvmlDeviceGetUUID))
        index = ask(self._nvml.nvmlDeviceGetIndex)
        return Xid(uuid, index, int(event.eventData), time.time())

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlEventSetFree(self._set)
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _register_xids(pynvml: Any, index: int, event_set: Any, uuids: Collection[str] | None) -> bool:
    """Whether device `index` (one of `uuids`, if given) reports XIDs into `event_set` now
    (some do not: NotSupported)."""
    xid = pynvml.nvmlEventTypeXidCriticalError
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        if uuids is not None and _text(pynvml.nvmlDeviceGetUUID(handle)) not in uuids:
            return False
        if not pynvml.nvmlDeviceGetSupportedEventTypes(handle) & xid:
            return False
        pynvml.nvmlDeviceRegisterEvents(handle, xid, event_set)
    except pynvml.NVMLError:
        return False
    return True


def cuda_order(inventory: Inventory, visible: str | None) -> list[GpuDevice]:
    """The cards as CUDA numbers them: NVML's PCI order, narrowed and reordered by
    CUDA_VISIBLE_DEVICES (indices or GPU-UUID prefixes; CUDA stops at the first it cannot
    match, and so does this)."""
    cards = list(inventory.devices)
    if visible is None:
        return cards
    picked: list[GpuDevice] = []
    for item in (entry.strip() for entry in visible.split(",")):
        if item.isdigit():
            match = cards[int(item)] if int(item) < len(cards) else None
        else:
            match = next((c for c in cards if item and c.uuid and c.uuid.startswith(item)), None)
        if match is None:
            break
        picked.append(match)
    return picked


def cuda_version(encoded: int) -> str:
    """12040 → "12.4", as NVML and the CUDA runtime encode versions."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


# NVML's start-up failures, as one sentence each
_INIT_PROBLEMS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded (`lsmod | grep nvidia`)",
    "NVMLError_NoPermission": "no permission to open the GPU device nodes (/dev/nvidia*)",
    "NVMLError_LibRmVersionMismatch": (
        "the NVIDIA driver's kernel module and library differ in version: reboot after a "
        "driver update"
    ),
}


def _init_problem(pynvml: Any, exc: Exception) -> str:
    for name, sentence in _INIT_PROBLEMS.items():
        kind = getattr(pynvml, name, None)
        if isinstance(kind, type) and isinstance(exc, kind):
            return sentence
    return f"NVML failed to start: {exc}"


def _read(pynvml: Any, read_process_names: bool) -> Inventory:
    problems: list[str] = []

    def attempt(what: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except pynvml.NVMLError as exc:
            problems.append(f"{what}: {exc}")
            return None

    driver = attempt("driver version", pynvml.nvmlSystemGetDriverVersion)
    cuda = attempt("CUDA driver version", pynvml.nvmlSystemGetCudaDriverVersion)
    count = attempt("device count", pynvml.nvmlDeviceGetCount) or 0
    devices = []
    for index in range(count):
        device = _device(pynvml, index, attempt, read_process_names)
        if device is not None:
            devices.append(device)
    return Inventory(
        devices=tuple(devices),
        driver_version=_text(driver),
        cuda_driver_version=cuda_version(cuda) if cuda else None,
        problems=tuple(problems),
    )


def _device(
    pynvml: Any, index: int, attempt: Callable[..., Any], read_process_names: bool
) -> GpuDevice | None:
    handle = attempt(f"device {index}", lambda: pynvml.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        return None
    memory = attempt(f"device {index} memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    capability = attempt(
        f"device {index} compute capability",
        lambda: pynvml.nvmlDeviceGetCudaComputeCapability(handle),
    )
    pci = attempt(f"device {index} PCI", lambda: pynvml.nvmlDeviceGetPciInfo(handle))
    utilization = attempt(
        f"device {index} utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)
    )
    running = attempt(
        f"device {index} processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    )
    temperature = attempt(
        f"device {index} temperature", lambda: pynvml.nvmlDeviceGetTemperature(handle, 0)
    )
    power_mw = attempt(f"device {index} power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    energy_mj = attempt(
        f"device {index} energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    )
    return GpuDevice(
        index=index,
        name=_text(attempt(f"device {index} name", lambda: pynvml.nvmlDeviceGetName(handle)))
        or f"GPU {index}",
        uuid=_text(attempt(f"device {index} UUID", lambda: pynvml.nvmlDeviceGetUUID(handle))),
        pci_bus_id=_text(getattr(pci, "busId", None)),
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        memory_total_bytes=int(getattr(memory, "total", 0)),
        memory_free_bytes=int(getattr(memory, "free", 0)),
        memory_used_bytes=int(getattr(memory, "used", 0)),
        utilization_percent=getattr(utilization, "gpu", None),
        processes=tuple(_process(p, read_process_names) for p in running or ()),
        temperature_c=int(temperature) if isinstance(temperature, int) else None,
        power_w=power_mw / 1000 if isinstance(power_mw, int) else None,
        energy_mj=int(energy_mj) if isinstance(energy_mj, int) else None,
    )


def _process(entry: Any, read_name: bool) -> GpuProcess:
    pid = int(entry.pid)
    used = getattr(entry, "usedGpuMemory", None)
    # NVML reports "not available" as None or as a huge sentinel, depending on the binding
    used_bytes = int(used) if isinstance(used, int) and 0 <= used < 1 << 60 else None
    return GpuProcess(pid=pid, used_bytes=used_bytes, name=process_name(pid) if read_name else None)


def process_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
