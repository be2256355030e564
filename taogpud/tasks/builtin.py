"""The built-in tasks: one body per task, written against `ctx.xp` (numpy or cupy).

Nothing here imports numpy or cupy: the daemon imports this module for the
catalog and the memory estimates, and only workers run the bodies.

Random data comes from `xp.random.default_rng(seed)`. NumPy (PCG64) and CuPy
(XORWOW) draw different numbers from the same seed, so a checksum is
reproducible on one backend, not across backends.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from taogpud.backends.cuda.evidence import format_gpu_uuid
from taogpud.errors import InvalidParams, JobCancelled
from taogpud.tasks.base import Task, TaskContext, TaskOutput

# Accepted up to 2**48 elements on purpose: whether a size fits is the
# scheduler's call (admission, with the device's numbers), not the model's.
MAX_ELEMENTS = 2**48
MAX_MATRIX_N = 2**24  # n × n = 2**48 elements
MAX_SLEEP_MS = 86_400_000  # one day
ITEMSIZE = {"float32": 4, "float64": 8}


def _reject_bool(value: Any) -> Any:
    # pydantic's lax mode reads True as 1; a boolean size is always a client mistake.
    if isinstance(value, bool):
        raise ValueError("expected an integer, not a boolean")
    return value


Int = Annotated[int, BeforeValidator(_reject_bool)]
Dtype = Literal["float32", "float64"]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SizedParams(_Params):
    size: Int = Field(1_000_000, ge=1, le=MAX_ELEMENTS, description="number of elements")
    dtype: Dtype = Field("float32", description="element type; uploaded inputs must have it")
    seed: Int = Field(0, ge=0, le=2**63 - 1, description="seed of xp.random.default_rng")


class SaxpyParams(SizedParams):
    alpha: float = Field(2.0, allow_inf_nan=False, description="the a in a*x + y")


class MatmulParams(_Params):
    n: Int = Field(1024, ge=1, le=MAX_MATRIX_N, description="rows and columns of a and b")
    dtype: Dtype = Field("float32", description="element type; uploaded inputs must have it")
    seed: Int = Field(0, ge=0, le=2**63 - 1, description="seed of xp.random.default_rng")


class NoParams(_Params):
    pass


class SleepParams(_Params):
    ms: Int = Field(1000, ge=0, le=MAX_SLEEP_MS, description="how long to hold the slot")


# ---------------------------------------------------------------------------- inputs


def _real_input(ctx: TaskContext, task: str, name: str, dtype: Any) -> Any:
    """The uploaded array `name`, converted to the job's dtype; real numbers only."""
    array = ctx.inputs[name]
    check_real_input(task, name, array)
    return ctx.xp.asarray(array, dtype=dtype)


def check_real_input(task: str, name: str, array: Any) -> None:
    """An input a numeric task can take (any backend's array): real, one element or more."""
    if array.dtype.kind not in "biuf":
        raise InvalidParams(
            f"{task}: input {name!r} has dtype {array.dtype}; {task} takes real numbers",
            hint="upload a float or integer array",
        )
    if array.ndim == 0 or array.size == 0:
        raise InvalidParams(
            f"{task}: input {name!r} has shape {tuple(array.shape)}; it needs at least one element",
            hint="upload an array with one dimension or more",
        )


def _common_shape(task: str, given: Mapping[str, Any]) -> tuple[int, ...] | None:
    shapes = {name: tuple(array.shape) for name, array in given.items()}
    if len(set(shapes.values())) > 1:
        raise InvalidParams(
            f"{task}: inputs must have one shape, got {shapes}",
            hint="upload arrays of the same shape",
        )
    return next(iter(shapes.values()), None)


def _elementwise_operands(
    ctx: TaskContext, task: str, params: SizedParams, names: Sequence[str]
) -> list[Any]:
    """Uploaded inputs replace generated arrays; when any is given, the size follows it."""
    dtype = ctx.xp.dtype(params.dtype)
    given = {name: _real_input(ctx, task, name, dtype) for name in names if name in ctx.inputs}
    shape = _common_shape(task, given)
    if shape is None:
        shape = (params.size,)
    rng = ctx.xp.random.default_rng(params.seed)
    # Drawn in name order, so a seed always gives the same a, then the same b.
    return [given[name] if name in given else rng.random(shape, dtype=dtype) for name in names]


def _checksum(array: Any, xp: Any) -> float:
    # Accumulated in float64: a float32 running sum loses digits on large arrays.
    return float(array.sum(dtype=xp.float64))


# ---------------------------------------------------------------------------- bodies


def _vector_add(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    a, b = _elementwise_operands(ctx, "vector_add", params, ("a", "b"))
    ctx.check_cancelled()
    c = ctx.xp.add(a, b, out=ctx.output("c", a.shape, a.dtype))
    ctx.check_cancelled()
    summary = {"size": int(c.size), "dtype": str(c.dtype), "checksum": _checksum(c, ctx.xp)}
    return TaskOutput(summary=summary, arrays={"c": c})


def _saxpy(ctx: TaskContext, params: SaxpyParams) -> TaskOutput:
    x, y = _elementwise_operands(ctx, "saxpy", params, ("x", "y"))
    ctx.check_cancelled()
    # A Python float keeps the array's dtype (NEP 50), so float32 stays float32.
    out = ctx.xp.multiply(x, params.alpha, out=ctx.output("out", x.shape, x.dtype))
    ctx.xp.add(out, y, out=out)
    ctx.check_cancelled()
    summary = {
        "size": int(out.size),
        "dtype": str(out.dtype),
        "alpha": params.alpha,
        "checksum": _checksum(out, ctx.xp),
    }
    return TaskOutput(summary=summary, arrays={"out": out})


def _matrix_input(ctx: TaskContext, name: str, dtype: Any) -> Any | None:
    if name not in ctx.inputs:
        return None
    matrix = _real_input(ctx, "matmul", name, dtype)
    check_matrix(name, matrix)
    return matrix


def _matmul_operands(ctx: TaskContext, params: MatmulParams) -> tuple[Any, Any]:
    """a (m×k) and b (k×n); a missing one is generated square to fit the given one."""
    dtype = ctx.xp.dtype(params.dtype)
    a, b = _matrix_input(ctx, "a", dtype), _matrix_input(ctx, "b", dtype)
    rng = ctx.xp.random.default_rng(params.seed)
    if a is None:
        k = params.n if b is None else b.shape[0]
        a = rng.random((k, k), dtype=dtype)
    if b is None:
        k = a.shape[1]
        b = rng.random((k, k), dtype=dtype)
    check_matmul_shapes(a, b)
    return a, b


def check_matrix(name: str, matrix: Any) -> None:
    """A matmul input (any backend's array) must be 2-D."""
    if matrix.ndim != 2:
        raise InvalidParams(
            f"matmul: input {name!r} must be a matrix, got shape {tuple(matrix.shape)}",
            hint="upload 2-D arrays",
        )


def check_matmul_shapes(a: Any, b: Any) -> None:
    """a (m×k) and b (k×n): a's columns must equal b's rows."""
    if a.shape[1] != b.shape[0]:
        raise InvalidParams(
            f"matmul: a is {tuple(a.shape)} and b is {tuple(b.shape)}; "
            "a's columns must equal b's rows",
            hint="upload a (m×k) and b (k×n)",
        )


def _matmul(ctx: TaskContext, params: MatmulParams) -> TaskOutput:
    a, b = _matmul_operands(ctx, params)
    ctx.check_cancelled()
    c = ctx.xp.matmul(a, b, out=ctx.output("c", (a.shape[0], b.shape[1]), a.dtype))
    ctx.check_cancelled()
    summary = {
        "m": int(a.shape[0]),
        "k": int(a.shape[1]),
        "n": int(b.shape[1]),
        "dtype": str(c.dtype),
        "checksum": _checksum(c, ctx.xp),
    }
    return TaskOutput(summary=summary, arrays={"c": c})


def _reduce_sum(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    (x,) = _elementwise_operands(ctx, "reduce_sum", params, ("x",))
    ctx.check_cancelled()
    total = x.sum()  # in the array's own dtype: this reduction is the work being measured
    summary = {"size": int(x.size), "dtype": str(x.dtype), "sum": float(total)}
    return TaskOutput(summary=summary)


def _fft(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    xp = ctx.xp
    (x,) = _elementwise_operands(ctx, "fft", params, ("x",))
    ctx.check_cancelled()
    spectrum = xp.fft.fft(x)  # along the last axis; float32 in → complex64 out
    ctx.check_cancelled()
    length = int(x.shape[-1])
    # Parseval: sum|x|² == sum|X|² / N. A cheap check that the transform is right.
    energy = float((x * x).sum(dtype=xp.float64))
    spectral = float((spectrum.real**2 + spectrum.imag**2).sum(dtype=xp.float64)) / length
    tolerance = 1e-3 if params.dtype == "float32" else 1e-9
    summary = {
        "size": int(x.size),
        "length": length,
        "dtype": str(spectrum.dtype),
        "energy": energy,
        "parseval_ok": math.isclose(energy, spectral, rel_tol=tolerance, abs_tol=1e-12),
        "checksum_real": _checksum(spectrum.real, xp),
        "checksum_imag": _checksum(spectrum.imag, xp),
    }
    return TaskOutput(summary=summary, arrays={"spectrum": spectrum})


def _sort(ctx: TaskContext, params: SizedParams) -> TaskOutput:
    xp = ctx.xp
    (x,) = _elementwise_operands(ctx, "sort", params, ("x",))
    ctx.check_cancelled()
    ordered = xp.sort(x.ravel())
    ctx.check_cancelled()
    # NaNs sort to the end and compare false; verify the numbers before them.
    nan_count = int(xp.isnan(ordered).sum())
    numbers = ordered[: ordered.size - nan_count]
    is_sorted = bool(xp.all(numbers[1:] >= numbers[:-1]))
    summary = {
        "size": int(ordered.size),
        "dtype": str(ordered.dtype),
        "is_sorted": is_sorted,
        "min": float(numbers[0]) if numbers.size else None,
        "max": float(numbers[-1]) if numbers.size else None,
        "nan_count": nan_count,
    }
    return TaskOutput(summary=summary, arrays={"sorted": ordered})


PROBE_N = 1024
PROBE_EXPECTED = PROBE_N * (PROBE_N + 1) * (2 * PROBE_N + 1) / 6  # 1² + 2² + … + n²


def _cuda_identity(xp: Any) -> dict[str, Any]:
    """The device this thread really uses, as the CUDA runtime names it."""
    device = xp.cuda.Device()
    props = xp.cuda.runtime.getDeviceProperties(device.id)
    name = props.get("name", b"")
    return {
        "cuda_device_id": int(device.id),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pci_bus_id": xp.cuda.runtime.deviceGetPCIBusId(device.id),
        "uuid": format_gpu_uuid(props.get("uuid")),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "device_name": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
    }


def checked_probe(
    ctx: TaskContext, got: float, array_module: str, rel_tol: float = 0.0
) -> dict[str, Any]:
    """The probe's check of 1² + … + n² and the fields every backend's probe reports."""
    if not math.isclose(got, PROBE_EXPECTED, rel_tol=rel_tol):
        raise RuntimeError(
            f"probe: {ctx.device} computed {got} for 1²+…+{PROBE_N}², expected {PROBE_EXPECTED}"
        )
    return {
        "backend": ctx.backend,
        "device": ctx.device,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "array_module": array_module,
        "check": {"expected": PROBE_EXPECTED, "got": got, "ok": True},
    }


def _probe(ctx: TaskContext, params: NoParams) -> TaskOutput:
    xp = ctx.xp
    values = xp.arange(1, PROBE_N + 1, dtype=xp.float64)
    module = type(values).__module__.split(".")[0]  # "numpy" or "cupy"
    summary: dict[str, Any] = {
        **checked_probe(ctx, float((values * values).sum()), module),
        "fallback_reason": ctx.info.get("fallback_reason"),
    }
    if ctx.backend == "cpu":
        summary["device_name"] = ctx.info.get("name")
    if ctx.backend == "cuda":
        summary.update(_cuda_identity(xp))
    return TaskOutput(summary=summary)


def _noop(ctx: TaskContext, params: NoParams) -> TaskOutput:
    return TaskOutput(summary={})


def _sleep(ctx: TaskContext, params: SleepParams) -> TaskOutput:
    # Waiting on the event, not time.sleep: cancel and timeout end it at once.
    if ctx.cancelled.wait(params.ms / 1000):
        raise JobCancelled
    return TaskOutput(summary={"slept_ms": params.ms})


# ---------------------------------------------------------------------------- estimates
# Device bytes each task will hold at its peak, from its params alone.


def _elements_times(arrays: int) -> Callable[[SizedParams], int]:
    def estimate(params: SizedParams) -> int:
        return arrays * params.size * ITEMSIZE[params.dtype]

    return estimate


def _matmul_bytes(params: MatmulParams) -> int:
    return 3 * params.n * params.n * ITEMSIZE[params.dtype]


def _fft_bytes(params: SizedParams) -> int:
    # input 1 + complex output 2 + cuFFT work area 2 + Parseval temporaries 3
    return 8 * params.size * ITEMSIZE[params.dtype]


def _sort_bytes(params: SizedParams) -> int:
    # input, output and sort scratch, plus two boolean masks for the check
    return params.size * (3 * ITEMSIZE[params.dtype] + 2)


def _probe_bytes(params: NoParams) -> int:
    return 2 * PROBE_N * 8


def _no_bytes(params: Any) -> int:
    return 0


# ---------------------------------------------------------------------------- the table

BUILTIN_TASKS: tuple[Task, ...] = (
    Task(
        "vector_add",
        "c = a + b over `size` elements; inputs a, b replace the generated arrays",
        SizedParams,
        _vector_add,
        _elements_times(3),
        inputs=("a", "b"),
    ),
    Task(
        "saxpy",
        "out = alpha * x + y; inputs x, y replace the generated arrays",
        SaxpyParams,
        _saxpy,
        _elements_times(3),
        inputs=("x", "y"),
    ),
    Task(
        "matmul",
        "c = a @ b for n × n matrices; inputs a (m×k), b (k×n) replace them",
        MatmulParams,
        _matmul,
        _matmul_bytes,
        inputs=("a", "b"),
    ),
    Task(
        "reduce_sum",
        "the sum of `size` elements, in their dtype; input x replaces them",
        SizedParams,
        _reduce_sum,
        _elements_times(1),
        inputs=("x",),
    ),
    Task(
        "fft",
        "complex FFT along the last axis, checked by Parseval; input x replaces the data",
        SizedParams,
        _fft,
        _fft_bytes,
        inputs=("x",),
    ),
    Task(
        "sort",
        "sorts `size` elements and verifies the order; input x replaces them",
        SizedParams,
        _sort,
        _sort_bytes,
        inputs=("x",),
    ),
    Task(
        "probe",
        "reports the device the job really ran on, and checks a tiny computation there",
        NoParams,
        _probe,
        _probe_bytes,
    ),
    Task("noop", "does nothing: measures dispatch overhead", NoParams, _noop, _no_bytes),
    Task(
        "sleep",
        "holds a slot for `ms` milliseconds; cancel stops it",
        SleepParams,
        _sleep,
        _no_bytes,
    ),
)

# Tiny params for the warm-up run; every dtype a task takes is warmed.
_WARMUP_PARAMS: dict[str, dict[str, Any]] = {
    "vector_add": {"size": 1024},
    "saxpy": {"size": 1024},
    "matmul": {"n": 16},
    "reduce_sum": {"size": 1024},
    "fft": {"size": 1024},
    "sort": {"size": 1024},
    "probe": {},
    "noop": {},
    "sleep": {"ms": 0},
}


def warmup_runs() -> list[tuple[Task, dict[str, Any]]]:
    """(task, params) pairs that run every built-in once on tiny data, in every dtype each
    takes (tasks/warmup.py runs them)."""
    return [(task, params) for task in BUILTIN_TASKS for params in _warmup_params(task)]


def _warmup_params(task: Task) -> list[dict[str, Any]]:
    tiny = _WARMUP_PARAMS[task.name]
    if "dtype" not in task.params.model_fields:
        return [tiny]
    return [{**tiny, "dtype": dtype} for dtype in ITEMSIZE]
