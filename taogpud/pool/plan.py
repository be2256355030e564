"""Which workers to start: the configured backend if it can run, else a loud CPU
fallback (when allowed) or a refusal."""

from __future__ import annotations

from dataclasses import dataclass

from taogpud.backends.base import WorkerSpec
from taogpud.config import ConfigSnapshot
from taogpud.errors import BackendUnavailable
from taogpud.logging import get_logger

log = get_logger("taogpud.pool")


@dataclass(frozen=True)
class WorkerPlan:
    backend: str  # what the workers will really run: "cuda" | "cpu"
    specs: list[WorkerSpec]
    fallback_reason: str | None


def plan_workers(snapshot: ConfigSnapshot) -> WorkerPlan:
    backend = snapshot.settings.gpu.backend
    if backend == "cpu":
        return _plan(snapshot, "cpu", list(range(snapshot.config.runtime.cpu_devices)), None)
    if backend == "opencl":
        raise BackendUnavailable(
            "settings.json: gpu.backend: the OpenCL backend is not available in this release",
            'set gpu.backend to "cuda" or "cpu" (and backend.opencl.enabled = false)',
        )
    return _plan_cuda(snapshot)


def _plan_cuda(snapshot: ConfigSnapshot) -> WorkerPlan:
    from taogpud.backends.cuda import cuda_device_count, probe_cuda

    wanted = snapshot.cuda_device_ids()
    reason = probe_cuda([0] if wanted == "all" else wanted)
    if reason is None:
        ids = list(range(cuda_device_count())) if wanted == "all" else wanted
        return _plan(snapshot, "cuda", ids, None)
    if not snapshot.settings.gpu.allow_fallback_to_cpu:
        raise BackendUnavailable(
            f"CUDA cannot start: {reason}",
            "fix the driver or the device list, or set gpu.allowFallbackToCpu to true in "
            "settings.json to run on the CPU (every job then says fallback=true)",
        )
    log.warning("backend.fallback", reason=reason, allow_fallback_to_cpu=True)
    return _plan(snapshot, "cpu", list(range(snapshot.config.runtime.cpu_devices)), reason)


def _plan(
    snapshot: ConfigSnapshot, backend: str, indices: list[int], fallback: str | None
) -> WorkerPlan:
    config = snapshot.config
    specs = [
        WorkerSpec(
            backend=backend,
            index=index,
            stream_count=config.backend.cuda.stream_count,
            thread_num=config.runtime.thread_num,
            memory_fraction=snapshot.settings.gpu.memory_fraction,
            pool_size_mb=config.memory.pool_size_mb,
            auto_grow=config.memory.auto_grow,
            cuda_arch=config.backend.cuda.cuda_arch,
            enable_profiling=config.runtime.enable_profiling,
            fallback_reason=fallback,
        )
        for index in indices
    ]
    return WorkerPlan(backend, specs, fallback)
