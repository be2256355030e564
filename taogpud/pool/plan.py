"""Which workers to start: the configured backend if it can run, else a loud CPU
fallback (when allowed) or a refusal."""

from __future__ import annotations

from dataclasses import dataclass

from taogpud.backends.base import WorkerSpec
from taogpud.config import ConfigSnapshot
from taogpud.errors import BackendUnavailable, HostCannotRun
from taogpud.i18n import Text
from taogpud.observability.logging import get_logger

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
        return _plan_opencl(snapshot)
    if snapshot.config.scheduling.executor == "ray":  # the cluster's GPUs, not this host's
        ids = snapshot.cuda_device_ids()
        return _plan(snapshot, "cuda", [] if ids == "all" else ids, None)  # "all": config error
    return _plan_cuda(snapshot)


def _plan_cuda(snapshot: ConfigSnapshot) -> WorkerPlan:
    from taogpud.backends.cuda.backend import cuda_device_count, probe_cuda

    wanted = snapshot.cuda_device_ids()
    reason = probe_cuda([0] if wanted == "all" else wanted)
    if reason is None:
        from taogpud.backends.cuda.startup import check_at_start

        ids = list(range(cuda_device_count())) if wanted == "all" else wanted
        reason = check_at_start(snapshot, ids)  # cuda_arch, pool size, memory held by others
        if reason is None:
            return _plan(snapshot, "cuda", ids, None)
    if not snapshot.settings.gpu.allow_fallback_to_cpu:
        raise _cuda_refusal()(
            Text("CUDA cannot start: {reason}", reason=reason),
            Text(
                "fix the driver or the device list, or set gpu.allowFallbackToCpu to true in "
                "settings.json to run on the CPU (every job then says fallback=true)"
            ),
        )
    log.warning("backend.fallback", reason=reason, allow_fallback_to_cpu=True)
    return _plan(snapshot, "cpu", list(range(snapshot.config.runtime.cpu_devices)), reason)


def _cuda_refusal() -> type[BackendUnavailable]:
    """HostCannotRun where no retry can help (no driver, or a build without CuPy); else
    BackendUnavailable, which may pass later (a driver still loading at boot)."""
    from taogpud.backends.cuda.backend import cupy_installed, driver_installed

    return HostCannotRun if not (driver_installed() and cupy_installed()) else BackendUnavailable


def _plan_opencl(snapshot: ConfigSnapshot) -> WorkerPlan:
    """Asked of a child process first (backends/opencl/probe.py): PoCL aborts the process
    that builds a kernel without `ld`, and a process that used OpenCL must not fork."""
    from taogpud.backends.opencl import probe as opencl_probe

    platform, wanted = snapshot.config.backend.opencl.platform_index, snapshot.opencl_device_ids()
    found = opencl_probe.inventory(build_on=(platform, wanted))
    reason = opencl_probe.problem(found, platform, wanted)
    if reason is None:
        count = opencl_probe.device_count(found, platform)
        return _plan(snapshot, "opencl", list(range(count)) if wanted == "all" else wanted, None)
    if not snapshot.settings.gpu.allow_fallback_to_cpu:
        raise BackendUnavailable(
            Text("OpenCL cannot start: {reason}", reason=reason),
            Text(
                "fix the OpenCL driver or backend.opencl in config.toml, or set "
                "gpu.allowFallbackToCpu to true in settings.json to run on the CPU (every job "
                "then says fallback=true)"
            ),
        )
    log.warning("backend.fallback", reason=reason, allow_fallback_to_cpu=True, wanted="opencl")
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
            platform_index=config.backend.opencl.platform_index,
        )
        for index in indices
    ]
    return WorkerPlan(backend, specs, fallback)
