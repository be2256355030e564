"""The CUDA side: `probe_cuda` (can this host run cuda workers?) and `CudaBackend`.

`probe_cuda` runs in the daemon before any worker is spawned. It initialises the
CUDA driver API (cuInit) but creates no context, so it holds no device memory and
is harmless in the daemon: workers are spawned, never forked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from taogpud.backends.base import Backend, DeviceInfo, PhaseClock, WorkerSpec
from taogpud.backends.cuda.evidence import (
    NvmlWatch,
    UtilizationSampler,
    format_gpu_uuid,
    job_evidence,
    unavailable,
)
from taogpud.backends.cuda.kernels import resolve_arch, same_arch
from taogpud.errors import BackendUnavailable
from taogpud.host.install_hints import install_hint
from taogpud.observability import nvml

INSTALL_HINT = install_hint("cuda")

# cudaError_t values probe_cuda explains; the rest get the runtime's own words.
_INSUFFICIENT_DRIVER = 35
_STUB_LIBRARY = 34
_NO_DEVICE = 100

# Errors after which the CUDA context is unusable until the process exits ("sticky"): the
# runtime (cudaError_t) and the driver (CUresult) give them the same numbers.
STICKY_CUDA_ERRORS = {
    214: "uncorrectable ECC error",
    700: "illegal memory access",
    710: "device-side assert",
    714: "hardware stack error",
    715: "illegal instruction",
    716: "misaligned address",
    717: "invalid address space",
    718: "invalid program counter",
    719: "launch failure",
}
_CUDA_ERROR_CLASSES = ("CUDARuntimeError", "CUDADriverError")
# cudaHostRegister flags (not exported by CuPy): pinned for every context, and for a
# write-sealed client memory, whose mapping is read-only (CUDA 11.1+; without the flag a
# read-only range cannot be registered)
HOST_REGISTER_PORTABLE = 0x01
HOST_REGISTER_READ_ONLY = 0x08


def probe_cuda(device_ids: Sequence[int]) -> str | None:
    """None when CuPy imports, a driver answers and every id in `device_ids` exists;
    otherwise one sentence saying what is wrong and how to fix it."""
    try:
        import cupy
    except ModuleNotFoundError:
        return f"CuPy is not installed, so the cuda backend cannot start: {INSTALL_HINT}."
    except (ImportError, OSError, RuntimeError) as exc:  # a broken or doubled CuPy install
        return (
            f"CuPy is installed but failed to import ({type(exc).__name__}: {exc}): "
            f"keep exactly one CuPy wheel, the one that matches the driver: {INSTALL_HINT}."
        )
    runtime = cupy.cuda.runtime
    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        return _runtime_problem(runtime, exc)
    except (ImportError, OSError, RuntimeError) as exc:  # e.g. the CUDA runtime library is missing
        return f"CUDA failed to start ({type(exc).__name__}: {exc}): {INSTALL_HINT}."
    return _device_problem(count, device_ids)


def driver_installed() -> bool:
    """Whether this host has an NVIDIA driver: its /proc entry (the module is loaded) or
    nvidia-smi (installed; at boot the module may still be loading). `make demo` and the
    package's postinst ask the same two questions."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def cupy_installed() -> bool:
    return importlib.util.find_spec("cupy") is not None


def cuda_device_count() -> int:
    """How many CUDA devices the driver shows; call only after probe_cuda returned None."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def _runtime_problem(runtime: Any, exc: Any) -> str:
    name = str(exc).split(":")[0]
    status = getattr(exc, "status", None)
    if status == _INSUFFICIENT_DRIVER:
        return _driver_problem(runtime, name)
    if status == _STUB_LIBRARY:
        return (
            f"The CUDA driver found is the toolkit's stub library ({name}): remove the "
            "toolkit's stubs directory from LD_LIBRARY_PATH so the real libcuda.so loads."
        )
    if status == _NO_DEVICE:
        return f"CUDA sees no GPU ({name}){_visible_note()}: check that `nvidia-smi` lists one."
    return (
        f"CUDA failed to start ({exc}): check that `nvidia-smi` works and that the driver "
        f"supports CUDA {_cuda_version(runtime.runtimeGetVersion())}."
    )


def _driver_problem(runtime: Any, name: str) -> str:
    driver = runtime.driverGetVersion()
    needed = _cuda_version(runtime.runtimeGetVersion())
    if driver == 0:
        return (
            f"No NVIDIA driver is loaded on this host ({name}): install the NVIDIA driver "
            "and check that `nvidia-smi` lists the GPU (in a container, pass the GPU in)."
        )
    return (
        f"The NVIDIA driver supports CUDA {_cuda_version(driver)} but this CuPy needs "
        f"CUDA {needed} ({name}): upgrade the driver (`nvidia-smi` shows it) or install "
        f"the CuPy wheel for the older CUDA: {INSTALL_HINT}."
    )


def _device_problem(count: int, device_ids: Sequence[int]) -> str | None:
    if count == 0:
        return f"CUDA sees no GPU{_visible_note()}: check that `nvidia-smi` lists one."
    missing = [index for index in device_ids if not 0 <= index < count]
    if not missing:
        return None
    return (
        f"CUDA device {', '.join(map(str, missing))} was requested but this host has "
        f"{count} CUDA device{'s' if count > 1 else ''} (0..{count - 1}){_visible_note()}: "
        "set backend.cuda.device_id to one of them (`nvidia-smi -L` lists them)."
    )


def _visible_note() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if visible is None else f" with CUDA_VISIBLE_DEVICES={visible!r}"


def _cuda_version(encoded: int) -> str:
    """12090 → '12.9', the way CUDA encodes versions."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def sticky_cuda_error(exc: BaseException | None) -> str | None:
    """'illegal memory access (700: cudaErrorIllegalAddress …)' when `exc`, or an exception
    it was raised from, is a sticky CUDA error; None otherwise."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        status = getattr(exc, "status", None)
        if type(exc).__name__ in _CUDA_ERROR_CLASSES and status in STICKY_CUDA_ERRORS:
            return f"{STICKY_CUDA_ERRORS[status]} ({status}: {exc})"
        exc = exc.__cause__ or exc.__context__
    return None


class CudaBackend(Backend):
    """CuPy on one GPU, one non-blocking stream per slot.

    NOT YET RUN ON A GPU: written against CuPy's documented API on a host without a
    driver. `make gpu-check` on a GPU host runs it (scripts/gpu_check.py, `pytest -m gpu`).
    """

    name = "cuda"
    sticky_error_code = "cuda_sticky_error"

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        # NVML and CUDA must number devices alike, or jobs report the wrong GPU.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        import cupy

        self.xp = cupy
        self._device = cupy.cuda.Device(spec.index)
        self._streams: dict[int, Any] = {}
        self._streams_lock = threading.Lock()
        self._local = threading.local()  # this thread's stream, and which limit it set
        self._cap_bytes = 0
        self._total_bytes = 0
        self._uuid: str | None = None
        self._limit_generation = 1  # bumped when a reload changes the cap
        self._arch = spec.cuda_arch
        self._watch: NvmlWatch | None = None
        self._sampler: UtilizationSampler | None = None

    def warm(self) -> DeviceInfo:
        started = time.perf_counter()
        with self._device:
            props = self.xp.cuda.runtime.getDeviceProperties(self.spec.index)
            self._check_arch(props)
            self._arch = resolve_arch(self.spec.cuda_arch, f"{props['major']}.{props['minor']}")
            total = int(self.xp.cuda.runtime.memGetInfo()[1])
            self._cap_bytes = self._pool_cap(total)
        info = self._device_info(props, total, format_gpu_uuid(props.get("uuid")))
        self._uuid, self._total_bytes = info.uuid, total
        self._open_nvml(str(info.extra["pci_bus_id"]))
        for slot_index in range(self.spec.stream_count):
            with self.slot(slot_index):
                self._preallocate()
        warmup_ms = (time.perf_counter() - started) * 1000
        return dataclasses.replace(info, warmup_ms=warmup_ms)

    @contextlib.contextmanager
    def slot(self, slot_index: int) -> Iterator[None]:
        with self._device:
            self._ensure_pool_limit()
            stream = self._stream(slot_index)
            with stream:
                self._local.stream = stream
                yield

    @contextlib.contextmanager
    def observe(self) -> Iterator[dict[str, Any]]:
        evidence: dict[str, Any] = {}
        watch, sampler = self._watch, self._sampler
        if watch is None or sampler is None or not watch.available:
            yield evidence
            reason = watch.reason if watch is not None else None
            evidence.update(unavailable(reason or "NVML was not opened"))
            return
        window = sampler.begin()
        try:
            yield evidence
        finally:
            sampler.end(window)
            evidence.update(
                job_evidence(
                    worker_pid=os.getpid(),
                    cuda_uuid=self._uuid,
                    nvml_uuid=watch.uuid,
                    pci_bus_id=watch.pci_bus_id,
                    gpu_pids=watch.compute_pids(),
                    window=window,
                )
            )

    def phase_clock(self) -> PhaseClock:
        if not self.spec.enable_profiling:
            return _NoClock(self.synchronize)  # no events, no syncs: nothing is reported
        return CudaEventClock(self.xp, getattr(self._local, "stream", None))

    def sticky_error(self, exc: BaseException) -> str | None:
        return sticky_cuda_error(exc)

    def set_memory_fraction(self, fraction: float) -> None:
        self.spec = dataclasses.replace(self.spec, memory_fraction=fraction)
        self._cap_bytes = self._pool_cap(self._total_bytes)
        self._limit_generation += 1  # each slot thread sets the new limit before its next job

    def host_pinning(self) -> Callable[[int, int, bool], Callable[[], None]]:
        return self._pin_host

    def _pin_host(self, address: int, nbytes: int, read_only: bool) -> Callable[[], None]:
        """cudaHostRegister of client memory this worker mapped (pool/pinning.py); the
        unregister runs with this device current, from whichever thread drops the mapping,
        once the device is idle: a job that failed mid-way has not waited for its copies."""
        runtime = self.xp.cuda.runtime
        flags = HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)
        with self._device:
            runtime.hostRegister(address, nbytes, flags)

        def unpin() -> None:
            with self._device:
                self._device.synchronize()
                runtime.hostUnregister(address)

        return unpin

    def to_host(self, array: Any, out: Any = None) -> Any:
        stream = getattr(self._local, "stream", None)
        host = self.xp.asnumpy(array, stream=stream, out=out)  # out: d2h into a client's memory
        if stream is not None:
            stream.synchronize()
        return host

    def synchronize(self) -> None:
        stream = getattr(self._local, "stream", None)
        if stream is not None:
            stream.synchronize()
        else:
            self._device.synchronize()

    def is_out_of_memory(self, exc: BaseException) -> bool:
        # cupy.cuda.memory.OutOfMemoryError subclasses MemoryError, as host OOM does.
        return isinstance(exc, (self.xp.cuda.memory.OutOfMemoryError, MemoryError))

    def release_memory(self) -> None:
        with self._device:
            self.xp.get_default_memory_pool().free_all_blocks()
            self.xp.get_default_pinned_memory_pool().free_all_blocks()

    # ------------------------------------------------------------------------ helpers

    def _pool_cap(self, total: int) -> int:
        """memoryFraction × total; with auto_grow off, the pre-allocated pool is the cap."""
        fraction_cap = int(total * self.spec.memory_fraction)
        if self.spec.auto_grow:
            return fraction_cap
        return min(fraction_cap, self.spec.pool_size_mb * 2**20)

    def _ensure_pool_limit(self) -> None:
        # A limit set in one thread can read 0 in another (cupy#4866): set it per thread.
        if getattr(self._local, "limit_generation", 0) != self._limit_generation:
            self.xp.get_default_memory_pool().set_limit(size=self._cap_bytes)
            self._local.limit_generation = self._limit_generation

    def _open_nvml(self, pci_bus_id: str) -> None:
        self._watch = NvmlWatch(pci_bus_id)
        if self._watch.available:
            uuid = self._watch.uuid
            xids = nvml.XidWatch.open(uuids=(uuid,)) if uuid else None  # held while it runs
            self._sampler = UtilizationSampler(
                self._watch.utilization_percent,
                read_energy_mj=self._watch.energy_mj,
                read_xids=xids.drain if xids is not None else None,
            )

    def _stream(self, slot_index: int) -> Any:
        with self._streams_lock:
            if slot_index not in self._streams:
                self._streams[slot_index] = self.xp.cuda.Stream(non_blocking=True)
            return self._streams[slot_index]

    def _preallocate(self) -> None:
        """Blocks are cached per stream: give each slot its share of pool_size_mb."""
        share = self.spec.pool_size_mb * 2**20 // max(self.spec.stream_count, 1)
        if share:
            block = self.xp.empty(share, dtype=self.xp.uint8)
            del block  # back to the pool, cached for this stream

    def _check_arch(self, props: dict[str, Any]) -> None:
        actual = f"sm_{props['major']}{props['minor']}"
        wanted = self.spec.cuda_arch
        if wanted != "auto" and not same_arch(wanted, actual):
            raise BackendUnavailable(
                f"backend.cuda.cuda_arch is {wanted!r} but GPU {self.spec.index} is {actual}",
                hint=f'set cuda_arch = "{actual}" (or "auto") in config.toml',
            )

    def _device_info(self, props: dict[str, Any], total: int, uuid: str | None) -> DeviceInfo:
        name = props.get("name", b"")
        extra = {"fallback_reason": self.spec.fallback_reason} if self.spec.fallback_reason else {}
        return DeviceInfo(
            backend=self.name,
            device=f"gpu:{self.spec.index}",
            index=self.spec.index,
            name=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
            uuid=uuid,
            compute_capability=f"{props['major']}.{props['minor']}",
            memory_total_bytes=total,
            memory_cap_bytes=self._cap_bytes,
            extra={
                "pci_bus_id": self.xp.cuda.runtime.deviceGetPCIBusId(self.spec.index),
                "cuda_arch": self._arch,
                **extra,
            },
        )


class _NoClock(PhaseClock):
    """enable_profiling off: no marks, no timings (run_ms alone is recorded)."""

    def mark(self, phase: str) -> None:
        pass


class CudaEventClock(PhaseClock):
    """Phase times from CUDA events on the slot's stream: the GPU's own clock, no host sync
    between phases (the one sync is the job's end, which execute waits for anyway)."""

    def __init__(self, xp: Any, stream: Any) -> None:
        self._xp = xp
        self._stream = stream
        self._events: list[tuple[str, Any]] = [("start", self._record())]

    def _record(self) -> Any:
        event = self._xp.cuda.Event()
        event.record(self._stream)
        return event

    def mark(self, phase: str) -> None:
        self._events.append((phase, self._record()))

    def timings_ms(self) -> dict[str, float]:
        last = self._events[-1][1]
        last.synchronize()
        return {
            phase: float(self._xp.cuda.get_elapsed_time(before, event))
            for (_, before), (phase, event) in itertools.pairwise(self._events)
        }
