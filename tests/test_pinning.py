"""A CUDA worker pins the client memory it maps (pool/pinning.py): each span a job copies to
the device is registered once (cudaHostRegister), kept for later jobs, and unregistered
before the mapping goes; a registration that fails leaves copies pageable, with one trace
line, and never fails a job.

Without a GPU the CUDA runtime is a fake standing in for CuPy (the one thing mocked); the
memory is a real memfd, mapped by the worker's own code through /proc as the daemon's
descriptor would be. The real path is the `gpu` test at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from taogpud.backends.base import WorkerSpec
from taogpud.backends.cuda.backend import probe_cuda
from taogpud.memfd import pinning, regions
from taogpud.memfd.regions import MemoryHandle, RegionRef, map_region

PAGE = mmap.PAGESIZE
SPEC = WorkerSpec("cuda", 0, 2, 1, 0.5, 0, True, "auto", False)


class FakeCudaError(RuntimeError):
    """What CuPy raises for a failed runtime call (CUDARuntimeError is a RuntimeError)."""


@dataclass
class FakeRuntime:
    """cupy.cuda.runtime's host registration, recorded; `refuse` makes hostRegister fail."""

    refuse: str | None = None

    def __post_init__(self) -> None:
        self.registered: dict[int, tuple[int, int]] = {}  # address → (nbytes, flags)
        self.calls: list[tuple[Any, ...]] = []

    def hostRegister(self, address: int, nbytes: int, flags: int) -> None:
        self.calls.append(("register", address, nbytes, flags))
        if self.refuse:
            raise FakeCudaError(self.refuse)
        assert not any(
            a < address + nbytes and address < a + n for a, (n, _) in self.registered.items()
        )
        assert mapped_here(address, nbytes), "registered memory must be mapped"
        self.registered[address] = (nbytes, flags)

    def hostUnregister(self, address: int) -> None:
        nbytes, _ = self.registered.pop(address)
        self.calls.append(("unregister", address, nbytes))
        assert mapped_here(address, nbytes), "unregistered after the mapping went"


class FakeDevice(contextlib.nullcontext[None]):
    """cupy.cuda.Device: current inside `with`; synchronize is recorded."""

    def __init__(self, runtime: FakeRuntime) -> None:
        super().__init__()
        self.runtime = runtime

    def synchronize(self) -> None:
        self.runtime.calls.append(("synchronize",))


def mapped_here(address: int, nbytes: int) -> bool:
    """Whether [address, address + nbytes) lies in one mapping of this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start <= address and address + nbytes <= end:
            return True
    return False


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    """A CudaBackend over a fake CuPy, installed as this process's pinner, with a fresh set
    of mappings (the worker's module-level one is swapped out)."""
    from taogpud.backends.cuda.backend import CudaBackend

    fake = FakeRuntime()
    cuda = types.SimpleNamespace(runtime=fake, Device=lambda index: FakeDevice(fake))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(regions, "MAPPED", regions.MappedMemories())
    pinning.install(CudaBackend(SPEC).host_pinning())
    yield fake
    regions.MAPPED.sweep()


class ClientMemory:
    """A memfd as the daemon holds it: the worker finds it at /proc/<pid>/fd/<fd>."""

    def __init__(self, size: int, frozen: bool = False) -> None:
        self.fd = os.memfd_create("taogpud-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | (fcntl.F_SEAL_WRITE if frozen else 0)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
        stat = os.fstat(self.fd)
        self.handle = MemoryHandle(os.getpid(), self.fd, stat.st_dev, stat.st_ino, size, not frozen)

    def region(self, offset: int, count: int) -> RegionRef:
        return RegionRef(self.handle, offset, (count,), "<f4", count * 4)

    def gone(self) -> None:
        """The client left: the daemon closed its descriptor."""
        os.close(self.fd)


def run_job(*refs: RegionRef) -> list[Any]:
    """What one job does with its inputs: map them, read them, release them."""
    maps: list[Any] = []
    views = [map_region(ref, maps) for ref in refs]
    sums = [float(view.sum()) for view in views]
    del views
    for held in maps:
        held.close()
    return sums


def test_a_span_is_registered_once_for_every_job_that_reads_it(runtime: FakeRuntime) -> None:
    """Two jobs on the same input: one cudaHostRegister, of its whole pages, portable."""
    memory = ClientMemory(16 * PAGE)
    a = memory.region(PAGE, 3 * PAGE // 4 + 10)  # 3 pages and 40 bytes: 4 pages registered
    assert run_job(a) == run_job(a) == [0.0]
    registers = [call for call in runtime.calls if call[0] == "register"]
    assert len(registers) == 1
    _, address, nbytes, flags = registers[0]
    assert nbytes == 4 * PAGE and flags == 0x01  # cudaHostRegisterPortable
    maps: list[Any] = []
    view = map_region(a, maps)
    assert view.__array_interface__["data"][0] == address  # the array's own first byte
    del view
    for held in maps:
        held.close()
    memory.gone()


def test_the_registration_goes_before_the_mapping_once_the_client_has(
    runtime: FakeRuntime,
) -> None:
    """While the client holds the memory the spans stay registered; once it has gone and
    no job uses it, the sweep unregisters each (while still mapped), then unmaps."""
    memory = ClientMemory(16 * PAGE)
    run_job(memory.region(0, PAGE), memory.region(8 * PAGE, PAGE))
    regions.MAPPED.sweep()
    assert len(runtime.registered) == 2  # the daemon still holds it: kept for the next job
    memory.gone()
    regions.MAPPED.sweep()
    assert runtime.registered == {}
    assert [call[0] for call in runtime.calls] == ["register"] * 2 + [
        "synchronize",
        "unregister",
    ] * 2
    assert regions.MAPPED.pinner is not None and regions.MAPPED.pinner.pinned_bytes == 0


def test_a_span_overlapping_registered_ones_becomes_their_union_when_alone(
    runtime: FakeRuntime,
) -> None:
    """A larger array over a registered one: the old span is unregistered and the union
    registered (no two registrations may overlap); while another job uses the memory, the
    new span is read pageable instead."""
    memory = ClientMemory(16 * PAGE)
    run_job(memory.region(0, PAGE))
    maps: list[Any] = []
    map_region(memory.region(0, 2 * PAGE // 4), maps)  # a job still running on it
    run_job(memory.region(0, 2 * PAGE))  # overlapping, not alone: left pageable
    assert list(runtime.registered.values()) == [(4 * PAGE, 0x01)]
    for held in maps:
        held.close()
    run_job(memory.region(0, 2 * PAGE))  # alone now: the union
    assert list(runtime.registered.values()) == [(8 * PAGE, 0x01)]
    memory.gone()


def test_a_write_sealed_memory_is_registered_read_only(runtime: FakeRuntime) -> None:
    """A frozen handover is mapped read-only, so it is registered cudaHostRegisterReadOnly."""
    memory = ClientMemory(4 * PAGE, frozen=True)
    run_job(memory.region(0, PAGE))
    assert [flags for _, flags in runtime.registered.values()] == [0x01 | 0x08]
    memory.gone()


@pytest.mark.parametrize("cause", ["driver", "limit"])
def test_a_registration_that_fails_leaves_copies_pageable_with_one_trace_line(
    runtime: FakeRuntime, cause: str
) -> None:
    """The driver refusing (or the worker's pinned limit reached): every job still reads its
    input, the memory is not asked again, and one shm.pin_failed line says why."""
    if cause == "driver":
        runtime.refuse = "cudaErrorHostMemoryAlreadyRegistered"  # what any refusal looks like
    else:
        assert regions.MAPPED.pinner is not None
        regions.MAPPED.pinner.limit_bytes = PAGE
    memory = ClientMemory(16 * PAGE)
    data = np.frombuffer(mmap.mmap(memory.fd, 16 * PAGE), np.float32)
    data[:] = 1.0
    with capture_logs() as logs:
        sums = [run_job(memory.region(0, 2 * PAGE // 4))[0] for _ in range(3)]
    assert sums == [2 * PAGE // 4] * 3
    failed = [line for line in logs if line["event"] == "shm.pin_failed"]
    assert len(failed) == 1, logs
    said = "cudaErrorHostMemoryAlreadyRegistered" if cause == "driver" else "its limit is"
    assert said in failed[0]["error"] and failed[0]["fallback"].startswith("pageable")
    assert len([c for c in runtime.calls if c[0] == "register"]) == (1 if cause == "driver" else 0)
    assert runtime.registered == {}
    memory.gone()


def test_the_cpu_backend_pins_nothing() -> None:
    """Only CUDA has pinned host memory: a cpu worker installs no pinner."""
    from taogpud.backends.cpu import CpuBackend

    assert CpuBackend(SPEC).host_pinning() is None


# ---------------------------------------------------------------------------- on a GPU

CUDA_PROBLEM = probe_cuda([0])


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_PROBLEM is not None, reason=f"needs a GPU: {CUDA_PROBLEM}")
def test_on_a_gpu_client_memory_is_pinned_copied_and_unpinned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real cudaHostRegister: the mapped input reads as pinned host memory to CUDA,
    cupy.asarray copies it exactly, and it is unregistered when the mapping goes."""
    import cupy

    from taogpud.backends.cuda.backend import CudaBackend

    monkeypatch.setattr(regions, "MAPPED", regions.MappedMemories())
    pinning.install(CudaBackend(SPEC).host_pinning())
    memory = ClientMemory(64 << 20)
    values = np.frombuffer(mmap.mmap(memory.fd, 64 << 20), np.float32)
    values[:] = np.arange(values.size, dtype=np.float32)
    maps: list[Any] = []
    view = map_region(memory.region(0, values.size), maps)
    address = view.__array_interface__["data"][0]
    runtime = cupy.cuda.runtime
    assert runtime.pointerGetAttributes(address).type == runtime.memoryTypeHost
    with cupy.cuda.Stream(non_blocking=True) as stream:
        device = cupy.asarray(view)
        stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(device), values)
    del view
    for held in maps:
        held.close()
    memory.gone()
    regions.MAPPED.sweep()
    assert runtime.pointerGetAttributes(address).type != runtime.memoryTypeHost
