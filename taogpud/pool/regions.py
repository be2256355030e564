"""Arrays in a client's own memory (a memfd it handed to the daemon), as a worker sees them.

The daemon holds the client's descriptor and never maps it. A worker runs as the daemon's
uid, so it opens the same memory through /proc/<daemon pid>/fd/<n>: nothing but the
numbers crosses the worker pipe (no descriptor passing on a pipe that also carries pickled
messages), and the daemon keeps that descriptor open for as long as a queued or running job
names it. The worker checks the file it opened is the one the daemon vetted (device and
inode), so a descriptor number the daemon reused can never give it other memory.

Each job maps only its regions, with MAP_POPULATE (page tables filled in one call instead
of a fault a page), and unmaps them when it ends: a mapping kept past the job would keep a
departed client's memory alive in the worker.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from typing import Any

from taogpud.errors import TaogpudError

OUTPUT_ALIGN = 64  # each output starts on a cache line


class RegionError(TaogpudError):
    """The client's memory is not what the daemon vetted, or the outputs do not fit."""

    code = "bad_region"
    http_status = 400


@dataclass(frozen=True)
class MemoryHandle:
    """A client memfd as the daemon holds it: where a worker finds it and what it must be."""

    pid: int  # the daemon's pid: /proc/<pid>/fd/<fd>
    fd: int
    dev: int
    ino: int
    size: int
    writable: bool  # False: a write-sealed handover, mapped read-only everywhere


@dataclass(frozen=True)
class RegionRef:
    """An array (or, with dtype "|u1" and shape (n,), a span of bytes) in a client's memory."""

    memory: MemoryHandle
    offset: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def view(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes}


def open_memory(memory: MemoryHandle, write: bool) -> int:
    """A descriptor for the memory the daemon holds; RegionError if it is not that memory."""
    flags = os.O_RDWR if write else os.O_RDONLY
    try:
        fd = os.open(f"/proc/{memory.pid}/fd/{memory.fd}", flags | os.O_CLOEXEC)
    except OSError as exc:
        raise RegionError(
            f"the client's memory is gone ({exc.strerror})", "the client hung up; submit again"
        ) from None
    stat = os.fstat(fd)
    if (stat.st_dev, stat.st_ino) != (memory.dev, memory.ino):
        os.close(fd)
        raise RegionError("the client's memory is gone", "the client hung up; submit again")
    return fd


def map_span(memory: MemoryHandle, offset: int, nbytes: int, write: bool) -> tuple[mmap.mmap, int]:
    """(a mapping covering [offset, offset+nbytes), where offset lies in it)."""
    fd = open_memory(memory, write)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapped = mmap.mmap(
            fd,
            max(offset + nbytes - start, 1),
            flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
            prot=mmap.PROT_READ | (mmap.PROT_WRITE if write else 0),
            offset=start,
        )
    finally:
        os.close(fd)
    return mapped, offset - start


def map_region(ref: RegionRef, maps: list[mmap.mmap]) -> Any:
    """A read-only numpy view of an input region: no copy."""
    import numpy as np

    mapped, delta = map_span(ref.memory, ref.offset, ref.nbytes, write=False)
    maps.append(mapped)
    flat = np.frombuffer(mapped, np.dtype(ref.dtype), count=math.prod(ref.shape), offset=delta)
    return flat.reshape(ref.shape)


def write_outputs(
    to_host: Any, arrays: dict[str, Any], region: RegionRef, maps: list[mmap.mmap]
) -> dict[str, tuple[int, tuple[int, ...], str, int]]:
    """Each output copied into the output region, one after another (64-byte aligned):
    name → (offset in the memory, shape, dtype, nbytes)."""
    import numpy as np

    hosts = {name: np.asarray(to_host(array), order="C") for name, array in arrays.items()}
    layout, end = {}, 0
    for name, host in hosts.items():
        layout[name] = end
        end += -(-host.nbytes // OUTPUT_ALIGN) * OUTPUT_ALIGN
    if end > region.nbytes:
        sizes = ", ".join(f"{n} {h.nbytes} bytes" for n, h in hosts.items())
        raise RegionError(
            f"the outputs need {end} bytes ({sizes}); the output region has {region.nbytes}",
            "give the job a larger output region",
        )
    mapped, delta = map_span(region.memory, region.offset, max(end, 1), write=True)
    maps.append(mapped)
    placed = {}
    for name, host in hosts.items():
        start = delta + layout[name]
        target = np.frombuffer(mapped, host.dtype, count=host.size, offset=start)
        target[...] = host.reshape(-1)
        placed[name] = (
            region.offset + layout[name],
            tuple(host.shape),
            host.dtype.str,
            host.nbytes,
        )
    return placed
