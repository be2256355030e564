"""The daemon's arrays: uploaded inputs, as shared .npy images.

Each array belongs to the uid that uploaded it (SO_PEERCRED): only that user (or root, or
group taogpu-admin) may use it as a job's input, and another user's id is answered exactly
as an unknown one, so ids cannot be probed.

Bounded by bytes, twice. All arrays together stay within `budget_bytes`; each user's
*pending* arrays (held, and used by no queued or running job) within `user_quota_bytes`.
An upload counts from the moment its header is read: its declared size is *reserved*
against both bounds before its file is made, and given back when it ends, however it ends
(stored, refused, or the client gone mid-body: its partial file is then removed). So a
client holding uploads open takes no more of /dev/shm than the bounds allow.
An array a queued or running job uses is pinned and never evicted. An upload makes room
by evicting only its own owner's pending arrays, oldest first; never another user's. When
that is not enough the upload is refused with the numbers, instead of /dev/shm filling up.
The store remembers them, so a restarted daemon takes back what /dev/shm still
holds (everything but after a reboot) and queued jobs keep their inputs.

Only plain numbers are taken: booleans, integers, floats and complex numbers of any size
and byte order; object, structured, string, void and datetime dtypes are refused at upload.
A job whose task has a `dtype` param takes only inputs of that dtype (`check_dtypes`).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from taogpud.arrayfiles import images
from taogpud.arrayfiles.images import ArrayRef
from taogpud.config import ConfigSnapshot
from taogpud.errors import (
    ArrayStoreFull,
    ArrayTooLarge,
    BadArray,
    BodyTooLarge,
    InvalidParams,
    MissingInput,
    RequestError,
    TaogpudError,
)
from taogpud.jobs.access import may_touch
from taogpud.jobs.records import Peer
from taogpud.jobs.store import JobStore

NUMERIC_KINDS = "biufc"  # numpy dtype kinds an upload may have
EVICTION = (
    "an upload first evicts its own owner's pending arrays, oldest first, until the owner's "
    "pending bytes and uploads in progress fit user_quota_bytes and all arrays and uploads in "
    "progress fit budget_bytes; it never evicts another user's array or one a queued or "
    "running job uses"
)


class ArrayStore:
    def __init__(
        self,
        budget_bytes: int,
        store: JobStore | None = None,
        namespace: str = "default",
        user_quota_bytes: int | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.user_quota_bytes = user_quota_bytes or default_quota_bytes(budget_bytes)
        self.namespace = namespace  # images.namespace_of(state directory)
        self._store = store  # remembers which images are ours across a daemon restart
        self._arrays: OrderedDict[str, ArrayRef] = OrderedDict()
        self._pins: dict[str, int] = {}
        self._reserved: Counter[int | None] = Counter()  # uploads in progress, by owner uid
        self.used_bytes = 0

    @property
    def reserved_bytes(self) -> int:
        """What uploads still in progress have reserved (their declared sizes)."""
        return sum(self._reserved.values())

    def get(self, array_id: str) -> ArrayRef | None:
        return self._arrays.get(array_id)

    def get_for(self, array_id: str, peer: Peer) -> ArrayRef | None:
        """The array if `peer` may use it; None when it is unknown *or* someone else's."""
        ref = self._arrays.get(array_id)
        return ref if ref is not None and may_touch(ref.owner_uid, peer) else None

    def inputs_for(self, peer: Peer, inputs: dict[str, str]) -> dict[str, ArrayRef]:
        """The job's input arrays, each one the submitter may use; else MissingInput, the
        same answer for an id that never existed and for another user's."""
        refs = {}
        for name, array_id in inputs.items():
            ref = self.get_for(array_id, peer)
            if ref is None:
                raise MissingInput(
                    f"input {name!r}: no array with id {array_id!r}",
                    "upload it first (POST /v1/arrays, or taogpuctl submit --input "
                    "NAME=FILE.npy); past your upload quota your oldest unused uploads go",
                )
            refs[name] = ref
        return refs

    def pending_bytes(self, owner_uid: int | None) -> int:
        """What `owner_uid`'s pending arrays (used by no queued or running job) hold."""
        return sum(_size(ref) for _, ref in self._pending_of(owner_uid))

    def restore(self) -> None:
        """Take back the uploads a previous run left in /dev/shm, then sweep what is not ours."""
        if self._store is not None:
            for array_id, fields in self._store.arrays().items():
                ref = ArrayRef(**{**fields, "shape": tuple(fields["shape"])})
                if ref.path.exists():
                    self._add(array_id, ref)
                else:
                    self._store.delete_array(array_id)
        images.sweep_orphans(self.namespace, keep={ref.name for ref in self._arrays.values()})

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
            images.unlink(ref.name)
            if self._store is not None:
                self._store.delete_array(array_id)

    def release_unused(self) -> int:
        """At a clean stop: keep only the uploads queued jobs still need (the store knows them)."""
        unused = [array_id for array_id in self._arrays if array_id not in self._pins]
        for array_id in unused:
            self.remove(array_id)
        return len(unused)

    async def upload(
        self,
        body: AsyncIterator[bytes],
        max_bytes: int,
        owner: Peer | None = None,
    ) -> tuple[str, ArrayRef]:
        """Stream a request body (.npy) straight into shared memory, each piece written
        (pwrite) at its offset as it arrives. The array belongs to `owner`."""
        owner_uid = owner.uid if owner is not None else None
        chunks = _Chunks(body)
        shape, dtype, header_bytes = _read_header(await chunks.read_head())
        total = header_bytes + _data_bytes(shape, dtype)
        if total > max_bytes:
            raise RequestError(
                f"array of {total - header_bytes} bytes is larger than the upload limit of "
                f"{max_bytes} bytes",
                "split the input, or raise the limit",
            )
        self._make_room(total, owner_uid)
        with self._reserving(total, owner_uid):  # no await between the check and this
            name = await self._receive(chunks, total, max_bytes)
            ref = ArrayRef(name, shape, dtype, header_bytes, total - header_bytes, owner_uid)
            array_id = "a" + secrets.token_hex(8)
            self._add(array_id, ref)
        return array_id, ref

    async def _receive(self, chunks: _Chunks, total: int, max_bytes: int) -> str:
        """The body written into a new image of `total` bytes: its name. On any failure
        (a short or long body, the client gone, a cancelled request) the image is removed."""
        name, fd = self._create(total)
        try:
            written = await chunks.write_into(fd, total)
            if written != total:
                raise _wrong_length(written, total, max_bytes)
        except BaseException:
            images.unlink(name)
            raise
        finally:
            os.close(fd)
        return name

    @contextmanager
    def _reserving(self, nbytes: int, owner_uid: int | None) -> Iterator[None]:
        self._reserved[owner_uid] += nbytes
        try:
            yield
        finally:
            self._reserved[owner_uid] -= nbytes
            if self._reserved[owner_uid] <= 0:
                del self._reserved[owner_uid]

    def _add(self, array_id: str, ref: ArrayRef) -> None:
        if self._store is not None:  # first: a full disk refuses the upload (StateDiskFull)
            self._store.put_array(array_id, dataclasses.asdict(ref))
        self._arrays[array_id] = ref
        self.used_bytes += ref.header_bytes + ref.nbytes

    def _create(self, total_bytes: int) -> tuple[str, Any]:
        try:
            return images.create(total_bytes, self.namespace, os.getpid())
        except OSError as exc:  # /dev/shm itself is full (other users of it, a small tmpfs)
            raise ArrayStoreFull(
                f"no room in {images.SHM_DIR} for {total_bytes} bytes: {exc.strerror}",
                "free memory in /dev/shm, or send a smaller array",
            ) from None

    def _pending_of(self, owner_uid: int | None) -> list[tuple[str, ArrayRef]]:
        """The owner's pending arrays, oldest first."""
        return [
            (array_id, ref)
            for array_id, ref in self._arrays.items()
            if ref.owner_uid == owner_uid and array_id not in self._pins
        ]

    def _make_room(self, needed: int, owner_uid: int | None) -> None:
        """Room for `needed` bytes of `owner_uid`'s: see EVICTION. Refused before anything
        is evicted when evicting all the owner's pending arrays would not make enough."""
        self._check_room(needed, owner_uid)
        for array_id, _ in self._pending_of(owner_uid):
            if self._fits(needed, owner_uid):
                return
            self.remove(array_id)

    def _fits(self, needed: int, owner_uid: int | None) -> bool:
        owners = self.pending_bytes(owner_uid) + self._reserved[owner_uid]
        return owners + needed <= self.user_quota_bytes and self._in_use() + needed <= (
            self.budget_bytes
        )

    def _in_use(self) -> int:
        """What /dev/shm holds for us, or will once uploads in progress are in."""
        return self.used_bytes + self.reserved_bytes

    def _check_room(self, needed: int, owner_uid: int | None) -> None:
        quota = self.user_quota_bytes
        if needed > quota:
            raise ArrayTooLarge(
                f"an array of {needed} bytes is larger than the upload quota of {quota} bytes "
                "per user",
                "split the input, or ask the administrator to raise memory.upload_quota_mb",
            )
        if needed > self.budget_bytes:
            raise ArrayTooLarge(
                f"an array of {needed} bytes is larger than the whole array budget of "
                f"{self.budget_bytes} bytes",
                "split the input, or ask the administrator to raise memory.array_budget_mb",
            )
        in_progress = self._reserved[owner_uid]
        if in_progress + needed > quota:
            raise ArrayStoreFull(
                f"an array of {needed} bytes does not fit the upload quota of {quota} bytes per "
                f"user: your uploads still in progress have reserved {in_progress} bytes",
                "finish or close those uploads first, or send a smaller array",
            )
        if self._in_use() - self.pending_bytes(owner_uid) + needed > self.budget_bytes:
            raise ArrayStoreFull(
                f"no room for {needed} bytes: of the {self.budget_bytes} bytes of the budget, "
                f"{self.used_bytes} are held by arrays that queued or running jobs use and "
                f"other users' uploads, and {self.reserved_bytes} are reserved by uploads "
                "still in progress",
                "wait for running jobs and uploads to finish, or send smaller arrays",
            )

    def view(self, peer: Peer) -> dict[str, Any]:
        """The bounds as `status` shows them, with the caller's own pending bytes."""
        return {
            "budget_bytes": self.budget_bytes,
            "used_bytes": self.used_bytes,
            "user_quota_bytes": self.user_quota_bytes,
            "your_pending_bytes": self.pending_bytes(peer.uid),
            "reserved_bytes": self.reserved_bytes,
            "your_reserved_bytes": self._reserved[peer.uid],
            "eviction": EVICTION,
        }


def array_budget_bytes(snapshot: ConfigSnapshot) -> int:
    """memory.array_budget_mb, else half of /dev/shm, at most 8 GiB; never more than /dev/shm
    holds. Uploads and kept outputs live there, and it is memory."""
    stat = os.statvfs(images.SHM_DIR)
    shm_bytes = stat.f_blocks * stat.f_frsize
    budget_mb = snapshot.config.memory.array_budget_mb
    return min(budget_mb << 20, shm_bytes) if budget_mb else min(shm_bytes // 2, 8 << 30)


def upload_quota_bytes(snapshot: ConfigSnapshot, arrays: ArrayStore) -> int:
    """memory.upload_quota_mb, or the default for the store's budget."""
    quota_mb = snapshot.config.memory.upload_quota_mb
    return quota_mb << 20 if quota_mb else default_quota_bytes(arrays.budget_bytes)


def default_quota_bytes(budget_bytes: int) -> int:
    """A quarter of the budget: four users' pending uploads at the quota still fit."""
    return max(budget_bytes // 4, 1)


def checked_dtype(dtype: Any) -> str:
    """The .npy header's dtype (numpy's reader made it from the descr) as numpy's dtype string
    ("<f4"), if it is a plain number type; else BadArray naming it. Judged here, in the
    daemon: an object dtype never reaches a worker."""
    if dtype.hasobject or dtype.kind not in NUMERIC_KINDS:
        raise BadArray(
            f".npy descr {dtype.descr!r} is {dtype}: only plain numbers are taken (booleans, "
            "integers, floats, complex), not objects, structures, strings or dates"
        )
    return str(dtype.str)


class HasDtype(Protocol):
    """An input as the dtype rule sees it: an uploaded array or a region of client memory."""

    @property
    def dtype(self) -> str: ...


def check_dtypes(task: str, job_dtype: str | None, refs: Mapping[str, HasDtype]) -> None:
    """The one rule for every task: an input of a job with a `dtype` param has that dtype.
    Never converted (float64 computed as float32 would lose precision without a word)."""
    if job_dtype is None:
        return  # the task takes its inputs as they are
    import numpy as np

    try:
        wanted = np.dtype(job_dtype)
    except TypeError:  # a plug-in's `dtype` that is no numpy dtype: not ours to judge
        return
    for name, ref in refs.items():
        given = np.dtype(ref.dtype)
        if given.newbyteorder("=") != wanted:
            raise InvalidParams(
                f"{task}: input {name!r} is {given}, the job's dtype is {wanted}",
                f"submit with dtype={given} (--param dtype={given}) if {task} takes it, or "
                f"upload the array as {wanted}",
            )


def _read_header(head: bytes) -> tuple[tuple[int, ...], str, int]:
    """(shape, dtype, header length) of an upload, or the 400 that says what is wrong."""
    try:
        shape, dtype, header_bytes = images.parse_header(head)
        return shape, checked_dtype(dtype), header_bytes
    except BadArray as exc:
        raise RequestError(str(exc), "send the bytes numpy.save() writes") from None


def _wrong_length(written: int, total: int, max_bytes: int) -> TaogpudError:
    """A body whose length is not its header's: past the limit a 413 (a chunked body has no
    length to refuse it by before it is read), else a 400."""
    if written > max_bytes:
        return BodyTooLarge(
            f"the request body passed the upload limit of {max_bytes} bytes "
            f"({written} bytes; its .npy header says {total})",
            "send the file numpy.save() wrote",
        )
    return RequestError(
        f"the .npy body has {written} bytes, its header says {total}",
        "the upload was truncated or padded; send the file numpy.save() wrote",
    )


def _size(ref: ArrayRef) -> int:
    return ref.header_bytes + ref.nbytes


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

    async def write_into(self, fd: int, size: int) -> int:
        """Write the body into the file's first `size` bytes; returns the body's length (a
        longer body is counted, not written: the caller reports the mismatch)."""
        written = self._put(fd, size, 0, self._pending)
        async for chunk in self._body:
            written = self._put(fd, size, written, chunk)
        return written

    @staticmethod
    def _put(fd: int, size: int, offset: int, chunk: bytes | memoryview) -> int:
        end = offset + len(chunk)
        if end <= size:
            images.write_at(fd, chunk, offset)
        return end
