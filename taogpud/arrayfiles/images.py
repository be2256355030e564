"""Arrays between the daemon and its workers: .npy images in POSIX shared memory.

Each array is one file under /dev/shm holding a complete .npy image (header then
data), so the same bytes are what a client uploads, what a worker maps without a
copy, and what a download streams back. Only names cross the worker pipes.

Files, not `multiprocessing.shared_memory`: on Python 3.11 its resource tracker
unlinks segments a worker created when that worker exits, and warns about the
ones the daemon adopted. Names carry the daemon's pid so a restarted daemon can
sweep what a killed one left behind.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taogpud.errors import BadArray

SHM_DIR = Path("/dev/shm")
PREFIX = "taogpud."


@dataclass(frozen=True)
class ArrayRef:
    """A shared .npy image: picklable, a few dozen bytes on the pipe."""

    name: str  # file name under SHM_DIR
    shape: tuple[int, ...]
    dtype: str  # numpy dtype string, e.g. "<f4"
    header_bytes: int  # data starts here
    nbytes: int  # data bytes (the file is header_bytes + nbytes)
    owner_uid: int | None = None  # who uploaded it (SO_PEERCRED); only they may use it

    @property
    def path(self) -> Path:
        return SHM_DIR / self.name

    def view(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes}


def new_name(namespace: str, owner_pid: int) -> str:
    """taogpud.<namespace>.<pid>.<random>.npy: the namespace is the daemon's state directory."""
    return f"{PREFIX}{namespace}.{owner_pid}.{secrets.token_hex(8)}.npy"


def namespace_of(state_dir: Path) -> str:
    """Daemons with different state directories (user-mode ones, tests) never sweep each other."""
    return hashlib.sha256(str(state_dir.absolute()).encode()).hexdigest()[:12]


def parse_header(head: bytes) -> tuple[tuple[int, ...], Any, int]:
    """(shape, numpy dtype, header length) of a .npy image, read by numpy's own header reader
    (numpy.lib.format): a header numpy would not load is refused with numpy's reason, never
    reinterpreted. C order only. The dtype is not judged here (arrays.checked_dtype)."""
    from numpy.lib import format as npy_format

    stream = io.BytesIO(head)
    try:
        reader = _HEADER_READERS.get(npy_format.read_magic(stream))
        if reader is None:
            raise BadArray(f".npy format version {head[6]}.{head[7]} is not supported")
        shape, fortran, dtype = getattr(npy_format, reader)(stream)
    except ValueError as exc:  # numpy's every refusal: magic, keys, shape, descr, length
        raise BadArray(f".npy header refused by numpy: {exc}") from None
    except (RecursionError, MemoryError):  # e.g. thousands of unary minus signs
        raise BadArray(".npy header cannot be read: it nests too deeply") from None
    if fortran:
        raise BadArray("Fortran-ordered arrays are not supported; save with np.ascontiguousarray")
    if any(n < 0 for n in shape):  # numpy's reader takes these; no array has them
        raise BadArray(f"negative dimension in .npy header: shape {shape}")
    return shape, dtype, stream.tell()


# numpy.lib.format's public readers by version. 3.0 is 2.0 with a utf-8 header, which only
# structured dtypes' field names need (refused anyway): ASCII reads the same in latin-1.
_HEADER_READERS = {
    (1, 0): "read_array_header_1_0",
    (2, 0): "read_array_header_2_0",
    (3, 0): "read_array_header_2_0",
}


def create(total_bytes: int, namespace: str, owner_pid: int) -> tuple[str, int]:
    """A new shared file of total_bytes: (its name, a descriptor open for writing). The caller
    fills it with os.pwrite and closes the descriptor.

    The space is allocated up front, so a full /dev/shm is an OSError here, not halfway
    through. Written, not mapped: the kernel fills tmpfs pages without page tables or faults,
    300 ms for 512 MiB here against 500 ms for a populated mapping and a copy into it."""
    name = new_name(namespace, owner_pid)
    fd = os.open(SHM_DIR / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(total_bytes, 1))
    except OSError:
        os.close(fd)
        (SHM_DIR / name).unlink(missing_ok=True)
        raise
    return name, fd


def write_at(fd: int, data: bytes | memoryview, offset: int) -> None:
    """All of `data` at `offset` (pwrite may take less than it is given)."""
    with memoryview(data) as view:
        start = 0
        while start < len(view):
            start += os.pwrite(fd, view[start:], offset + start)


def open_map(ref: ArrayRef) -> mmap.mmap:
    """The image mapped read-only: a worker reads its inputs, never writes them."""
    fd = os.open(ref.path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, max(ref.header_bytes + ref.nbytes, 1), access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    (SHM_DIR / name).unlink(missing_ok=True)


def sweep_orphans(namespace: str, keep: set[str] | None = None) -> int:
    """Remove this namespace's arrays whose owning daemon is gone, except `keep` (ours again)."""
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}{namespace}.*.npy"):
        owner = path.name.split(".")[2]
        if path.name in (keep or set()):
            continue
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            path.unlink(missing_ok=True)
            removed += 1
    return removed
