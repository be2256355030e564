"""The interface every compute backend implements inside a worker process.

A backend owns one device. The worker calls `warm()` once before it reports
ready, then runs jobs through `run_job`-style calls from `stream_count` threads,
each thread holding one slot (a CUDA stream on cuda, nothing on cpu).
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    """What a worker found when it started: this is what every job trace repeats."""

    backend: str  # "cpu" | "cuda"
    device: str  # "cpu:0", "gpu:1"
    index: int
    name: str  # "AMD EPYC ...", "NVIDIA H200"
    uuid: str | None = None  # GPU UUID from the driver; None on cpu
    compute_capability: str | None = None  # "9.0"; None on cpu
    memory_total_bytes: int = 0
    memory_cap_bytes: int = 0  # memoryFraction × total: admission and the pool limit
    warmup_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": self.device,
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "compute_capability": self.compute_capability,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_cap_bytes": self.memory_cap_bytes,
            "warmup_ms": self.warmup_ms,
            **self.extra,
        }


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a spawned worker needs, picklable, decided by the daemon."""

    backend: str  # "cpu" | "cuda"
    index: int  # device index (CUDA index in PCI bus order, or the cpu device number)
    stream_count: int
    thread_num: int
    memory_fraction: float
    pool_size_mb: int
    auto_grow: bool
    cuda_arch: str
    enable_profiling: bool
    fallback_reason: str | None = None  # set when cpu workers stand in for cuda
    platform_index: int = 0  # opencl: the platform whose device `index` names


class Backend(ABC):
    """One device, as seen from inside its worker process."""

    name: str  # "cpu" | "cuda" | "opencl"
    xp: ModuleType  # numpy or cupy: the namespace task bodies are written against
    # Whether xp arrays live in host memory: a task may then compute its outputs straight
    # into a client's memory (TaskContext.output); on a device they land there by d2h.
    computes_in_host_memory = False
    # Whether each slot holds kernel objects of its own (opencl), so that a warm-up runs in
    # every slot; else the kernels are the process's and one slot's warm-up warms them all.
    kernels_per_slot = False

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    @abstractmethod
    def warm(self) -> DeviceInfo:
        """Select the device and size its memory pool; what this backend builds itself is
        built. Runs once. The tasks layer then runs every body once (tasks/warmup.py)."""

    @contextlib.contextmanager
    def slot(self, slot_index: int) -> Iterator[None]:
        """Run the enclosed job on this slot's stream. The cpu backend has nothing to bind."""
        yield

    def to_device(self, host: Any) -> Any:
        return self.xp.asarray(host)

    def to_host(self, array: Any, out: Any = None) -> Any:
        """The array in host memory; with `out` (a host ndarray of its shape and dtype),
        written into it: an output's place in a client's memory."""
        if out is None:
            return array
        out[...] = array
        return out

    def synchronize(self) -> None:  # noqa: B027 - optional hook: the cpu backend has nothing to wait for
        """Wait for the slot's work to finish, so timings measure the work itself."""

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def host_pinning(self) -> Callable[[int, int, bool], Callable[[], None]] | None:
        """How this backend pins host memory for fast copies to its device: a function of
        (address, nbytes, read_only) that registers it and returns its unregister, raising
        when it cannot (pool/pinning.py). None: nothing to pin (cpu, opencl)."""
        return None

    def task_runtime(self) -> Any:
        """What a task body written for this backend needs beyond `xp` (opencl: the slot's
        queue, allocator and built kernels); None where `xp` is enough."""
        return None

    def release_memory(self) -> None:  # noqa: B027 - optional hook: numpy frees on its own
        """Give cached blocks back after an out-of-memory error; the worker stays warm."""

    def set_memory_fraction(self, fraction: float) -> None:  # noqa: B027 - optional hook
        """A reload changed the cap. CUDA applies it in each slot thread before the next job;
        the cpu backend has no pool, its cap is the scheduler's admission alone."""

    @contextlib.contextmanager
    def observe(self) -> Iterator[dict[str, Any]]:
        """Wraps one job; the dict is filled, when the job ends, with the proof of where it
        ran (on cuda: NVML's view of the worker's pid and the GPU's utilisation)."""
        yield {}

    def phase_clock(self) -> PhaseClock:
        """Times one job's phases in its slot: h2d, kernel, d2h."""
        return PhaseClock(self.synchronize)

    sticky_error_code = "device_unusable"  # the job's error code when sticky_error() answers

    def sticky_error(self, exc: BaseException) -> str | None:
        """Why `exc` leaves this worker's device unusable (a sticky CUDA error, a lost OpenCL
        device), or None. The job fails with `sticky_error_code` and the worker exits, to be
        respawned."""
        return None


class PhaseClock:
    """Host clock after a synchronize at each mark: the cpu backend's timings (and cuda's
    without enable_profiling, which then skips the marks). CUDA events replace it on cuda."""

    def __init__(self, synchronize: Callable[[], None]) -> None:
        self._synchronize = synchronize
        self._last = time.perf_counter()
        self._timings: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """The phase named `phase` (e.g. "h2d_ms") ends now."""
        self._synchronize()
        now = time.perf_counter()
        self._timings[phase] = (now - self._last) * 1e3
        self._last = now

    def timings_ms(self) -> dict[str, float]:
        return dict(self._timings)
