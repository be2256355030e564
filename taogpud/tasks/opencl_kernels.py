"""The built-in tasks as OpenCL kernels (pyopencl), for workers of the opencl backend.

Imported only inside an opencl worker: it imports numpy and pyopencl at the top.
`taogpud.tasks.opencl_tasks` attaches these bodies to the built-in tasks for the daemon.

Element-wise work (vector_add, saxpy) and matmul are our own OpenCL C: pyopencl's generic
ElementwiseKernel loops over a grid stride that PoCL runs 30-100× slower than one work item
per element. Sums and sort are pyopencl's ReductionKernel and RadixSort. Random inputs are
drawn on the device (Philox), so, as with CuPy, a seed's numbers differ from NumPy's.

Every kernel object is per slot: a pyopencl kernel sets its arguments and then enqueues,
so two slot threads must never share one. `build_slot_kernels` is what the tasks layer hands
the opencl backend (tasks/warmup.py): the backend builds its slots around these kernels
without importing this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from pyopencl import clrandom
from pyopencl.algorithm import RadixSort
from pyopencl.reduction import ReductionKernel

from taogpud.backends.opencl.runtime import SlotRuntime, device_facts, has_fp64
from taogpud.errors import InvalidParams
from taogpud.tasks.base import TaskContext, TaskOutput
from taogpud.tasks.builtin import (
    PROBE_N,
    MatmulParams,
    NoParams,
    SaxpyParams,
    SizedParams,
    check_matmul_shapes,
    check_matrix,
    check_real_input,
    checked_probe,
)

# FP_CONTRACT OFF: NumPy rounds alpha*x and then +y; a fused multiply-add would differ in the
# last bit. One work item per element; `n` guards a global size rounded up to the group size.
SOURCE = r"""
#ifdef TAOGPUD_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#pragma OPENCL FP_CONTRACT OFF

__kernel void vector_add(__global const T *a, __global const T *b, __global T *c, ulong n) {
    size_t i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}

__kernel void saxpy(T alpha, __global const T *x, __global const T *y, __global T *out,
                    ulong n) {
    size_t i = get_global_id(0);
    if (i < n) out[i] = alpha * x[i] + y[i];
}

/* c (m×n) = a (m×k) @ b (k×n), row-major, in TILE×TILE tiles through local memory. */
__kernel void matmul(ulong m, ulong n, ulong k, __global const T *a, __global const T *b,
                     __global T *c) {
    size_t col = get_global_id(0), row = get_global_id(1);
    size_t lc = get_local_id(0), lr = get_local_id(1);
    __local T a_tile[TILE][TILE];
    __local T b_tile[TILE][TILE];
    T acc = 0;
    for (ulong t = 0; t < k; t += TILE) {
        a_tile[lr][lc] = (row < m && t + lc < k) ? a[row * k + t + lc] : (T)0;
        b_tile[lr][lc] = (t + lr < k && col < n) ? b[(t + lr) * n + col] : (T)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = 0; i < TILE; ++i) acc += a_tile[lr][i] * b_tile[i][lc];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < m && col < n) c[row * n + col] = acc;
}
"""

# Floats as unsigned keys that sort in the same order, every NaN last as NumPy puts them.
# (RadixSort takes an expression, not a preamble: hence one long expression.)
_SORT_KEY = (
    "(isnan(values[i]) ? (UINT)(-1) : ((AS(values[i]) & SIGN) ? ~AS(values[i]) "
    ": (AS(values[i]) | SIGN)))"
)
MAX_SORT_ELEMENTS = 2**31 - 1  # RadixSort's int32 indices

GROUP = 256  # work items per group for the element-wise kernels


@dataclass(frozen=True)
class _TypeInfo:
    c_name: str
    uint_name: str
    uint_dtype: Any
    as_uint: str
    sign_bit: str


_TYPES = {
    "float32": _TypeInfo("float", "uint", np.uint32, "as_uint", "0x80000000u"),
    "float64": _TypeInfo("double", "ulong", np.uint64, "as_ulong", "0x8000000000000000ul"),
}


def build_options(dtype: str, tile: int) -> list[str]:
    options = [f"-DT={_TYPES[dtype].c_name}", f"-DTILE={tile}"]
    return [*options, "-DTAOGPUD_FP64"] if dtype == "float64" else options


def matmul_tile(device: cl.Device) -> int:
    """16×16 work items per group where the device allows it (every GPU and PoCL), else 8."""
    return 16 if device.max_work_group_size >= 256 else 8


class DtypeKernels:
    """Every kernel of one element type, built for one slot."""

    def __init__(self, context: cl.Context, program: cl.Program, dtype: str) -> None:
        info, fp64 = _TYPES[dtype], "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
        preamble = fp64 if dtype == "float64" else ""
        c_type = info.c_name
        self.dtype = np.dtype(dtype)
        self.vector_add: Any = cl.Kernel(program, "vector_add")
        self.saxpy: Any = cl.Kernel(program, "saxpy")
        self.matmul: Any = cl.Kernel(program, "matmul")
        self.sum: Any = ReductionKernel(
            context, self.dtype, "0", "a+b", "x[i]", f"const {c_type} *x", preamble=preamble
        )
        self.nan_count: Any = ReductionKernel(
            context, np.int64, "0", "a+b", "isnan(x[i]) ? 1 : 0", f"const {c_type} *x",
            preamble=preamble,
        )  # fmt: skip
        # How many neighbours are out of order among the first n numbers (0 = sorted).
        self.disorder: Any = ReductionKernel(
            context, np.int64, "0", "a+b", "(i > 0 && x[i] < x[i-1]) ? 1 : 0",
            f"const {c_type} *x", preamble=preamble,
        )  # fmt: skip
        key = _SORT_KEY.replace("UINT", info.uint_name).replace("AS", info.as_uint)
        self.sort: Any = RadixSort(
            context,
            f"{c_type} *values",
            key_expr=key.replace("SIGN", info.sign_bit),
            sort_arg_names=["values"],
            key_dtype=info.uint_dtype,
        )
        self.key_bits = 8 * info.uint_dtype().itemsize


class Kernels:
    """One slot's kernels, by element type. Built before the worker reports warm."""

    def __init__(
        self, context: cl.Context, programs: dict[str, cl.Program], fp64: bool, tile: int
    ) -> None:
        self.fp64 = fp64
        self.tile = tile  # matmul's work-group side (matmul_tile)
        self.checksum_dtype = np.dtype(np.float64 if fp64 else np.float32)
        self.by_dtype = {dtype: DtypeKernels(context, p, dtype) for dtype, p in programs.items()}
        self.checksum_of_f32: Any = ReductionKernel(
            context, self.checksum_dtype, "0", "a+b", "x[i]", "const float *x",
            preamble="#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if fp64 else "",
        )  # fmt: skip

    def of(self, dtype: str) -> DtypeKernels:
        kernels = self.by_dtype.get(dtype)
        if kernels is None:
            raise InvalidParams(
                f"this OpenCL device has no double precision (cl_khr_fp64), so {dtype} is "
                "not available on it",
                'use dtype "float32"',
            )
        return kernels


def build_slot_kernels(context: cl.Context, device: cl.Device, slots: int) -> list[Kernels]:
    """Every slot's kernels: the programs built once for the device, kernel objects per slot."""
    fp64 = has_fp64(device)
    programs = build_programs(context, device, fp64)
    return [Kernels(context, programs, fp64, matmul_tile(device)) for _ in range(slots)]


def build_programs(context: cl.Context, device: cl.Device, fp64: bool) -> dict[str, cl.Program]:
    """The OpenCL C above, built once per element type (the slots share the programs)."""
    tile = matmul_tile(device)
    dtypes = ["float32", "float64"] if fp64 else ["float32"]
    return {
        dtype: cl.Program(context, SOURCE).build(options=build_options(dtype, tile))
        for dtype in dtypes
    }


def _runtime(ctx: TaskContext) -> SlotRuntime:
    runtime = ctx.runtime
    assert isinstance(runtime, SlotRuntime), "an OpenCL body ran outside an opencl slot"
    return runtime


# ---------------------------------------------------------------------------- operands


def _real_input(ctx: TaskContext, task: str, name: str, dtype: Any) -> cla.Array:
    array = ctx.inputs[name]
    check_real_input(task, name, array)
    return _runtime(ctx).to_dtype(array, dtype)


def _random(ctx: TaskContext, shape: tuple[int, ...], dtype: Any, seed: int, draw: int) -> Any:
    runtime = _runtime(ctx)
    # One generator per (seed, draw): a then b get their own streams, the same every time.
    generator = clrandom.PhiloxGenerator(runtime.context, seed=seed * 4 + draw)  # type: ignore[no-untyped-call]
    array = runtime.empty(shape, dtype)
    generator.fill_uniform(array, queue=runtime.queue)  # type: ignore[no-untyped-call]
    return array


def _operands(
    ctx: TaskContext, task: str, params: SizedParams, names: tuple[str, ...]
) -> list[cla.Array]:
    """Uploaded inputs replace generated arrays; when any is given, the size follows it."""
    dtype = np.dtype(params.dtype)
    given = {name: _real_input(ctx, task, name, dtype) for name in names if name in ctx.inputs}
    shapes = {name: tuple(array.shape) for name, array in given.items()}
    if len(set(shapes.values())) > 1:
        raise InvalidParams(
            f"{task}: inputs must have one shape, got {shapes}",
            hint="upload arrays of the same shape",
        )
    shape = next(iter(shapes.values()), (params.size,))
    return [
        given[name] if name in given else _random(ctx, shape, dtype, params.seed, draw)
        for draw, name in enumerate(names)
    ]


def _checksum(runtime: SlotRuntime, array: cla.Array) -> float:
    """The sum in float64 (float32 where the device has no fp64), as the xp bodies report it."""
    kernels = runtime.kernels
    if array.dtype == np.float32 and kernels.fp64:
        total = kernels.checksum_of_f32(array, queue=runtime.queue)
    else:
        total = kernels.of(str(array.dtype)).sum(array, queue=runtime.queue)
    return float(total.get())


def _launch_elementwise(runtime: SlotRuntime, kernel: cl.Kernel, size: int, *args: Any) -> None:
    global_size = (math.ceil(size / GROUP) * GROUP,)
    kernel(runtime.queue, global_size, (GROUP,), *args, np.uint64(size))


# ---------------------------------------------------------------------------- bodies


def vector_add(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    runtime = _runtime(ctx)
    a, b = _operands(ctx, "vector_add", params, ("a", "b"))
    ctx.check_cancelled()
    c = runtime.empty(a.shape, a.dtype)
    kernel = runtime.kernels.of(params.dtype).vector_add
    _launch_elementwise(runtime, kernel, a.size, a.data, b.data, c.data)
    ctx.check_cancelled()
    summary = {"size": int(c.size), "dtype": str(c.dtype), "checksum": _checksum(runtime, c)}
    return TaskOutput(summary=summary, arrays={"c": c})


def saxpy(ctx: TaskContext, params: SaxpyParams) -> TaskOutput:
    runtime = _runtime(ctx)
    x, y = _operands(ctx, "saxpy", params, ("x", "y"))
    ctx.check_cancelled()
    out = runtime.empty(x.shape, x.dtype)
    kernel = runtime.kernels.of(params.dtype).saxpy
    alpha = x.dtype.type(params.alpha)  # the array's dtype, as NumPy does with a Python float
    _launch_elementwise(runtime, kernel, x.size, alpha, x.data, y.data, out.data)
    ctx.check_cancelled()
    summary = {
        "size": int(out.size),
        "dtype": str(out.dtype),
        "alpha": params.alpha,
        "checksum": _checksum(runtime, out),
    }
    return TaskOutput(summary=summary, arrays={"out": out})


def reduce_sum(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    runtime = _runtime(ctx)
    (x,) = _operands(ctx, "reduce_sum", params, ("x",))
    ctx.check_cancelled()
    # In the array's own dtype, like the xp body: a tree reduction, close to NumPy's pairwise.
    total = runtime.kernels.of(params.dtype).sum(x, queue=runtime.queue)
    summary = {"size": int(x.size), "dtype": str(x.dtype), "sum": float(total.get())}
    return TaskOutput(summary=summary)


def sort(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    runtime = _runtime(ctx)
    (x,) = _operands(ctx, "sort", params, ("x",))
    ctx.check_cancelled()
    kernels = runtime.kernels.of(params.dtype)
    if x.size > MAX_SORT_ELEMENTS:
        raise InvalidParams(
            f"sort: {x.size} elements; the OpenCL sort takes at most {MAX_SORT_ELEMENTS}",
            hint="sort fewer elements per job",
        )
    flat: Any = x.reshape(x.size)  # type: ignore[no-untyped-call]
    (ordered,), _ = kernels.sort(
        flat, queue=runtime.queue, allocator=runtime.allocator, key_bits=kernels.key_bits
    )
    ctx.check_cancelled()
    nan_count = int(kernels.nan_count(ordered, queue=runtime.queue).get())
    numbers = ordered[: ordered.size - nan_count]
    disorder = int(kernels.disorder(numbers, queue=runtime.queue).get()) if numbers.size else 0
    ends: tuple[Any, ...] = ()
    if numbers.size:
        ends = (numbers[:1].get()[0], numbers[numbers.size - 1 :].get()[0])
    summary = {
        "size": int(ordered.size),
        "dtype": str(ordered.dtype),
        "is_sorted": disorder == 0,
        "min": float(ends[0]) if numbers.size else None,
        "max": float(ends[-1]) if numbers.size else None,
        "nan_count": nan_count,
    }
    return TaskOutput(summary=summary, arrays={"sorted": ordered})


def _matrix_input(ctx: TaskContext, name: str, dtype: Any) -> cla.Array | None:
    if name not in ctx.inputs:
        return None
    matrix = _real_input(ctx, "matmul", name, dtype)
    check_matrix(name, matrix)
    return matrix


def _matmul_operands(ctx: TaskContext, params: MatmulParams) -> tuple[cla.Array, cla.Array]:
    dtype = np.dtype(params.dtype)
    a, b = _matrix_input(ctx, "a", dtype), _matrix_input(ctx, "b", dtype)
    if a is None:
        k = params.n if b is None else b.shape[0]
        a = _random(ctx, (k, k), dtype, params.seed, 0)
    if b is None:
        k = a.shape[1]
        b = _random(ctx, (k, k), dtype, params.seed, 1)
    check_matmul_shapes(a, b)
    return a, b


def matmul(ctx: TaskContext, params: MatmulParams) -> TaskOutput:
    runtime = _runtime(ctx)
    a, b = _matmul_operands(ctx, params)
    ctx.check_cancelled()
    (m, k), n = a.shape, b.shape[1]
    c = runtime.empty((m, n), a.dtype)
    tile = runtime.kernels.tile
    global_size = (math.ceil(n / tile) * tile, math.ceil(m / tile) * tile)
    runtime.kernels.of(params.dtype).matmul(
        runtime.queue, global_size, (tile, tile),
        np.uint64(m), np.uint64(n), np.uint64(k), a.data, b.data, c.data,
    )  # fmt: skip
    ctx.check_cancelled()
    summary = {
        "m": int(m),
        "k": int(k),
        "n": int(n),
        "dtype": str(c.dtype),
        "checksum": _checksum(runtime, c),
    }
    return TaskOutput(summary=summary, arrays={"c": c})


def probe(ctx: TaskContext, params: NoParams) -> TaskOutput:
    """1² + … + n² computed on the device, and the device the slot's queue really holds."""
    runtime = _runtime(ctx)
    dtype = np.float64 if runtime.kernels.fp64 else np.float32
    values: Any = np.arange(1, PROBE_N + 1, dtype=dtype)
    squares = cla.to_device(runtime.queue, values * values, allocator=runtime.allocator)
    got = float(runtime.kernels.of(np.dtype(dtype).name).sum(squares, queue=runtime.queue).get())
    summary: dict[str, Any] = {
        **checked_probe(ctx, got, "pyopencl", rel_tol=1e-6),  # float32 where fp64 is missing
        "fallback_reason": None,
        **device_facts(runtime.queue.device),
    }
    return TaskOutput(summary=summary)


OPENCL_BODIES: dict[str, Any] = {
    "vector_add": vector_add,
    "saxpy": saxpy,
    "reduce_sum": reduce_sum,
    "sort": sort,
    "matmul": matmul,
    "probe": probe,
}
