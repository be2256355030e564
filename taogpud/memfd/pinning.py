"""A CUDA worker registers the client memory it maps as pinned host memory (cudaHostRegister),
so a copy from it to the device is one DMA at link speed, not CuPy's memcpy into a pinned
staging buffer followed by the DMA (cupy.asarray copies straight from host memory it finds
pinned, cudaPointerGetAttributes saying so).

What is registered: each span a job reads, rounded out to whole pages, once — kept with the
mapping for every later job that reads inside it, and unregistered just before the mapping
goes (regions.MappedMemories, when the client has left and no job uses it). Not the whole
mapping: cudaHostRegister pins every page of its range and faults in the ones the client
never allocated, so a 1 GiB memfd a client used 8 MiB of would cost the daemon's cgroup
1 GiB of pinned memory (and ~3 µs a page of faults); the pages of a span a job reads are
the client's own (its Arena allocates them as it hands them out), and the job reads them
anyway. A span that overlaps spans registered before is registered as their union when no
other job uses the mapping (none can be copying from what is unregistered), and read
pageable otherwise.

A registration that fails (the driver's limits, a device without host registration, the
worker's PINNED_LIMIT_BYTES reached) leaves that memory's copies pageable, with one trace
line; it never fails a job. Everything here runs under MappedMemories' lock.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

# (address, nbytes, read_only) → its unregister; raises when the memory cannot be registered
Pin = Callable[[int, int, bool], Callable[[], None]]
PAGE = mmap.PAGESIZE
PINNED_LIMIT_BYTES = 8 << 30  # per worker: the array store's per-uid budget at its largest


class Pinner:
    """A worker's way to pin host memory (its backend's), and how much it holds pinned now."""

    def __init__(self, pin: Pin, limit_bytes: int = PINNED_LIMIT_BYTES) -> None:
        self.pin = pin
        self.limit_bytes = limit_bytes
        self.pinned_bytes = 0


class PinnedSpans:
    """The spans of one mapping registered now, by (start, end) offset, with their unpin."""

    def __init__(self, pinner: Pinner, mapping: mmap.mmap, read_only: bool) -> None:
        self._pinner = pinner
        self._base = _address_of(mapping)
        self._size = -(-len(mapping) // PAGE) * PAGE
        self._read_only = read_only
        self._spans: dict[tuple[int, int], Callable[[], None]] = {}
        self.failed: str | None = None  # why this memory is copied pageable from now on

    @property
    def spans(self) -> list[tuple[int, int]]:
        return sorted(self._spans)

    def ensure(self, offset: int, nbytes: int, alone: bool) -> None:
        """Bytes [offset, offset + nbytes) pinned, unless they are already, or cannot be.
        `alone`: no other job uses the mapping now, so spans may be unregistered."""
        start, end = offset // PAGE * PAGE, min(-(-(offset + nbytes) // PAGE) * PAGE, self._size)
        if self.failed is not None or end <= start:
            return
        if any(s <= start and end <= e for s, e in self._spans):
            return  # warm: registered by an earlier job
        overlapping = [span for span in self._spans if span[0] < end and start < span[1]]
        if overlapping and not alone:
            return  # another job may be copying from them: pageable this once
        for span in overlapping:
            start, end = min(start, span[0]), max(end, span[1])
            self._unpin(span)
        self._pin(start, end)

    def release_all(self) -> None:
        """Unregister every span: called before the mapping is unmapped."""
        for span in list(self._spans):
            self._unpin(span)

    def _pin(self, start: int, end: int) -> None:
        pinner = self._pinner
        if pinner.pinned_bytes + end - start > pinner.limit_bytes:
            self._give_up(
                start, end, f"the worker holds {pinner.pinned_bytes} bytes pinned, its limit is "
                f"{pinner.limit_bytes}",
            )  # fmt: skip
            return
        try:
            self._spans[(start, end)] = pinner.pin(self._base + start, end - start, self._read_only)
        except Exception as exc:  # the driver's reason: this memory stays pageable
            self._give_up(start, end, f"{type(exc).__name__}: {exc}")
            return
        pinner.pinned_bytes += end - start

    def _unpin(self, span: tuple[int, int]) -> None:
        unpin = self._spans.pop(span)
        self._pinner.pinned_bytes -= span[1] - span[0]
        try:
            unpin()
        except Exception as exc:  # nothing to do about it but say so
            _log().warning("shm.unpin_failed", bytes=span[1] - span[0], error=str(exc))

    def _give_up(self, start: int, end: int, why: str) -> None:
        self.failed = why
        _log().warning(
            "shm.pin_failed", bytes=end - start, read_only=self._read_only, error=why,
            fallback="pageable copies from this client memory",
        )  # fmt: skip


def _log() -> Any:
    from taogpud.observability.logging import (
        get_logger,  # here: regions (and the pipe's messages) stay light
    )

    return get_logger("taogpud.worker")


def _address_of(mapping: mmap.mmap) -> int:
    """Where the mapping starts in this process (read-only ones too, which ctypes refuses)."""
    import numpy as np

    view: Any = np.frombuffer(mapping, np.uint8, count=1)
    address: int = view.__array_interface__["data"][0]
    del view
    return address


def install(pin: Pin | None) -> None:
    """This worker's backend pins the client memory it maps (None: nothing to pin, cpu)."""
    from taogpud.memfd import regions

    regions.MAPPED.pinner = None if pin is None else Pinner(pin)
