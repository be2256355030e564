"""The Ray executor's data path, in the daemon: inputs into the object store, outputs to disk.

Each input array is put into Ray's object store once while any running job uses it (from its
/dev/shm image: a read-only map, one copy into the store); the actor fetches it, without a
copy when it shares the daemon's node. Kept outputs come back as arrays in the call's result
and are written here as state/outputs/<job>/<name>.npy, by the local worker's own writer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import mmap
from pathlib import Path
from typing import Any

import ray

from taogpud.arrayfiles import images
from taogpud.pool import protocol as msg
from taogpud.pool.execute import map_input, write_output
from taogpud.pool.ray_calls import first_line


class InputCache:
    """Each input array in the object store once while any running job uses it.

    The put copies the /dev/shm image into the store (a read-only map, no other copy);
    jobs that start while it runs wait for the same put; the last job using it drops the
    ref and Ray frees the object."""

    def __init__(self) -> None:
        self._refs: dict[str, tuple[asyncio.Future[Any], int]] = {}  # shm name → (put, users)

    async def acquire(self, inputs: dict[str, images.ArrayRef]) -> dict[str, Any]:
        taken: list[images.ArrayRef] = []
        found = {}
        try:
            for name, ref in inputs.items():
                put, users = self._refs.get(ref.name, (None, 0))
                if put is None:
                    put = asyncio.ensure_future(asyncio.to_thread(_put_image, ref))
                self._refs[ref.name] = (put, users + 1)
                taken.append(ref)
                found[name] = await put
        except BaseException:
            self._release(taken)
            raise
        return found

    def release(self, inputs: dict[str, images.ArrayRef]) -> None:
        self._release(list(inputs.values()))

    def _release(self, refs: list[images.ArrayRef]) -> None:
        for ref in refs:
            put, users = self._refs.get(ref.name, (None, 0))
            if put is None:
                continue
            if users <= 1:
                del self._refs[ref.name]
            else:
                self._refs[ref.name] = (put, users - 1)


def _put_image(ref: images.ArrayRef) -> Any:
    maps: list[mmap.mmap] = []
    try:
        return ray.put(map_input(ref, maps))
    finally:
        for mapped in maps:
            mapped.close()


def keep_outputs(
    finished: msg.JobFinished, kept: dict[str, Any], output_dir: str
) -> msg.JobFinished:
    """Write the arrays an actor returned as the job's .npy outputs (a thread: disk I/O)."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = {name: write_output(folder, name, array) for name, array in kept.items()}
    return dataclasses.replace(finished, outputs=written)


def failed(job_id: str, exc: Exception) -> msg.JobFinished:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        error = (
            "no_space_for_outputs",
            f"no space left to keep the outputs: {exc}",
            "free space under the state directory, or submit without keeping outputs",
        )
    else:
        error = (
            "executor_failed",
            f"the Ray executor failed to run the job: {type(exc).__name__}: {first_line(exc)}",
            "check the daemon log and `ray status`; submit it again",
        )
    return msg.JobFinished(job_id, "failed", 0.0, error=error)
