"""Data path: array upload and download through taogpud beside memcpy and a raw Unix socket.

The same bytes (a float32 array's .npy image) in one run: numpy's copy into a warm buffer
(memcpy), a raw AF_UNIX stream to a process that reads into a warm buffer and back, and
taogpud's `Client.upload_array` (from a numpy array, and from ready .npy bytes) and
`Client.download_output` of a kept output (vector_add's c). Throughput in GiB/s of payload.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.daemon_under_test import Client
from bench.load import SPAWN
from bench.stats import Spread

GIB = 1 << 30
UP, DOWN = 0, 1
MEMCPY = "memcpy (numpy copyto into a warm buffer)"
RAW_UP = "raw Unix socket, client → server"
RAW_DOWN = "raw Unix socket, server → client"
UPLOAD_ARRAY = "taogpud upload_array(ndarray)"
UPLOAD_BYTES = "taogpud upload_array(.npy bytes)"
DOWNLOAD = "taogpud download_output (kept output)"
METHODS = (MEMCPY, RAW_UP, RAW_DOWN, UPLOAD_ARRAY, UPLOAD_BYTES, DOWNLOAD)
VERSUS = {UPLOAD_ARRAY: RAW_UP, UPLOAD_BYTES: RAW_UP, DOWNLOAD: RAW_DOWN}


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
        seconds = {MEMCPY: _memcpy(array, repeats)}
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
    landing = bytearray(len(npy))
    up, down = [], []
    with _raw_server() as path, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        header = len(npy).to_bytes(8, "little")
        for _ in range(repeats):
            up.append(_seconds(lambda: _send_up(sock, header, npy)))
            down.append(_seconds(lambda: _fetch_down(sock, header, landing)))
    return {RAW_UP: up, RAW_DOWN: down}


def _send_up(sock: socket.socket, header: bytes, payload: bytes) -> None:
    sock.sendall(bytes([UP]) + header)
    sock.sendall(payload)
    _recv_exact(sock, 1)


def _fetch_down(sock: socket.socket, header: bytes, landing: bytearray) -> None:
    sock.sendall(bytes([DOWN]) + header)
    _recv_into(sock, memoryview(landing))


@contextlib.contextmanager
def _raw_server() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="tgd-raw-", dir="/tmp")
    path = str(Path(folder) / "raw.sock")
    ready = SPAWN.Event()
    server = SPAWN.Process(target=_serve_raw, args=(path, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the raw socket server did not start")
        yield path
    finally:
        server.kill()
        server.join()
        shutil.rmtree(folder, ignore_errors=True)


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
            view = memoryview(buffer)[:size]
            if header[0] == UP:
                _recv_into(conn, view)
                conn.sendall(b"k")
            else:
                conn.sendall(view)


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
