"""User CUDA C kernels: compiled with NVRTC for the configured `cuda_arch`, loaded with CuPy.

The compile step is ours, not CuPy's `RawModule`: CuPy appends its own `-arch` (the card's),
so `cuda_arch` would not be what the code is built for. Here the cubin is built for exactly
the arch the worker resolved (`"auto"` → the card's), by the same function that CI runs
without a GPU (NVRTC needs no driver), and cached on disk next to CuPy's own kernels
(`CUPY_CACHE_DIR`), so a restart does not compile again.

Nothing here imports cupy at module level: the daemon imports the task table.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Any

from taogpud.errors import InvalidParams, KernelCompileError
from taogpud.host.install_hints import install_hint

ARCH = re.compile(r"sm_(\d{2,3})([a-z]?)")
CACHE_PREFIX = "taogpud-kernel-"
_loaded: dict[str, Any] = {}  # cubin digest → CuPy Module, per worker process
_loaded_lock = threading.Lock()


def resolve_arch(cuda_arch: str, compute_capability: str) -> str:
    """The arch to build for: `cuda_arch` itself, or the card's for "auto" (9.0 → sm_90)."""
    if cuda_arch == "auto":
        return "sm_" + compute_capability.replace(".", "")
    return cuda_arch


def same_arch(cuda_arch: str, card_arch: str) -> bool:
    """Whether `cuda_arch` builds for a card of `card_arch`: "sm_90a" (9.0's own features)
    is a 9.0 card's arch too."""
    match = ARCH.fullmatch(cuda_arch)
    return match is not None and f"sm_{match.group(1)}" == card_arch


def compile_cubin(source: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
    """CUDA C → a cubin for `arch` with NVRTC; KernelCompileError with the log on failure."""
    if not ARCH.fullmatch(arch):
        raise KernelCompileError(
            f"cuda_arch {arch!r} is not an architecture NVRTC takes",
            'use the form "sm_90" (compute capability 9.0), or "auto"',
        )
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(source, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, (f"-arch={arch}", *options))
        except nvrtc.NVRTCError as exc:
            raise _compile_error(nvrtc, program, arch, exc) from None
        return bytes(nvrtc.getCUBIN(program))
    finally:
        nvrtc.destroyProgram(program)


def supported_archs() -> list[str]:
    """The sm_XY values this NVRTC can build for."""
    return [f"sm_{number}" for number in _nvrtc().getSupportedArchs()]


def _nvrtc() -> Any:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()  # loads libnvrtc: fails here, not mid-compile, when it is missing
    except (ImportError, OSError, RuntimeError) as exc:
        raise KernelCompileError(
            f"NVRTC (the CUDA runtime compiler) cannot be loaded: {exc}",
            install_hint("nvrtc"),
        ) from None
    return nvrtc


def _compile_error(nvrtc: Any, program: Any, arch: str, exc: Exception) -> KernelCompileError:
    try:
        log = nvrtc.getProgramLog(program).strip()
    except nvrtc.NVRTCError:
        log = ""
    if "gpu-architecture" in log or "-arch" in log:
        known = ", ".join(supported_archs())
        return KernelCompileError(
            f"NVRTC does not build for {arch}: {log or exc}",
            f'set backend.cuda.cuda_arch to one of {known} (or "auto")',
        )
    return KernelCompileError(
        f"the kernel source does not compile for {arch}: {_tail(log or str(exc))}",
        'fix the source (the message holds NVRTC\'s log); kernels need extern "C" names',
    )


def _tail(log: str, limit: int = 2000) -> str:
    return log if len(log) <= limit else "…" + log[-limit:]


# ---------------------------------------------------------------------------- in a worker


def load_function(source: str, name: str, arch: str) -> Any:
    """The kernel `name` from `source`, built for `arch` and loaded into this worker's
    current device; compiled once per process and cached on disk across restarts."""
    digest = hashlib.sha256(f"{arch}\0{source}".encode()).hexdigest()
    with _loaded_lock:
        module = _loaded.get(digest)
        if module is None:
            module = _load_module(_cubin(source, arch, digest))
            _loaded[digest] = module
    try:
        return module.get_function(name)
    except Exception as exc:  # CUDADriverError: CUDA_ERROR_NOT_FOUND
        raise InvalidParams(
            f"the source has no kernel named {name!r} ({exc})",
            'declare it extern "C" __global__, or give the name the source uses',
        ) from None


def _cubin(source: str, arch: str, digest: str) -> bytes:
    cache = _cache_file(digest)
    if cache is not None and cache.is_file():
        return cache.read_bytes()
    cubin = compile_cubin(source, arch)
    if cache is not None:
        partial = cache.with_suffix(f".{os.getpid()}.partial")
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(cubin)
            partial.rename(cache)  # atomic: two workers never read half a file
        except OSError:
            partial.unlink(missing_ok=True)  # a read-only cache only costs a compile
    return cubin


def _cache_file(digest: str) -> Path | None:
    folder = os.environ.get("CUPY_CACHE_DIR")
    if not folder:
        return None
    return Path(folder) / f"{CACHE_PREFIX}{digest}.cubin"


def _load_module(cubin: bytes) -> Any:
    import cupy

    module = cupy.cuda.function.Module()
    module.load(cubin)
    return module
