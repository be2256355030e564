"""The interface every compute backend implements inside a worker process.

A backend owns one device. The worker calls `warm()` once before it reports
ready, then runs jobs through `run_job`-style calls from `stream_count` threads,
each thread holding one slot (a CUDA stream on cuda, nothing on cpu).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
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


class Backend(ABC):
    """One device, as seen from inside its worker process."""

    name: str  # "cpu" | "cuda"
    xp: ModuleType  # numpy or cupy: the namespace task bodies are written against

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    @abstractmethod
    def warm(self) -> DeviceInfo:
        """Select the device, size the pool, compile the built-in kernels. Runs once."""

    @contextlib.contextmanager
    def slot(self, slot_index: int) -> Iterator[None]:
        """Run the enclosed job on this slot's stream. The cpu backend has nothing to bind."""
        yield

    def to_device(self, host: Any) -> Any:
        return self.xp.asarray(host)

    def to_host(self, array: Any) -> Any:
        return array

    def synchronize(self) -> None:  # noqa: B027 - optional hook: the cpu backend has nothing to wait for
        """Wait for the slot's work to finish, so timings measure the work itself."""

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def release_memory(self) -> None:  # noqa: B027 - optional hook: numpy frees on its own
        """Give cached blocks back after an out-of-memory error; the worker stays warm."""

    def set_memory_fraction(self, fraction: float) -> None:  # noqa: B027 - optional hook
        """A reload changed the cap. CUDA applies it in each slot thread before the next job;
        the cpu backend has no pool, its cap is the scheduler's admission alone."""

    def evidence(self) -> dict[str, Any]:
        """Per-job proof of where it ran (NVML pid and utilisation on cuda)."""
        return {}
