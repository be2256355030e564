"""Which built-in tasks run on the opencl backend, and with which body.

The daemon imports this module (for the catalog and the submit check), so it imports
neither numpy nor pyopencl: each OpenCL body is looked up in `opencl_kernels` when a
worker first runs it.

fft has no OpenCL body: a job for it on an opencl daemon is refused at submit
(`unsupported_task`), never run on the host instead. noop and sleep touch no device and
run as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from taogpud.tasks.base import Task, TaskContext, TaskOutput

OPENCL = "opencl"
WITH_OPENCL_KERNELS = ("vector_add", "saxpy", "matmul", "reduce_sum", "sort", "probe")
DEVICE_FREE = ("noop", "sleep")  # no array work: the same body is honest on any backend
# Tiny params that run every OpenCL kernel once at warm-up (pyopencl finishes building its
# reductions and sorts on first call), in each dtype the device has.
_WARMUP = {"vector_add": {"size": 1024}, "saxpy": {"size": 1024}, "matmul": {"n": 16},
           "reduce_sum": {"size": 1024}, "sort": {"size": 1024}}  # fmt: skip


def warmup_runs(fp64: bool) -> list[tuple[str, dict[str, Any]]]:
    """(task, params) pairs that touch every OpenCL kernel, float64 only where it exists."""
    dtypes = ("float32", "float64") if fp64 else ("float32",)
    runs = [
        (name, {**params, "dtype": dtype}) for name, params in _WARMUP.items() for dtype in dtypes
    ]
    return [*runs, ("probe", {})]


def with_opencl(tasks: Iterable[Task]) -> list[Task]:
    """The built-ins, each that has an OpenCL implementation marked and given it."""
    return [_with_opencl(task) for task in tasks]


def _with_opencl(task: Task) -> Task:
    if task.name in WITH_OPENCL_KERNELS:
        bodies = {**task.backend_bodies, OPENCL: _lazy_body(task.name)}
        return dataclasses.replace(task, backends=task.backends | {OPENCL}, backend_bodies=bodies)
    if task.name in DEVICE_FREE:
        return dataclasses.replace(task, backends=task.backends | {OPENCL})
    return task


def _lazy_body(name: str) -> Callable[[TaskContext, Any], TaskOutput]:
    def body(ctx: TaskContext, params: Any) -> TaskOutput:
        from taogpud.tasks.opencl_kernels import OPENCL_BODIES

        output: TaskOutput = OPENCL_BODIES[name](ctx, params)
        return output

    body.__name__ = f"opencl_{name}"
    return body
