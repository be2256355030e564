"""The NumPy backend: a real backend on the host's CPUs (for fallback, CI and tests).

numpy is imported when a backend is built, not when this module is: the pool
imports `blas_thread_env` in the daemon, which must stay free of numpy.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec

# Every BLAS / OpenMP runtime NumPy may link reads one of these, once, when it loads.
_THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def blas_thread_env(thread_num: int) -> dict[str, str]:
    """Environment that caps BLAS/OpenMP at `thread_num` threads; apply before spawn."""
    if thread_num < 1:
        raise ValueError(f"thread_num must be at least 1, got {thread_num}")
    return dict.fromkeys(_THREAD_ENV_VARS, str(thread_num))


class CpuBackend(Backend):
    """NumPy on the host. Slots share the process; there is no stream to bind."""

    name = "cpu"
    computes_in_host_memory = True

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        if "numpy" not in sys.modules:
            # The pool sets these before spawn; this only helps a worker started another way.
            for key, value in blas_thread_env(spec.thread_num).items():
                os.environ.setdefault(key, value)
        import numpy

        self.xp = numpy

    def warm(self) -> DeviceInfo:
        started = time.perf_counter()
        extra = {"fallback_reason": self.spec.fallback_reason} if self.spec.fallback_reason else {}
        total = host_memory_bytes()
        name = cpu_model_name()
        warmup_ms = (time.perf_counter() - started) * 1000
        return DeviceInfo(
            backend=self.name,
            device=f"cpu:{self.spec.index}",
            index=self.spec.index,
            name=name,
            memory_total_bytes=total,
            memory_cap_bytes=int(total * self.spec.memory_fraction),
            warmup_ms=warmup_ms,
            extra=extra,
        )

    def is_out_of_memory(self, exc: BaseException) -> bool:
        # numpy's _ArrayMemoryError ("Unable to allocate …") subclasses MemoryError.
        return isinstance(exc, MemoryError)


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """'AMD EPYC 7763 64-Core Processor'; the machine type where the kernel names none (arm)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
