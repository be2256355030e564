"""Per-job proof, from NVML, that a CUDA job ran where the job record says (DESIGN §3).

Inside a cuda worker: `NvmlWatch` finds the NVML device with the worker's CUDA PCI bus id
(CUDA_DEVICE_ORDER=PCI_BUS_ID makes the numbering agree, but the bus id is what both name
alike), a `UtilizationSampler` thread reads its utilisation while jobs run (only then), and
at the end of each job `job_evidence` turns what NVML said into the record's `evidence`.
`job_evidence` and the sampler take plain data and a reader function: tests feed them.

NVML lists host pids: in a container with its own pid namespace the worker's pid is not
among them, and the evidence says so (`pid_seen_on_gpu: false` with a note), never guesses.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from taogpud.install_hints import install_hint

SAMPLE_PERIOD_S = 0.05  # NVML's own utilisation window is 1/6 s to 1 s; faster adds nothing
PIDS_SHOWN = 16


def normalise_bus_id(bus_id: str) -> str:
    """'00000000:17:00.0' (NVML) and '0000:17:00.0' (CUDA) → '0000:17:00.0', lower case."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    return f"{int(domain or '0', 16):04x}:{rest}"


@dataclass
class JobWindow:
    """The utilisation samples seen while one job ran."""

    started_s: float = field(default_factory=time.monotonic)
    peak_percent: int | None = None
    samples: int = 0

    def add(self, percent: int | None) -> None:
        if percent is None:
            return
        self.samples += 1
        if self.peak_percent is None or percent > self.peak_percent:
            self.peak_percent = percent


class UtilizationSampler:
    """One light thread per worker, reading `read()` every `period_s` while a job runs.

    Every open window gets every sample; the thread ends when the last window closes, so
    an idle worker makes no NVML calls. The thread is started and retired under one lock,
    so a job that begins as the last one ends never finds the sampler half gone."""

    def __init__(self, read: Callable[[], int | None], period_s: float = SAMPLE_PERIOD_S) -> None:
        self._read = read
        self._period_s = period_s
        self._lock = threading.Lock()
        self._open: dict[int, JobWindow] = {}
        self._idle = threading.Event()  # set when the last window closes: the thread ends early
        self._thread: threading.Thread | None = None

    def begin(self) -> JobWindow:
        window = JobWindow()
        window.add(self._safe_read())  # a job shorter than one period still gets a sample
        with self._lock:
            self._open[id(window)] = window
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
                self._thread.start()
        return window

    def end(self, window: JobWindow) -> JobWindow:
        window.add(self._safe_read())  # covers the job's last moments (NVML averages backwards)
        with self._lock:
            self._open.pop(id(window), None)
            if not self._open:
                self._idle.set()
        return window

    @property
    def running(self) -> bool:
        with self._lock:
            return self._thread is not None

    def _loop(self) -> None:
        while True:
            idle = self._idle.wait(self._period_s)
            percent = None if idle else self._safe_read()
            with self._lock:
                if not self._open:
                    self._thread = None
                    return
                for window in self._open.values():
                    window.add(percent)

    def _safe_read(self) -> int | None:
        try:
            return self._read()
        except Exception:  # NVML hiccups must never fail a job; the sample is simply missing
            return None


def job_evidence(
    *,
    worker_pid: int,
    cuda_uuid: str | None,
    nvml_uuid: str | None,
    pci_bus_id: str | None,
    gpu_pids: Iterable[int] | None,
    window: JobWindow,
) -> dict[str, Any]:
    """The job record's `evidence` from what NVML said about the worker's device."""
    pids = sorted(set(gpu_pids)) if gpu_pids is not None else None
    seen = pids is not None and worker_pid in pids
    uuid_matches = nvml_uuid is not None and nvml_uuid == cuda_uuid
    evidence: dict[str, Any] = {
        "source": "nvml",
        "gpu_uuid": nvml_uuid,
        "pci_bus_id": pci_bus_id,
        "uuid_matches_cuda": uuid_matches,
        "worker_pid": worker_pid,
        "pid_seen_on_gpu": seen,
        "gpu_pids": pids[:PIDS_SHOWN] if pids is not None else None,
        "utilization_peak_percent": window.peak_percent,
        "utilization_samples": window.samples,
    }
    evidence["verdict"], note = _verdict(uuid_matches, seen, pids, cuda_uuid, nvml_uuid)
    if note:
        evidence["note"] = note
    return evidence


def _verdict(
    uuid_matches: bool,
    seen: bool,
    pids: list[int] | None,
    cuda_uuid: str | None,
    nvml_uuid: str | None,
) -> tuple[str, str | None]:
    if not uuid_matches:
        return "uuid_mismatch", (
            f"CUDA names the device {cuda_uuid} but NVML's device on the same PCI bus id is "
            f"{nvml_uuid}: CUDA and NVML disagree about which GPU this is"
        )
    if seen:
        return "confirmed", None
    if pids is None:
        return "pid_unknown", "NVML did not list the GPU's compute processes"
    return "pid_not_seen", (
        "NVML does not list the worker's pid on this GPU; inside a container NVML shows host "
        "pids, so compare `nvidia-smi` on the host"
    )


def unavailable(reason: str) -> dict[str, Any]:
    return {"source": "nvml", "verdict": "unavailable", "reason": reason}


class NvmlWatch:
    """NVML, opened once in a cuda worker, on the device with the worker's PCI bus id."""

    def __init__(self, pci_bus_id: str) -> None:
        self.pci_bus_id = pci_bus_id
        self.reason: str | None = None  # why there is no evidence; None when NVML answers
        self.uuid: str | None = None
        self._pynvml: Any = None
        self._handle: Any = None
        self._open()

    def _open(self) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # the deprecated `pynvml` shim
                import pynvml
        except ImportError:
            self.reason = f"nvidia-ml-py is not installed: {install_hint('nvml')}"
            return
        try:
            pynvml.nvmlInit()
            self._handle = _handle_by_bus_id(pynvml, self.pci_bus_id)
            if self._handle is not None:
                self.uuid = _text(pynvml.nvmlDeviceGetUUID(self._handle))
        except pynvml.NVMLError as exc:  # evidence is then "unavailable"; the worker still runs
            self._handle, self.reason = None, f"NVML failed: {exc}"
            return
        if self._handle is None:
            self.reason = f"NVML lists no GPU on PCI bus {self.pci_bus_id}"
            return
        self._pynvml = pynvml

    @property
    def available(self) -> bool:
        return self._handle is not None and self.reason is None

    def utilization_percent(self) -> int | None:
        return int(self._pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def compute_pids(self) -> list[int] | None:
        try:
            running = self._pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except self._pynvml.NVMLError:
            return None
        return [int(entry.pid) for entry in running]


def _handle_by_bus_id(pynvml: Any, pci_bus_id: str) -> Any:
    wanted = normalise_bus_id(pci_bus_id)
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId) or ""
        if normalise_bus_id(bus_id) == wanted:
            return handle
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
