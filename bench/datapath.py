"""Data path: array upload and download through taogpud beside memcpy and a raw Unix socket.

The same bytes (a float32 array's .npy image) in one run: numpy's copy into a warm buffer
(memcpy); writing them into a new /dev/shm file with no socket at all (the landing alone:
an upload can go no faster than the kernel fills fresh shared-memory pages); a raw AF_UNIX
stream to another process and back, landing in a warm buffer (the ceiling) and in fresh
memory (what an upload must fill: a new /dev/shm file, written from a warm 1 MiB buffer, the
fastest way found; what a download returns: new bytes); and taogpud's `Client.upload_array`
(from a numpy array, and from ready .npy bytes) and `Client.download_output` of a kept output
(vector_add's c). GiB/s of payload.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.daemon_under_test import Client
from bench.load import socket_server
from bench.stats import Spread

GIB = 1 << 30
LANDING_CHUNK = 1 << 20
UP, DOWN, UP_FRESH = 0, 1, 2
MEMCPY = "memcpy (numpy copyto into a warm buffer)"
SHM_FILL = "write into a new /dev/shm file, no socket (the landing alone)"
RAW_UP = "raw Unix socket, client → server, warm buffer"
RAW_UP_FRESH = "raw Unix socket, client → server, into a new /dev/shm file"
RAW_DOWN = "raw Unix socket, server → client, warm buffer"
RAW_DOWN_FRESH = "raw Unix socket, server → client, into new memory"
UPLOAD_ARRAY = "taogpud upload_array(ndarray)"
UPLOAD_BYTES = "taogpud upload_array(.npy bytes)"
DOWNLOAD = "taogpud download_output (kept output)"
METHODS = (
    MEMCPY, SHM_FILL, RAW_UP, RAW_UP_FRESH, RAW_DOWN, RAW_DOWN_FRESH,
    UPLOAD_ARRAY, UPLOAD_BYTES, DOWNLOAD,
)  # fmt: skip
# What each taogpud path is held against: the raw socket with a warm, then a fresh landing.
VERSUS = {
    UPLOAD_ARRAY: (RAW_UP, RAW_UP_FRESH),
    UPLOAD_BYTES: (RAW_UP, RAW_UP_FRESH),
    DOWNLOAD: (RAW_DOWN, RAW_DOWN_FRESH),
}


@dataclass(frozen=True)
class SizeResult:
    size_mib: int
    gib_per_s: dict[str, Spread]  # by method


def measure(socket_path: str, sizes_mib: list[int], repeats: int) -> list[SizeResult]:
    import numpy as np

    results = []
    for size_mib in sizes_mib:
        array = np.ones((size_mib << 20) // 4, dtype=np.float32)
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        npy = buffer.getvalue()
        seconds = {MEMCPY: _memcpy(array, repeats), SHM_FILL: _shm_fill(npy, repeats)}
        seconds.update(_raw_socket(npy, repeats))
        seconds.update(_taogpud(socket_path, array, npy, repeats))
        rates = {k: Spread.of(array.nbytes / s / GIB for s in v) for k, v in seconds.items()}
        results.append(SizeResult(size_mib, rates))
        del array, npy, buffer
    return results


def _memcpy(array: Any, repeats: int) -> list[float]:
    import numpy as np

    target = np.empty_like(array)
    np.copyto(target, array)  # fault the pages in first
    return [_seconds(lambda: np.copyto(target, array)) for _ in range(repeats)]


def _shm_fill(npy: bytes, repeats: int) -> list[float]:
    """The same number of bytes written from one warm 1 MiB buffer: the pages' cost alone."""
    piece = bytes(LANDING_CHUNK)

    def fill() -> None:
        with _new_shm_file(len(npy)) as fd:
            for start in range(0, len(npy), LANDING_CHUNK):
                os.pwrite(fd, piece[: len(npy) - start], start)

    return [_seconds(fill) for _ in range(repeats)]


def _taogpud(socket_path: str, array: Any, npy: bytes, repeats: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {UPLOAD_ARRAY: [], UPLOAD_BYTES: [], DOWNLOAD: []}
    with Client(socket_path, timeout_s=600) as client:
        for _ in range(repeats):
            ids = {}
            for method, body, name in ((UPLOAD_ARRAY, array, "a"), (UPLOAD_BYTES, npy, "b")):
                started = time.perf_counter()
                ids[name] = client.upload_array(body)["id"]
                seconds[method].append(time.perf_counter() - started)
            job = client.run("vector_add", inputs=ids, keep_outputs=True)
            if job["status"] != "succeeded":
                raise RuntimeError(f"vector_add did not succeed: {job}")
            started = time.perf_counter()
            received = client.download_output(job["id"], "c")
            seconds[DOWNLOAD].append(time.perf_counter() - started)
            if len(received) != len(npy):
                raise RuntimeError(f"downloaded {len(received)} bytes, expected {len(npy)}")
    return seconds


def _seconds(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


# -- the raw socket: a process that reads into (or writes from) a warm buffer ---------------


def _raw_socket(npy: bytes, repeats: int) -> dict[str, list[float]]:
    warm = bytearray(len(npy))
    seconds: dict[str, list[float]] = {
        m: [] for m in (RAW_UP, RAW_UP_FRESH, RAW_DOWN, RAW_DOWN_FRESH)
    }
    with _raw_server() as path, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        size = len(npy).to_bytes(8, "little")
        _send_up(sock, UP, size, npy)  # a first transfer, not timed: buffers and pages settle
        for _ in range(repeats):
            for method, kind in ((RAW_UP, UP), (RAW_UP_FRESH, UP_FRESH)):
                seconds[method].append(_seconds(lambda kind=kind: _send_up(sock, kind, size, npy)))
            seconds[RAW_DOWN].append(_seconds(lambda: _fetch_down(sock, size, warm)))
            seconds[RAW_DOWN_FRESH].append(
                _seconds(lambda: _fetch_down(sock, size, bytearray(len(npy))))
            )
    return seconds


def _send_up(sock: socket.socket, kind: int, size: bytes, payload: bytes) -> None:
    sock.sendall(bytes([kind]) + size)
    sock.sendall(payload)
    _recv_exact(sock, 1)


def _fetch_down(sock: socket.socket, size: bytes, landing: bytearray) -> None:
    sock.sendall(bytes([DOWN]) + size)
    _recv_into(sock, memoryview(landing))


def _raw_server() -> contextlib.AbstractContextManager[str]:
    return socket_server(_serve_raw, "raw")


def _serve_raw(path: str, ready: Any) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        ready.set()
        conn, _ = listener.accept()
        buffer = bytearray()
        while header := _recv_exact(conn, 9):
            size = int.from_bytes(header[1:], "little")
            if len(buffer) < size:
                buffer = bytearray(size)
                buffer[:] = bytes(size)  # touch every page: this buffer stays warm
            view = memoryview(buffer)[:size]
            if header[0] == UP:
                _recv_into(conn, view)
                conn.sendall(b"k")
            elif header[0] == UP_FRESH:
                _recv_into_new_shm_file(conn, size)
            else:
                conn.sendall(view)


def _recv_into_new_shm_file(conn: socket.socket, size: int) -> None:
    """What an upload has to do: land the bytes in a new, never-touched /dev/shm file.

    Each piece is received into a warm buffer and written at its place: faster here than
    receiving into a mapping of the file, whose first-touch page faults cost more than the
    copy. Acknowledged before the file is dropped: freeing its pages is not the transfer's."""
    piece = memoryview(bytearray(LANDING_CHUNK))
    with _new_shm_file(size) as fd:
        received = 0
        while received < size:
            got = conn.recv_into(piece, min(LANDING_CHUNK, size - received))
            if not got:
                raise ConnectionError("the peer closed mid-transfer")
            os.pwrite(fd, piece[:got], received)
            received += got
        conn.sendall(b"k")


@contextlib.contextmanager
def _new_shm_file(size: int) -> Iterator[int]:
    path = Path("/dev/shm") / f"tgd-bench-raw.{os.getpid()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(size, 1))  # as taogpud does: a full /dev/shm fails here
        yield fd
    finally:
        os.close(fd)
        path.unlink()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    received = 0
    while received < len(view):
        got = sock.recv_into(view[received:])
        if not got:
            raise ConnectionError("the peer closed mid-transfer")
        received += got
