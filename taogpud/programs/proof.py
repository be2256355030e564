"""What NVML saw a program do with its lease: the proof, and the verdicts it leads to.

The daemon samples NVML while programs hold CUDA leases (jobs/programs.py, Programs.observe); each
sample is one `nvml.Inventory` and the pids of each program's processes (the program and
its descendants: `process_tree`). `ProgramProof` is plain data fed by those samples, so the
tests feed it a fake NVML's inventories. It says, once each:

- `gpu_memory_exceeded`: its processes hold more of a device than its reservation (--mem);
- `never_used_gpu`: gpu.firstUseTimeoutS passed and it was seen on none of its GPUs: the
  setup guide's pitfall, a framework that found no CUDA and computes on the CPU;
- `unassigned_gpu`: it was seen on a GPU it was not given.

NVML lists host pids: a program in a container with its own pid namespace is never matched,
and the evidence says how many samples were taken, never guesses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from taogpud.observability.nvml import GpuDevice, Xid

TORCH_CHECK = "python3 -c 'import torch; print(torch.cuda.is_available())'"


class Verdict(NamedTuple):
    code: str  # gpu_memory_exceeded | never_used_gpu | unassigned_gpu
    message: str
    hint: str = ""


@dataclass
class ProgramProof:
    """One program's lease, as NVML saw it over its samples."""

    uuids: tuple[str, ...]  # the GPUs it was given
    labels: tuple[str, ...]  # "gpu:0", beside each uuid
    reserved_bytes: tuple[int, ...]  # its reservation on each
    first_use_timeout_s: float
    started_s: float  # monotonic, when the program was reported started
    first_seen_s: float | None = None
    seen_on: set[str] = field(default_factory=set)  # uuids of its GPUs it was seen on
    seen_elsewhere: set[str] = field(default_factory=set)  # uuids it was not given
    peak_bytes: dict[str, int] = field(default_factory=dict)  # per GPU, its processes summed
    utilization_peak: int | None = None
    utilization_samples: int = 0
    utilization_first_s: float | None = None  # monotonic: the window its figures cover
    utilization_last_s: float | None = None
    samples: int = 0
    energy_first_mj: dict[str, int] = field(default_factory=dict)
    energy_last_mj: dict[str, int] = field(default_factory=dict)
    said: set[str] = field(default_factory=set)  # verdict codes given already: each once
    xids: list[dict[str, Any]] | None = None  # None: XIDs not watched (no NVML events here)

    def observe(self, devices: Sequence[GpuDevice], pids: set[int], now_s: float) -> list[Verdict]:
        """One NVML sample; the verdicts it newly leads to."""
        self.samples += 1
        verdicts = [v for device in devices for v in self._device(device, pids, now_s)]
        waited = now_s - self.started_s
        if not self.seen_on and waited >= self.first_use_timeout_s:
            verdicts.append(self._never_used())
        fresh = [v for v in verdicts if v.code not in self.said]
        self.said.update(v.code for v in fresh)
        return fresh

    def _device(self, device: GpuDevice, pids: set[int], now_s: float) -> list[Verdict]:
        used = [p.used_bytes or 0 for p in device.processes if p.pid in pids]
        uuid = device.uuid or ""
        if uuid not in self.uuids:
            if used:
                self.seen_elsewhere.add(uuid)
                return [self._elsewhere(device)]
            return []
        self._sample(device, uuid, now_s)
        if not used:
            return []
        self.seen_on.add(uuid)
        if self.first_seen_s is None:
            self.first_seen_s = now_s
        total = sum(used)
        self.peak_bytes[uuid] = max(self.peak_bytes.get(uuid, 0), total)
        reserved = self.reserved_bytes[self.uuids.index(uuid)]
        return [self._over(device, total, reserved)] if total > reserved else []

    def _sample(self, device: GpuDevice, uuid: str, now_s: float) -> None:
        if device.utilization_percent is not None:
            if self.utilization_last_s != now_s:  # one sample of several GPUs: one time
                self.utilization_samples += 1
            if self.utilization_first_s is None:
                self.utilization_first_s = now_s
            self.utilization_last_s = now_s
            peak = self.utilization_peak
            self.utilization_peak = max(peak or 0, device.utilization_percent)
        if device.energy_mj is not None:
            self.energy_first_mj.setdefault(uuid, device.energy_mj)
            self.energy_last_mj[uuid] = device.energy_mj

    def record_xids(self, xids: Sequence[Xid], now_s: float) -> list[dict[str, Any]]:
        """The XIDs NVML reported since the last sample (none: watched, none seen); those on
        its GPUs are its evidence, and returned, to be logged."""
        mine = [self._xid(xid, now_s) for xid in xids if xid.uuid in self.uuids]
        self.xids = (self.xids or []) + mine
        return mine

    def _xid(self, xid: Xid, now_s: float) -> dict[str, Any]:
        return {
            "xid": xid.code,
            "gpu": self.labels[self.uuids.index(xid.uuid or "")],
            "uuid": xid.uuid,
            "at": xid.at_utc,
            "seen_after_s": _seconds(now_s, self.started_s),
        }

    def _over(self, device: GpuDevice, used: int, reserved: int) -> Verdict:
        label = self.labels[self.uuids.index(device.uuid or "")]
        return Verdict(
            "gpu_memory_exceeded",
            f"the program's processes held {mib(used)} of {label}, over its reservation of "
            f"{mib(reserved)} (--mem): stopped so that no one else's job runs out of memory",
            "ask for more with --mem, or have the program use less (CuPy reads "
            "CUPY_GPU_MEMORY_LIMIT, which the lease sets; PyTorch: "
            "torch.cuda.set_per_process_memory_fraction)",
        )

    def _never_used(self) -> Verdict:
        given = ", ".join(self.labels)
        return Verdict(
            "never_used_gpu",
            f"the program has not opened any GPU it was given ({given}) in "
            f"{self.first_use_timeout_s:g} s (gpu.firstUseTimeoutS): it is computing on the "
            "CPU, or not at all",
            f"check that its framework sees CUDA in that environment, e.g. {TORCH_CHECK} "
            "(False: a CPU-only build, or no driver in that environment)",
        )

    def _elsewhere(self, device: GpuDevice) -> Verdict:
        return Verdict(
            "unassigned_gpu",
            f"the program was seen on GPU {device.index} ({device.uuid}), which its lease "
            f"does not hold (it holds {', '.join(self.labels)})",
            "leave CUDA_VISIBLE_DEVICES as the lease sets it",
        )

    def evidence(self) -> dict[str, Any]:
        """The job record's `evidence`: what NVML saw, in the keys the built-in tasks use."""
        energy = [self.energy_last_mj[u] - self.energy_first_mj[u] for u in self.energy_last_mj]
        return {
            "gpu_uuids": list(self.uuids),
            "pid_seen_on_gpu": bool(self.seen_on),
            "seen_on": [self.labels[self.uuids.index(u)] for u in sorted(self.seen_on)],
            "seen_on_unassigned": sorted(self.seen_elsewhere),
            "first_seen_after_s": _seconds(self.first_seen_s, self.started_s),
            "peak_memory_bytes": sum(self.peak_bytes.values()),
            "reserved_bytes": sum(self.reserved_bytes),
            "utilization_peak_percent": self.utilization_peak,
            "utilization_samples": self.utilization_samples,
            "utilization_first_after_s": _seconds(self.utilization_first_s, self.started_s),
            "utilization_last_after_s": _seconds(self.utilization_last_s, self.started_s),
            "utilization_interval_s": self._interval(),
            "nvml_samples": self.samples,
            "energy_j": sum(energy) / 1000 if energy else None,
        } | ({} if self.xids is None else {"xid_errors": self.xids})

    def _interval(self) -> float | None:
        """The mean time between its utilisation samples, as they were taken."""
        first, last, count = (
            self.utilization_first_s,
            self.utilization_last_s,
            self.utilization_samples,
        )
        if first is None or last is None or count < 2:
            return None
        return round((last - first) / (count - 1), 3)


def children_now(proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Every process's children, as /proc shows them now (read once per sample)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            parent = _ppid(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    return children


def process_tree(roots: Iterable[int], children: dict[int, list[int]]) -> set[int]:
    """`roots` and every process descending from them."""
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def _ppid(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def _seconds(at: float | None, since: float) -> float | None:
    return None if at is None else round(at - since, 3)
