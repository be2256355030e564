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
from typing import Any

from taogpud.backends.base import Backend, DeviceInfo
from taogpud.pool import protocol as msg
from taogpud.pool import shm

OUTPUT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # no path separators, no dotfiles


def execute(
    backend: Backend, info: DeviceInfo, order: msg.RunJob, cancelled: threading.Event, slot: int
) -> msg.JobFinished:
    from taogpud.tasks.base import JobCancelled

    started = time.perf_counter()
    maps: list[mmap.mmap] = []
    try:
        result, outputs, timings = _run_task(backend, info, order, cancelled, slot, maps)
        status = "cancelled" if cancelled.is_set() else "succeeded"
        return msg.JobFinished(
            order.job_id,
            status,
            _ms_since(started),
            result=result,
            outputs=outputs,
            timings=timings,
            evidence=backend.evidence(),
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
) -> tuple[dict[str, Any], dict[str, msg.OutputFile], dict[str, float]]:
    from taogpud import tasks
    from taogpud.tasks.base import TaskContext

    task = tasks.get(order.task)
    params = tasks.validate_params(task, order.params)
    with backend.slot(slot):
        t0 = time.perf_counter()
        host_inputs = {name: map_input(ref, maps) for name, ref in order.inputs.items()}
        device_inputs = {name: backend.to_device(a) for name, a in host_inputs.items()}
        backend.synchronize()
        t1 = time.perf_counter()
        ctx = TaskContext(
            backend.xp, backend.name, info.device, device_inputs, cancelled, info.as_dict()
        )
        output = task.body(ctx, params)
        backend.synchronize()
        t2 = time.perf_counter()
        outputs = (
            write_outputs(backend, output.arrays, order.output_dir) if order.output_dir else {}
        )
        t3 = time.perf_counter()
    timings = {"h2d_ms": (t1 - t0) * 1e3, "kernel_ms": (t2 - t1) * 1e3, "d2h_ms": (t3 - t2) * 1e3}
    return output.summary, outputs, timings


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


def map_input(ref: shm.ArrayRef, maps: list[mmap.mmap]) -> Any:
    """A read-only numpy view of a shared .npy image: no copy."""
    import numpy as np

    mapped = shm.open_map(ref)
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
            file.write(shm.npy_header(tuple(host.shape), host.dtype.str))
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
