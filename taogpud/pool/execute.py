"""One job inside a worker: map inputs, move them to the device, run, keep outputs.

Every failure becomes a JobFinished with an error code; nothing a task does can
take the worker down short of a crash of the process itself.
"""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import re
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from taogpud import wire
from taogpud.arrayfiles import images
from taogpud.backends.base import Backend, DeviceInfo
from taogpud.errors import BadSummary, JobCancelled
from taogpud.memfd import regions
from taogpud.pool import protocol as msg

# Backend.sticky_error_code values: the worker exits after reporting one (pool/child.py).
STICKY_ERROR_CODES = frozenset({"cuda_sticky_error", "opencl_device_lost", "device_unusable"})
OUTPUT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # no path separators, no dotfiles


class JobIO(Protocol):
    """Where a job's inputs come from and where its kept outputs go."""

    def host_inputs(self, order: msg.RunJob, maps: list[mmap.mmap]) -> dict[str, Any]: ...
    def keep_outputs(
        self, backend: Backend, arrays: dict[str, Any], output_dir: str
    ) -> dict[str, msg.OutputFile]: ...


class SharedFiles:
    """The local executor's: inputs mapped from /dev/shm, outputs written as .npy files."""

    def host_inputs(self, order: msg.RunJob, maps: list[mmap.mmap]) -> dict[str, Any]:
        return {name: map_input(ref, maps) for name, ref in order.inputs.items()}

    def keep_outputs(
        self, backend: Backend, arrays: dict[str, Any], output_dir: str
    ) -> dict[str, msg.OutputFile]:
        return write_outputs(backend, arrays, output_dir)


def execute(
    backend: Backend,
    info: DeviceInfo,
    order: msg.RunJob,
    cancelled: threading.Event,
    slot: int,
    io: JobIO | None = None,  # None: SharedFiles; the Ray executor brings its own
) -> msg.JobFinished:
    started = time.perf_counter()
    maps: list[mmap.mmap] = []
    try:
        with backend.observe() as evidence:
            result, outputs, timings = _run_task(
                backend, info, order, cancelled, slot, maps, io or SharedFiles()
            )
        status = "cancelled" if cancelled.is_set() else "succeeded"
        return msg.JobFinished(
            order.job_id,
            status,
            _ms_since(started),
            result=result,
            outputs=outputs,
            timings=timings,
            evidence=evidence,
        )
    except JobCancelled:
        return _failed(order, started, "cancelled", "the job was stopped while running", "")
    except Exception as exc:  # a task's own error is the job's error, never the worker's
        return _task_error(backend, info, order, started, exc)
    finally:
        _close_all(maps)


def _run_task(
    backend: Backend,
    info: DeviceInfo,
    order: msg.RunJob,
    cancelled: threading.Event,
    slot: int,
    maps: list[mmap.mmap],
    io: JobIO,
) -> tuple[dict[str, Any], dict[str, msg.OutputFile], dict[str, float]]:
    from taogpud import tasks
    from taogpud.tasks.base import TaskContext

    task = tasks.get(order.task)
    params = tasks.validate_params(task, order.params)
    with backend.slot(slot):
        clock = backend.phase_clock()
        host_inputs = io.host_inputs(order, maps)
        device_inputs = {name: backend.to_device(a) for name, a in host_inputs.items()}
        clock.mark("h2d_ms")
        space = (
            None if order.output_region is None else regions.OutputSpace(order.output_region, maps)
        )
        ctx = TaskContext(
            backend.xp,
            backend.name,
            info.device,
            device_inputs,
            cancelled,
            info.as_dict(),
            backend.task_runtime(),
            space if backend.computes_in_host_memory else None,  # outputs computed in place
        )
        output = task.body_for(backend.name)(ctx, params)
        clock.mark("kernel_ms")
        outputs = _keep_outputs(backend, io, output.arrays, order, space)
        clock.mark("d2h_ms")
        backend.synchronize()  # the job's own faults surface here, inside the job
        timings = clock.timings_ms()
    return plain_summary(order.task, output.summary), outputs, timings


def _keep_outputs(
    backend: Backend,
    io: JobIO,
    arrays: dict[str, Any],
    order: msg.RunJob,
    space: regions.OutputSpace | None,
) -> dict[str, msg.OutputFile]:
    if space is not None:  # into the client's own memory: in place, else one copy in
        moved = "copy" if backend.computes_in_host_memory else "d2h"
        placed = regions.write_outputs(backend.to_host, arrays, space, moved)
        return {
            name: msg.OutputFile(name, shape, dtype, nbytes, offset, written)
            for name, (offset, shape, dtype, nbytes, written) in placed.items()
        }
    return io.keep_outputs(backend, arrays, order.output_dir) if order.output_dir else {}


def plain_summary(task: str, summary: Any) -> dict[str, Any]:
    """The summary as plain JSON values (numpy scalars and arrays become numbers and lists).

    The daemon stores and answers a result as JSON: a value it cannot write must fail this
    job here, in the worker, and never reach the job store, whose commits it would break."""
    import orjson

    try:
        plain = orjson.loads(
            orjson.dumps(summary, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        )
    except TypeError as exc:  # orjson.JSONEncodeError is one
        raise BadSummary(
            f"{task} returned a summary that is not JSON: {exc}",
            "return plain numbers, strings, lists and dicts in TaskOutput.summary "
            "(float(x), int(x), x.tolist())",
        ) from None
    if not isinstance(plain, dict):
        raise BadSummary(
            f"{task} returned a {type(summary).__name__} as its summary, not a dict",
            "return TaskOutput(summary={...})",
        )
    return plain


def _task_error(
    backend: Backend, info: DeviceInfo, order: msg.RunJob, started: float, exc: Exception
) -> msg.JobFinished:
    from taogpud.errors import TaogpudError

    if isinstance(exc, TaogpudError):  # unknown task or bad params reaching a worker
        return _failed(order, started, exc.code, exc.message, exc.hint)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return _failed(
            order,
            started,
            "no_space_for_outputs",
            f"no space left to keep the outputs of {order.task} in {order.output_dir}",
            "free space under the state directory, or submit without keeping outputs",
        )
    sticky = backend.sticky_error(exc)
    if sticky is not None:
        return _failed(
            order,
            started,
            backend.sticky_error_code,
            f"{order.task} left {info.device} unusable ({backend.name}): {sticky}; the worker "
            "restarts (jobs running beside it fail with worker_crashed)",
            "the job's kernel faulted (an illegal address, a failed launch): fix it and submit "
            "again; the daemon and the other devices were not affected",
        )
    if backend.is_out_of_memory(exc):
        backend.release_memory()
        cap_mib = info.memory_cap_bytes / 2**20
        return _failed(
            order,
            started,
            "out_of_device_memory",
            f"{order.task} ran out of memory on {info.device} (cap {cap_mib:.0f} MiB): {exc}",
            "use a smaller size, or raise gpu.memoryFraction in settings.json",
        )
    return _failed(
        order,
        started,
        "task_failed",
        f"{order.task} raised {type(exc).__name__}: {exc}",
        "check the params; the worker log has the traceback",
    )


def _failed(
    order: msg.RunJob, started: float, code: str, message: str, hint: str
) -> msg.JobFinished:
    status = "cancelled" if code == "cancelled" else "failed"
    return msg.JobFinished(order.job_id, status, _ms_since(started), error=(code, message, hint))


def map_input(ref: images.ArrayRef | regions.RegionRef, maps: list[mmap.mmap]) -> Any:
    """A read-only numpy view of a shared .npy image or of a client's region: no copy."""
    import numpy as np

    if isinstance(ref, regions.RegionRef):  # the seam: an array in a client's own memory
        return regions.map_region(ref, maps)

    mapped = images.open_map(ref)
    maps.append(mapped)
    count = math.prod(ref.shape)
    flat = np.frombuffer(mapped, dtype=np.dtype(ref.dtype), count=count, offset=ref.header_bytes)
    return flat.reshape(ref.shape)


def write_outputs(
    backend: Backend, arrays: dict[str, Any], output_dir: str
) -> dict[str, msg.OutputFile]:
    """Each output as NAME.npy in the job's output directory under the state directory.

    Written to a temporary name and renamed, so a download never sees half a file and a
    full disk leaves nothing behind."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return {
        name: write_output(folder, name, backend.to_host(array)) for name, array in arrays.items()
    }


def write_output(folder: Path, name: str, array: Any) -> msg.OutputFile:
    import numpy as np

    if not OUTPUT_NAME.fullmatch(name):
        raise ValueError(f"output name {name!r} is not allowed (letters, digits, _ . - only)")
    host = np.asarray(array, order="C")  # keeps 0-d (ascontiguousarray would not)
    partial = folder / f".{name}.npy.partial"
    try:
        # Written by hand, not np.save: numpy's writer drops errno, and ENOSPC must show.
        with partial.open("wb") as file:
            file.write(wire.npy_header(tuple(host.shape), host.dtype.str))
            file.write(host.data.cast("B") if host.ndim else host.tobytes())
        partial.rename(folder / f"{name}.npy")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return msg.OutputFile(name, tuple(host.shape), host.dtype.str, host.nbytes)


def _close_all(maps: list[mmap.mmap]) -> None:
    for mapped in maps:
        # A view may still live (a task kept a reference); the map then closes when collected.
        with contextlib.suppress(BufferError):
            mapped.close()


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3
