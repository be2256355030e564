"""Per-job proof, from NVML, that a CUDA job ran where the job record says (DESIGN §3).

Inside a cuda worker: `NvmlWatch` finds the NVML device with the worker's CUDA PCI bus id
(CUDA_DEVICE_ORDER=PCI_BUS_ID makes the numbering agree, but the bus id is what both name
alike), a `UtilizationSampler` thread reads its utilisation while jobs run (only then), and
at the end of each job `job_evidence` turns what NVML said into the record's `evidence`.
`job_evidence` and the sampler take plain data and reader functions: tests feed them.

What a utilisation figure can say: NVML's reading is the share of its last sample window
(1/6 s to 1 s, by product) in which a kernel ran, so a job shorter than that window can read
0 % on a busy GPU. The window is recorded beside the peak, and such a job's utilisation is
"too short to sample", never 0 %. The energy is NVML's total-energy counter of the whole
device across the job's span: jobs that overlapped it (counted) and other processes share it.

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

from taogpud.host.install_hints import install_hint
from taogpud.observability.nvml import Xid

SAMPLE_PERIOD_S = 0.05  # NVML's own utilisation window is 1/6 s to 1 s; faster adds nothing
NVML_WINDOW_S = (1 / 6, 1.0)  # what one utilisation reading averages over, by product
PIDS_SHOWN = 16
TOO_SHORT = "too short to sample"


def format_gpu_uuid(raw: Any) -> str | None:
    """16 raw bytes → 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx', the form nvidia-smi prints."""
    if not isinstance(raw, bytes | bytearray) or len(raw) != 16:
        return None
    text = raw.hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


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
    ended_s: float | None = None
    peak_percent: int | None = None
    samples: int = 0
    energy_start_mj: int | None = None  # NVML's total-energy counter at the start, mJ
    energy_end_mj: int | None = None
    overlapped: int = 0  # other jobs on this device that ran during some part of this one
    xids: list[Xid] | None = None  # those read while it ran; None: NVML reports none here

    @property
    def span_s(self) -> float:
        return (self.ended_s if self.ended_s is not None else time.monotonic()) - self.started_s

    @property
    def energy_j(self) -> float | None:
        if self.energy_start_mj is None or self.energy_end_mj is None:
            return None
        return (self.energy_end_mj - self.energy_start_mj) / 1000

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

    def __init__(
        self,
        read: Callable[[], int | None],
        period_s: float = SAMPLE_PERIOD_S,
        read_energy_mj: Callable[[], int | None] | None = None,
        read_xids: Callable[[], list[Xid]] | None = None,
    ) -> None:
        self._read = read
        self._read_energy_mj = read_energy_mj
        self._read_xids = read_xids  # nvml.XidWatch.drain: what the driver reported since
        self._period_s = period_s
        self._lock = threading.Lock()
        self._open: dict[int, JobWindow] = {}
        self._idle = threading.Event()  # set when the last window closes: the thread ends early
        self._thread: threading.Thread | None = None

    def begin(self) -> JobWindow:
        window = JobWindow(energy_start_mj=self._safe(self._read_energy_mj))
        window.add(self._safe(self._read))  # a job shorter than one period still gets a sample
        window.xids = None if self._read_xids is None else []
        xids = self._xids()  # reported before this job began: the others' alone
        with self._lock:
            self._spread(xids)
            for other in self._open.values():  # both share the device's energy from now on
                other.overlapped += 1
            window.overlapped = len(self._open)
            self._open[id(window)] = window
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
                self._thread.start()
        return window

    def end(self, window: JobWindow) -> JobWindow:
        window.add(self._safe(self._read))  # the job's last moments (NVML averages backwards)
        window.energy_end_mj = self._safe(self._read_energy_mj)
        window.ended_s = time.monotonic()
        xids = self._xids()
        with self._lock:
            self._spread(xids)
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
            percent = None if idle else self._safe(self._read)
            xids = [] if idle else self._xids()
            with self._lock:
                if not self._open:
                    self._thread = None
                    return
                self._spread(xids)
                for window in self._open.values():
                    window.add(percent)

    def _xids(self) -> list[Xid]:
        try:
            return self._read_xids() if self._read_xids is not None else []
        except Exception:  # like any NVML hiccup: never a job's failure
            return []

    def _spread(self, xids: list[Xid]) -> None:
        """XIDs the driver reported go to every job open on the device (under the lock)."""
        for window in self._open.values():
            if window.xids is not None:
                window.xids.extend(xids)

    @staticmethod
    def _safe(read: Callable[[], int | None] | None) -> int | None:
        if read is None:
            return None
        try:
            return read()
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
        **utilization(window),
        **energy(window),
    }
    if window.xids is not None:
        evidence["xid_errors"] = [xid_entry(xid) for xid in window.xids]
    evidence["verdict"], note = _verdict(uuid_matches, seen, pids, cuda_uuid, nvml_uuid)
    if note:
        evidence["note"] = note
    return evidence


def xid_entry(xid: Xid) -> dict[str, Any]:
    """One XID as the evidence holds it (a program's adds its GPU's label: proof.py)."""
    return {"xid": xid.code, "uuid": xid.uuid, "at": xid.at_utc}


def utilization(window: JobWindow) -> dict[str, Any]:
    """The peak beside the window it was read over; a job shorter than NVML's longest
    window that read nothing is "too short to sample", not 0 %."""
    peak = window.peak_percent
    span_s = window.span_s
    fields: dict[str, Any] = {
        "utilization_peak_percent": peak,
        "utilization_samples": window.samples,
        "utilization_window_s": [round(bound, 3) for bound in NVML_WINDOW_S],
        "job_span_s": round(span_s, 4),
    }
    if not peak and span_s < NVML_WINDOW_S[1]:
        fields["utilization_peak_percent"] = TOO_SHORT
        fields["utilization_note"] = (
            f"the job ran {span_s * 1000:.1f} ms, less than NVML's utilisation window "
            f"({NVML_WINDOW_S[0]:.2f}-{NVML_WINDOW_S[1]:.0f} s): a reading of 0 says nothing"
        )
    return fields


def energy(window: JobWindow) -> dict[str, Any]:
    """The device's energy across the job's span, and who shares it."""
    joules = window.energy_j
    if joules is None:
        return {"energy_j": None}
    return {
        "energy_j": round(joules, 3),
        "energy_overlapping_jobs": window.overlapped,
        "energy_note": (
            "NVML's total-energy counter of the whole device over this job's span: the "
            f"{window.overlapped} job(s) on it that overlapped this one, and any other process "
            "on the GPU, share this figure"
        ),
    }


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

    def energy_mj(self) -> int | None:
        """mJ since the driver loaded (Volta and newer; NotSupported elsewhere: None)."""
        try:
            return int(self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except self._pynvml.NVMLError:
            return None

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
