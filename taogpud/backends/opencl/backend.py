"""The OpenCL backend (pyopencl): one device of one platform, one command queue per slot.

Warm-up creates the context and `stream_count` in-order queues, and has every slot's kernels
built by the `slot_kernels` it was given (the tasks layer's: tasks/opencl_kernels.py); the
tasks layer then runs each once in every slot (tasks/warmup.py), so the first job compiles
nothing. This package never imports the tasks. PoCL keeps its compiled kernels in
POCL_CACHE_DIR: the daemon points it at its cache directory (paths.kernel_cache_env), so a
restart builds from that cache.

Memory (memory.py): each slot allocates from its own buffer pool, and every pool of
the device counts against memoryFraction × its global memory. An allocation past that cap
raises DeviceMemoryCapExceeded (a MemoryError): the job fails with `out_of_device_memory`,
its buffers go back with it, and the worker stays warm.

The daemon never imports pyopencl: `probe` asks a child process first (PoCL aborts
the whole process when it cannot link a kernel).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec
from taogpud.backends.opencl.memory import DeviceMemoryBudget, SlotAllocator
from taogpud.backends.opencl.probe import build_log
from taogpud.errors import BackendUnavailable

if TYPE_CHECKING:
    from taogpud.backends.opencl.runtime import SlotKernels

# OpenCL status codes that mean the device or its context is gone for good: a fresh worker
# (a new context) is the only way back. -9999 is NVIDIA's code for a faulting kernel.
DEVICE_LOST_CODES = {
    -2: "DEVICE_NOT_AVAILABLE",
    -34: "INVALID_CONTEXT",
    -36: "INVALID_COMMAND_QUEUE",
}
NVIDIA_KERNEL_FAULT = -9999
# Codes that mean "no memory for this": the job's error, not the device's.
OUT_OF_MEMORY_CODES = {
    -4: "MEM_OBJECT_ALLOCATION_FAILURE",
    -5: "OUT_OF_RESOURCES",
    -6: "OUT_OF_HOST_MEMORY",
    -61: "INVALID_BUFFER_SIZE",
}


class OpenclBackend(Backend):
    """pyopencl on one OpenCL device; slots are in-order command queues."""

    name = "opencl"
    sticky_error_code = "opencl_device_lost"
    kernels_per_slot = True

    def __init__(self, spec: WorkerSpec, slot_kernels: SlotKernels | None = None) -> None:
        super().__init__(spec)
        import pyopencl.array

        self.xp = pyopencl.array  # the bodies for this backend are in tasks/opencl_kernels.py
        self._slot_kernels = slot_kernels  # builds each slot's kernels (the tasks layer's)
        self._local = threading.local()  # this thread's SlotRuntime
        self._slots: list[Any] = []
        self._device: Any = None
        self._budget = DeviceMemoryBudget(0, 0)
        self._total_bytes = 0

    def warm(self) -> DeviceInfo:
        from taogpud.backends.opencl.runtime import device_facts, has_fp64

        started = time.perf_counter()
        self._device = self._find_device()
        self._total_bytes = int(self._device.global_mem_size)
        cap = int(self._total_bytes * self.spec.memory_fraction)
        self._budget = DeviceMemoryBudget(cap, int(self._device.max_mem_alloc_size))
        self._slots = self._build_slots()
        facts = device_facts(self._device)
        extra = {
            **facts,
            "platform_index": self.spec.platform_index,
            "opencl_version": self._device.version.strip(),
            "driver_version": self._device.driver_version.strip(),
            "fp64": has_fp64(self._device),
            "max_alloc_bytes": self._budget.max_alloc_bytes,
        }
        return DeviceInfo(
            backend=self.name,
            device=f"opencl:{self.spec.index}",
            index=self.spec.index,
            name=facts["device_name"],
            memory_total_bytes=self._total_bytes,
            memory_cap_bytes=cap,
            warmup_ms=(time.perf_counter() - started) * 1000,
            extra=extra,
        )

    def _find_device(self) -> Any:
        """The configured device; the daemon's probe checked it, this says so again if not."""
        import pyopencl as cl

        platforms = cl.get_platforms()
        if self.spec.platform_index >= len(platforms):
            raise BackendUnavailable(
                f"OpenCL platform {self.spec.platform_index} does not exist "
                f"({len(platforms)} found)",
                "set backend.opencl.platform_index to one that `clinfo -l` lists",
            )
        devices = platforms[self.spec.platform_index].get_devices()
        if self.spec.index >= len(devices):
            raise BackendUnavailable(
                f"OpenCL device {self.spec.index} does not exist on platform "
                f"{self.spec.platform_index} ({len(devices)} devices)",
                "set backend.opencl.device_index to one that `clinfo -l` lists",
            )
        return devices[self.spec.index]

    def _build_slots(self) -> list[Any]:
        import pyopencl as cl

        from taogpud.backends.opencl.runtime import SlotRuntime

        context = cl.Context([self._device])
        count = self.spec.stream_count
        try:
            kernels = (
                self._slot_kernels(context, self._device, count)
                if self._slot_kernels is not None
                else [None] * count
            )
            queues = [cl.CommandQueue(context) for _ in range(count)]
            return [
                SlotRuntime(context, queue, SlotAllocator(queue, self._budget), slot_kernels)
                for queue, slot_kernels in zip(queues, kernels, strict=True)
            ]
        except cl.Error as exc:  # a driver that cannot build our kernels cannot run jobs
            raise BackendUnavailable(
                f"the OpenCL kernels failed to build on {self._device.name.strip()}: "
                f"{build_log(exc)}",
                "check the OpenCL driver (`clinfo`); for PoCL, check that `ld` (binutils) is "
                "installed",
            ) from exc

    @contextlib.contextmanager
    def slot(self, slot_index: int) -> Iterator[None]:
        self._local.runtime = self._slots[slot_index]
        try:
            yield
        finally:
            self._local.runtime = None

    def task_runtime(self) -> Any:
        return getattr(self._local, "runtime", None)

    def to_device(self, host: Any) -> Any:
        import numpy
        import pyopencl.array as cla

        runtime = self.task_runtime()
        contiguous = numpy.ascontiguousarray(host)
        return cla.to_device(runtime.queue, contiguous, allocator=runtime.allocator)

    def to_host(self, array: Any, out: Any = None) -> Any:
        import pyopencl.array as cla

        if isinstance(array, cla.Array):  # out: the read lands in a client's memory
            return array.get(queue=self.task_runtime().queue, ary=out)
        return super().to_host(array, out)

    def synchronize(self) -> None:
        runtime = self.task_runtime()
        if runtime is not None:
            runtime.queue.finish()

    def is_out_of_memory(self, exc: BaseException) -> bool:
        import pyopencl as cl

        if isinstance(exc, MemoryError):
            return True
        return isinstance(exc, cl.Error) and _code(exc) in OUT_OF_MEMORY_CODES

    def release_memory(self) -> None:
        with self._budget.lock:  # after an out-of-memory error: no cached block stays behind
            self._budget.give_back_cached()

    def set_memory_fraction(self, fraction: float) -> None:
        self._budget.cap_bytes = int(self._total_bytes * fraction)

    def sticky_error(self, exc: BaseException) -> str | None:
        return device_lost(exc)

    @contextlib.contextmanager
    def observe(self) -> Iterator[dict[str, Any]]:
        """The device the slot's queue really holds, as every job's evidence (and trace)."""
        from taogpud.backends.opencl.runtime import device_facts

        evidence: dict[str, Any] = {}
        try:
            yield evidence
        finally:
            evidence.update(device_facts(self._device))


def device_lost(exc: BaseException) -> str | None:
    """Why `exc` means the device or its context is gone (a fresh worker is needed), or None."""
    code = _code(exc)
    if code in DEVICE_LOST_CODES:
        return f"the OpenCL device was lost ({DEVICE_LOST_CODES[code]}, {code}): {exc}"
    if code == NVIDIA_KERNEL_FAULT:
        return f"a kernel faulted and the OpenCL context is unusable ({code}): {exc}"
    return None


def _code(exc: BaseException) -> int | None:
    """The OpenCL status of a pyopencl.Error (its `code`), None for anything else."""
    code = getattr(exc, "code", None)
    if callable(code):
        code = code()
    return code if isinstance(code, int) else None
