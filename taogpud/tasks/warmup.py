"""A worker's backend, given what the tasks need of it, and warmed by running every body once.

Backends sit below tasks and never import them (tests/test_layers.py checks it). What a
backend's bodies need built on the device is handed to it here, when it is created: the
opencl slots' kernels (tasks/opencl_kernels.py). Then `warm` runs every built-in once on tiny
data, so the first real job finds everything loaded: BLAS and FFT plans on cpu, compiled
kernels and cuFFT/cuBLAS handles on cuda, pyopencl's reductions and sorts on opencl.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from taogpud.backends import Backend, DeviceInfo, WorkerSpec, create_backend
from taogpud.tasks.base import Task, TaskContext


def backend_for(spec: WorkerSpec) -> Backend:
    """The backend `spec` names, built (not yet warm) with what its task bodies need."""
    return create_backend(spec, slot_kernels=_slot_kernels(spec.backend))


def warm(backend: Backend) -> DeviceInfo:
    """Warm the device, then run every body once in each slot that needs it; the info's
    warmup_ms counts both."""
    started = time.perf_counter()
    info = backend.warm()
    slots = range(backend.spec.stream_count) if backend.kernels_per_slot else range(1)
    for slot in slots:
        with backend.slot(slot):
            for task, params in _runs(backend.name, info):
                ctx = TaskContext(
                    backend.xp, backend.name, info.device, {}, threading.Event(),
                    info.as_dict(), backend.task_runtime(),
                )  # fmt: skip
                task.body_for(backend.name)(ctx, task.params.model_validate(params))
            backend.synchronize()
    return dataclasses.replace(info, warmup_ms=(time.perf_counter() - started) * 1000)


def _slot_kernels(backend: str) -> Any:
    if backend == "opencl":  # pyopencl is imported here, in the opencl worker only
        from taogpud.tasks.opencl_kernels import build_slot_kernels

        return build_slot_kernels
    return None


def _runs(backend: str, info: DeviceInfo) -> list[tuple[Task, dict[str, Any]]]:
    """The (task, params) pairs to warm `backend` with."""
    if backend == "opencl":
        from taogpud import tasks
        from taogpud.tasks.opencl_tasks import warmup_runs as opencl_runs

        fp64 = bool(info.extra.get("fp64"))
        return [(tasks.get(name), params) for name, params in opencl_runs(fp64=fp64)]
    from taogpud.tasks.builtin import warmup_runs

    return warmup_runs()
