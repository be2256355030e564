"""The `kernel` task: a user's CUDA C kernel, launched on the job's stream.

Off unless `[backend.cuda] allow_user_kernels = true` (the scheduler refuses it at submit):
a kernel runs arbitrary code on the GPU with the daemon's rights there, and a bad one can
end its worker with a sticky error (the worker is then respawned; see pool/child.py).

    params: source (CUDA C), name (an extern "C" __global__ function), grid, block,
            shared_mem_bytes, args: a list, in the kernel's parameter order, of
              {"input": "x0"}                                   an uploaded array (x0 … x7)
              {"output": "y", "shape": [n], "dtype": "float32"} zeros, kept as output y
              {"scalar": 2.0, "dtype": "float32"}               a number by value

Nothing here imports numpy or cupy at module level (the daemon reads the catalog).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from taogpud.errors import InvalidParams
from taogpud.tasks.base import Task, TaskContext, TaskOutput

KERNEL_TASK_NAME = "kernel"
INPUT_NAMES = tuple(f"x{i}" for i in range(8))
MAX_SOURCE_CHARS = 1_000_000
MAX_THREADS_PER_BLOCK = 1024  # every CUDA GPU since compute capability 2.0
KernelDtype = Literal["float32", "float64", "int32", "int64", "uint32"]
INTEGER_DTYPES = frozenset({"int32", "int64", "uint32"})
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint32": 4}
Dim = Annotated[int, Field(ge=1, le=2**31 - 1, strict=True)]


class _Arg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputArg(_Arg):
    input: Literal[INPUT_NAMES] = Field(description="an uploaded array, x0 … x7")  # type: ignore[valid-type]


class OutputArg(_Arg):
    output: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
    shape: list[Dim] = Field(min_length=1, max_length=8)
    dtype: KernelDtype = "float32"


class ScalarArg(_Arg):
    scalar: float | int = Field(allow_inf_nan=False)
    dtype: KernelDtype = "float32"

    @model_validator(mode="after")
    def _whole_for_integers(self) -> ScalarArg:
        if self.dtype in INTEGER_DTYPES and self.scalar != int(self.scalar):
            raise ValueError(f"scalar {self.scalar} is not a whole number, as {self.dtype} needs")
        return self


class KernelParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1, max_length=MAX_SOURCE_CHARS, description="CUDA C source")
    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,255}$", description='the extern "C" __global__ kernel'
    )
    grid: list[Dim] = Field(min_length=1, max_length=3, description="blocks per grid (x, y, z)")
    block: list[Dim] = Field(
        min_length=1, max_length=3, description="threads per block (x, y, z), at most 1024 all"
    )
    shared_mem_bytes: int = Field(0, ge=0, le=2**20, description="dynamic shared memory")
    args: list[InputArg | OutputArg | ScalarArg] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _check(self) -> KernelParams:
        threads = math.prod(self.block)
        if threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(
                f"block {self.block} is {threads} threads; CUDA allows {MAX_THREADS_PER_BLOCK}"
            )
        names = [a.output for a in self.args if isinstance(a, OutputArg)]
        doubled = sorted({name for name in names if names.count(name) > 1})
        if doubled:
            raise ValueError(f"output names must differ: {', '.join(doubled)} given twice")
        return self


def _kernel(ctx: TaskContext, params: KernelParams) -> TaskOutput:
    if ctx.backend != "cuda":
        raise InvalidParams(
            f"the kernel task runs CUDA C; {ctx.device} is a {ctx.backend} worker",
            "run it on a host whose workers are cuda (no CPU fallback can run CUDA C)",
        )
    from taogpud.backends.cuda.kernels import load_function

    arch = str(ctx.info.get("cuda_arch") or "")
    function = load_function(params.source, params.name, arch)
    values, outputs = _arguments(ctx, params.args)
    function(
        tuple(params.grid), tuple(params.block), tuple(values), shared_mem=params.shared_mem_bytes
    )
    summary = {
        "kernel": params.name,
        "arch": arch,
        "grid": params.grid,
        "block": params.block,
        "outputs": {name: _describe(array) for name, array in outputs.items()},
    }
    return TaskOutput(summary=summary, arrays=outputs)


def _arguments(ctx: TaskContext, args: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """The launch arguments in order, and the output arrays by name."""
    xp = ctx.xp
    values: list[Any] = []
    outputs: dict[str, Any] = {}
    for position, arg in enumerate(args):
        if isinstance(arg, InputArg):
            values.append(_input(ctx, position, arg.input))
        elif isinstance(arg, OutputArg):
            outputs[arg.output] = xp.zeros(tuple(arg.shape), dtype=arg.dtype)
            values.append(outputs[arg.output])
        else:
            values.append(xp.dtype(arg.dtype).type(arg.scalar))
    return values, outputs


def _input(ctx: TaskContext, position: int, name: str) -> Any:
    if name not in ctx.inputs:
        raise InvalidParams(
            f"kernel: args[{position}] names input {name!r}, which the job did not upload",
            f"submit with --input {name}=FILE.npy",
        )
    # A contiguous device copy: the kernel gets a plain pointer and may write into it.
    return ctx.xp.ascontiguousarray(ctx.inputs[name])


def _describe(array: Any) -> dict[str, Any]:
    return {"shape": list(array.shape), "dtype": str(array.dtype)}


def _kernel_bytes(params: KernelParams) -> int:
    return sum(
        math.prod(arg.shape) * ITEMSIZE[arg.dtype]
        for arg in params.args
        if isinstance(arg, OutputArg)
    )


KERNEL_TASK = Task(
    KERNEL_TASK_NAME,
    "a CUDA C kernel of yours, built for cuda_arch (off unless "
    "[backend.cuda] allow_user_kernels = true)",
    KernelParams,
    _kernel,
    _kernel_bytes,
    inputs=INPUT_NAMES,
    backends=frozenset({"cuda"}),
)
