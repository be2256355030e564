"""Backends behind one interface; each is imported only by the worker that runs it.

The daemon imports this package, so numpy and cupy are imported inside
`create_backend`, never at module level.
"""

from __future__ import annotations

from typing import Any

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec
from taogpud.errors import BackendUnavailable

__all__ = ["BACKENDS", "Backend", "DeviceInfo", "WorkerSpec", "create_backend"]

BACKENDS = ("cpu", "cuda", "opencl")


def create_backend(spec: WorkerSpec, slot_kernels: Any = None) -> Backend:
    """The backend `spec.backend` names, built (not yet warm) for `spec.index`.

    `slot_kernels` is what the tasks above build per slot on the device (opencl:
    `backends.opencl.runtime.SlotKernels`); the other backends need none. Backends never
    import the tasks: tasks/warmup.py hands it in."""
    if spec.backend == "cpu":
        from taogpud.backends.cpu import CpuBackend

        return CpuBackend(spec)
    if spec.backend == "cuda":
        from taogpud.backends.cuda.backend import CudaBackend

        return CudaBackend(spec)
    if spec.backend == "opencl":
        from taogpud.backends.opencl.backend import OpenclBackend

        return OpenclBackend(spec, slot_kernels)
    raise BackendUnavailable(
        f"no backend named {spec.backend!r}; taogpud has {', '.join(BACKENDS)}",
        hint='set gpu.backend to "cuda" or runtime.device_type to "cpu"',
    )
