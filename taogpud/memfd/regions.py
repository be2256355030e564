"""Arrays in a client's own memory (a memfd it handed to the daemon), as a worker sees them.

The daemon holds the client's descriptor and never maps it. A worker runs as the daemon's
uid, so it opens the same memory through /proc/<daemon pid>/fd/<n>: nothing but the
numbers crosses the worker pipe (no descriptor passing on a pipe that also carries pickled
messages), and the daemon keeps that descriptor open for as long as a queued or running job
names it. The worker checks the file it opened is the one the daemon vetted (device and
inode), so a descriptor number the daemon reused can never give it other memory.

A worker maps a client's memory whole, once, and keeps the mapping across jobs (so a warm
array costs neither a mapping nor a page fault); it drops it once no job uses it and the
daemon no longer holds the memory (MappedMemories). A CUDA worker also registers the spans
its jobs copy to the device as pinned host memory, once, until the mapping goes (pinning.py).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taogpud.errors import RegionError
from taogpud.memfd.pinning import PinnedSpans, Pinner

OUTPUT_ALIGN = 64  # each output starts on a cache line


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


class _Mapped:
    """One client memory mapped whole in this worker, and how many running jobs use it."""

    def __init__(self, mapping: mmap.mmap, pins: PinnedSpans | None) -> None:
        self.mapping = mapping
        self.users = 0
        self.pins = pins  # a CUDA worker's registrations in it (pool/pinning.py)


class MappedMemories:
    """The client memories this worker has mapped, kept across jobs: a warm array costs no
    mapping at all (mapping 64 MiB with its page tables took ~19 ms here, a memcpy of it
    ~13 ms). A mapping is dropped once no job uses it and the daemon no longer holds the
    memory (its client left): checked at every job and by a sweep each SWEEP_S, so a
    departed client's memory is never kept alive here for long."""

    SWEEP_S = 1.0

    def __init__(self) -> None:
        self._mapped: dict[MemoryHandle, _Mapped] = {}
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self.pinner: Pinner | None = None  # set in a CUDA worker (pinning.install)

    def acquire(self, memory: MemoryHandle, span: tuple[int, int] | None = None) -> mmap.mmap:
        """The memory's mapping, for one job; `span` (offset, nbytes): bytes the job copies
        to the device, pinned on a CUDA worker."""
        with self._lock:
            self._sweep_locked()
            entry = self._mapped.get(memory)
            if entry is None:
                mapping = _map_whole(memory)
                pins = (
                    None
                    if self.pinner is None
                    else PinnedSpans(self.pinner, mapping, read_only=not memory.writable)
                )
                entry = self._mapped[memory] = _Mapped(mapping, pins)
            entry.users += 1
            if span is not None and entry.pins is not None:
                entry.pins.ensure(*span, alone=entry.users == 1)
            self._start_sweeper()
            return entry.mapping

    def release(self, memory: MemoryHandle) -> None:
        with self._lock:
            entry = self._mapped.get(memory)
            if entry is not None:
                entry.users -= 1

    def sweep(self) -> None:
        with self._lock:
            self._sweep_locked()

    def _sweep_locked(self) -> None:
        for memory, entry in list(self._mapped.items()):
            if entry.users == 0 and not still_held(memory):
                del self._mapped[memory]
                if entry.pins is not None:
                    entry.pins.release_all()  # before the pages go from this process
                with contextlib.suppress(BufferError):  # a task kept a view: closed when collected
                    entry.mapping.close()

    def _start_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep_forever, daemon=True)
            self._sweeper.start()

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(self.SWEEP_S)
            self.sweep()


MAPPED = MappedMemories()  # this worker's


class _Hold:
    """Closed with the job's maps (execute._close_all): the job no longer uses the memory."""

    def __init__(self, memory: MemoryHandle) -> None:
        self.memory = memory

    def close(self) -> None:
        MAPPED.release(self.memory)


def still_held(memory: MemoryHandle) -> bool:
    """Whether the daemon still holds that memory under that descriptor number."""
    try:
        stat = Path(f"/proc/{memory.pid}/fd/{memory.fd}").stat()
    except OSError:
        return False
    return (stat.st_dev, stat.st_ino) == (memory.dev, memory.ino)


def _map_whole(memory: MemoryHandle) -> mmap.mmap:
    fd = open_memory(memory, memory.writable)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if memory.writable else 0)
        return mmap.mmap(fd, max(memory.size, 1), flags=mmap.MAP_SHARED, prot=prot)
    finally:
        os.close(fd)


def map_span(
    memory: MemoryHandle, maps: list[Any], span: tuple[int, int] | None = None
) -> mmap.mmap:
    """The whole memory, mapped for this job (released with the job's maps)."""
    mapped = MAPPED.acquire(memory, span)
    maps.append(_Hold(memory))
    return mapped


def map_region(ref: RegionRef, maps: list[Any]) -> Any:
    """A read-only numpy view of an input region: no copy."""
    import numpy as np

    mapped = map_span(ref.memory, maps, (ref.offset, ref.nbytes))  # an input: pinned on cuda
    flat = np.frombuffer(mapped, np.dtype(ref.dtype), count=math.prod(ref.shape), offset=ref.offset)
    flat.flags.writeable = False  # a worker reads its inputs, never writes them
    return flat.reshape(ref.shape)


class OutputSpace:
    """A job's output region, handed out in 64-byte-aligned places one after another: first
    to the task (TaskContext.output, computed in place), then to the outputs it made
    elsewhere (copied in by write_outputs). Mapped on first use."""

    def __init__(self, region: RegionRef, maps: list[Any]) -> None:
        self.region, self._maps = region, maps
        self._mapped: mmap.mmap | None = None
        self.end = 0  # bytes of the region handed out
        self.claimed: dict[str, tuple[int, Any]] = {}  # name → (offset, the view the task got)

    def claim(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any | None:
        """A writable view for output `name`, or None where it does not fit (the task then
        computes elsewhere and write_outputs says how many bytes the outputs needed)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if name in self.claimed or self.end + _aligned(nbytes) > self.region.nbytes:
            return None
        self.claimed[name] = self.take(shape, dtype)
        return self.claimed[name][1]

    def take(self, shape: tuple[int, ...], dtype: Any) -> tuple[int, Any]:
        """The next place: (its offset in the memory, an ndarray over it)."""
        import numpy as np

        if self._mapped is None:
            self._mapped = map_span(self.region.memory, self._maps)
        count = math.prod(shape)
        offset = self.region.offset + self.end
        self.end += _aligned(count * dtype.itemsize)
        view = np.frombuffer(self._mapped, dtype, count=count, offset=offset).reshape(shape)
        return offset, view


def write_outputs(
    to_host: Any, arrays: dict[str, Any], space: OutputSpace, moved: str
) -> dict[str, tuple[int, tuple[int, ...], str, int, str]]:
    """Each output in the output region: where the task computed it in place ("in_place"),
    else copied into the next free place by `to_host(array, out=view)` (`moved`: "copy" from
    host memory, "d2h" straight from the device). name → (offset in the memory, shape,
    dtype, nbytes, how it got there)."""
    import numpy as np

    placed, elsewhere = {}, {}
    for name, array in arrays.items():
        offset, view = space.claimed.get(name, (0, None))
        if view is not None and _is_view(array, view):
            placed[name] = (offset, tuple(view.shape), view.dtype.str, view.nbytes)
        else:
            elsewhere[name] = array if hasattr(array, "dtype") else np.asarray(array)
    shapes = {name: (tuple(a.shape), np.dtype(a.dtype)) for name, a in elsewhere.items()}
    needed = space.end + sum(_aligned(math.prod(s) * d.itemsize) for s, d in shapes.values())
    if needed > space.region.nbytes:
        sizes = ", ".join(f"{n} {math.prod(s) * d.itemsize} bytes" for n, (s, d) in shapes.items())
        raise RegionError(
            f"the outputs need {needed} bytes ({sizes}); the output region has "
            f"{space.region.nbytes}",
            "give the job a larger output region",
        )
    written = dict.fromkeys(placed, "in_place")
    for name, (shape, dtype) in shapes.items():
        offset, view = space.take(shape, dtype)
        to_host(elsewhere[name], out=view)
        placed[name] = (offset, shape, dtype.str, view.nbytes)
        written[name] = moved
    return {name: (*placed[name], written[name]) for name in arrays}


def _is_view(array: Any, view: Any) -> bool:
    """Whether the task returned the very place it was given (not a copy or a reshape)."""
    if array is view:
        return True
    interface = getattr(array, "__array_interface__", None)
    return (
        interface is not None
        and interface["data"][0] == view.__array_interface__["data"][0]
        and tuple(array.shape) == view.shape
        and array.dtype == view.dtype
        and array.flags.c_contiguous
    )


def _aligned(nbytes: int) -> int:
    return -(-nbytes // OUTPUT_ALIGN) * OUTPUT_ALIGN
