"""The daemon's arrays: uploaded inputs and kept outputs, as shared .npy images.

Bounded by bytes. An array a queued or running job uses is pinned and never
evicted; past the budget the oldest unpinned arrays go first. When nothing can
be evicted the upload is refused with the numbers, instead of /dev/shm filling up.
The store remembers them, so a restarted daemon takes back what /dev/shm still
holds (everything but after a reboot) and queued jobs keep their inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from taogpud.errors import RequestError, TaogpudError
from taogpud.pool import shm
from taogpud.pool.shm import ArrayRef, BadArray
from taogpud.store import JobStore


class BodyTap(Protocol):
    """The connection's offer to hand the rest of a body over as it arrives (the daemon's
    HTTP protocol, api/protocol.py), instead of through 64 KiB ASGI messages."""

    def diverted(
        self, sink: Callable[[bytes | memoryview], None]
    ) -> AbstractContextManager[None]: ...


class ArrayStoreFull(TaogpudError):
    code = "array_store_full"
    http_status = 507


class ArrayStore:
    def __init__(
        self, budget_bytes: int, store: JobStore | None = None, namespace: str = "default"
    ) -> None:
        self.budget_bytes = budget_bytes
        self.namespace = namespace  # shm.namespace_of(state directory)
        self._store = store  # remembers which images are ours across a daemon restart
        self._arrays: OrderedDict[str, ArrayRef] = OrderedDict()
        self._pins: dict[str, int] = {}
        self.used_bytes = 0

    def get(self, array_id: str) -> ArrayRef | None:
        return self._arrays.get(array_id)

    def restore(self) -> None:
        """Take back the uploads a previous run left in /dev/shm, then sweep what is not ours."""
        if self._store is not None:
            for array_id, fields in self._store.arrays().items():
                ref = ArrayRef(**{**fields, "shape": tuple(fields["shape"])})
                if ref.path.exists():
                    self._add(array_id, ref)
                else:
                    self._store.delete_array(array_id)
        shm.sweep_orphans(self.namespace, keep={ref.name for ref in self._arrays.values()})

    def pin(self, array_ids: list[str]) -> None:
        for array_id in array_ids:
            self._pins[array_id] = self._pins.get(array_id, 0) + 1

    def unpin(self, array_ids: list[str]) -> None:
        for array_id in array_ids:
            left = self._pins.get(array_id, 0) - 1
            if left > 0:
                self._pins[array_id] = left
            else:
                self._pins.pop(array_id, None)

    def remove(self, array_id: str) -> None:
        ref = self._arrays.pop(array_id, None)
        if ref is not None:
            self.used_bytes -= ref.header_bytes + ref.nbytes
            shm.unlink(ref.name)
            if self._store is not None:
                self._store.delete_array(array_id)

    def release_unused(self) -> int:
        """At a clean stop: keep only the uploads queued jobs still need (the store knows them)."""
        unused = [array_id for array_id in self._arrays if array_id not in self._pins]
        for array_id in unused:
            self.remove(array_id)
        return len(unused)

    async def upload(
        self, body: AsyncIterator[bytes], max_bytes: int, tap: BodyTap | None = None
    ) -> tuple[str, ArrayRef]:
        """Stream a request body (.npy) straight into shared memory; with the connection's
        `tap`, the pieces after the header are copied there as they arrive."""
        chunks = _Chunks(body)
        head = await chunks.read_head()
        try:
            shape, dtype, header_bytes = shm.parse_header(head)
        except BadArray as exc:
            raise RequestError(str(exc), "send the bytes numpy.save() writes") from None
        nbytes = _data_bytes(shape, dtype)
        if header_bytes + nbytes > max_bytes:
            raise RequestError(
                f"array of {nbytes} bytes is larger than the upload limit of {max_bytes} bytes",
                "split the input, or raise the limit",
            )
        self._make_room(header_bytes + nbytes)
        name, fd = self._create(header_bytes + nbytes)
        try:
            written = await chunks.write_into(fd, header_bytes + nbytes, tap)
        except BaseException:
            shm.unlink(name)
            raise
        finally:
            os.close(fd)
        if written != header_bytes + nbytes:
            shm.unlink(name)
            raise RequestError(
                f"the .npy body has {written} bytes, its header says {header_bytes + nbytes}",
                "the upload was truncated or padded; send the file numpy.save() wrote",
            )
        ref = ArrayRef(name, shape, dtype, header_bytes, nbytes)
        array_id = "a" + secrets.token_hex(8)
        self._add(array_id, ref)
        return array_id, ref

    def _add(self, array_id: str, ref: ArrayRef) -> None:
        if self._store is not None:  # first: a full disk refuses the upload (StateDiskFull)
            self._store.put_array(array_id, dataclasses.asdict(ref))
        self._arrays[array_id] = ref
        self.used_bytes += ref.header_bytes + ref.nbytes

    def _create(self, total_bytes: int) -> tuple[str, Any]:
        try:
            return shm.create(total_bytes, self.namespace, os.getpid())
        except OSError as exc:  # /dev/shm itself is full (other users of it, a small tmpfs)
            raise ArrayStoreFull(
                f"no room in {shm.SHM_DIR} for {total_bytes} bytes: {exc.strerror}",
                "free memory in /dev/shm, or send a smaller array",
            ) from None

    def _make_room(self, needed: int) -> None:
        for array_id in [a for a in self._arrays if a not in self._pins]:
            if self.used_bytes + needed <= self.budget_bytes:
                return
            self.remove(array_id)
        if self.used_bytes + needed > self.budget_bytes:
            raise ArrayStoreFull(
                f"no room for {needed} bytes: {self.used_bytes} of {self.budget_bytes} bytes "
                "are held by arrays that queued or running jobs use",
                "wait for running jobs to finish, or send smaller arrays",
            )


def _data_bytes(shape: tuple[int, ...], dtype: str) -> int:
    import numpy as np

    count = 1
    for n in shape:
        count *= n
    return count * np.dtype(dtype).itemsize


class _Chunks:
    """Reads a body as it arrives: the head first (for the header), then the rest."""

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self._body = body
        self._pending = b""

    async def read_head(self) -> bytes:
        async for chunk in self._body:
            self._pending += chunk
            if len(self._pending) >= 4096:
                break
        return self._pending

    async def write_into(self, fd: int, size: int, tap: BodyTap | None) -> int:
        """Write the body into the file's first `size` bytes; returns the body's length (a
        longer body is counted, not written: the caller reports the mismatch)."""
        written = self._put(fd, size, 0, self._pending)

        def put(chunk: bytes | memoryview) -> None:
            nonlocal written
            written = self._put(fd, size, written, chunk)

        with tap.diverted(put) if tap is not None else contextlib.nullcontext():
            async for chunk in self._body:  # diverted: empty pieces until the body is whole
                put(chunk)
        return written

    @staticmethod
    def _put(fd: int, size: int, offset: int, chunk: bytes | memoryview) -> int:
        end = offset + len(chunk)
        if end <= size:
            shm.write_at(fd, chunk, offset)
        return end
