"""The rules of the [ray] table and scheduling.executor that span keys (issue 10).

    ray.local_num_gpus / local_num_cpus       only with ray.address = "local"         error
    executor "ray" + cuda: backend.cuda.device_id is a list, not "all"              error
    executor "ray" + cuda: ray.worker_num_gpus above 0 (Ray then sets the GPU)      error
    executor "ray": gpu.backend "cuda" or "cpu" (OpenCL workers are local only)       error

A reload that changes the executor, the address or the namespace keeps the running executor:
`restart_only` words the warning that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taogpud.config.problem import Problem

if TYPE_CHECKING:
    from taogpud.config import ConfigFile, SettingsFile

CONFIG = "config.toml"
# changed by a reload, these keep their old value until the daemon restarts
START_ONLY_KEYS = (
    "scheduling.executor",
    "ray.address",
    "ray.namespace",
    "ray.local_num_gpus",
    "ray.local_num_cpus",
)


def serves_client_memory(config: ConfigFile) -> bool:
    """Whether a client's own memory (the `.shm` socket) can reach every worker: local workers,
    or the actors of a private local Ray (ray.address = "local"), processes of the daemon's
    uid on its host. A cluster's actors may be on other hosts, where no memfd reaches and
    /proc/<daemon pid> is another process: no socket there, and clients send the HTTP body."""
    return config.scheduling.executor == "local" or config.ray.address == "local"


def check_ray(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    return _local_only(config) + _cuda_on_ray(settings, config)


def _local_only(config: ConfigFile) -> list[Problem]:
    ray = config.ray
    given = [
        name
        for name, value in (
            ("local_num_gpus", ray.local_num_gpus),
            ("local_num_cpus", ray.local_num_cpus),
        )
        if value is not None
    ]
    if ray.address == "local" or not given:
        return []
    return [
        Problem(
            CONFIG,
            f"ray.{name}",
            f'sizes a private local Ray instance, but ray.address is "{ray.address}"',
            f'remove ray.{name} (a cluster has its own resources), or set ray.address = "local"',
        )
        for name in given
    ]


def _cuda_on_ray(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    if config.scheduling.executor != "ray" or settings.gpu.backend == "cpu":
        return []
    if settings.gpu.backend != "cuda":
        message = f'"{settings.gpu.backend}" cannot run on the Ray executor'
        fix = 'use gpu.backend "cuda" or "cpu" with it, or scheduling.executor = "local"'
        return [Problem("settings.json", "gpu.backend", message, fix)]
    problems = []
    if config.backend.cuda.device_id == "all":
        problems.append(
            Problem(
                CONFIG,
                "backend.cuda.device_id",
                '"all" cannot be counted before the cluster is reached: with executor = "ray" '
                "each listed id is one Ray actor on one GPU, wherever Ray places it",
                "list as many ids as GPU actors you want, e.g. device_id = [0, 1]",
            )
        )
    if config.ray.worker_num_gpus == 0:
        problems.append(
            Problem(
                CONFIG,
                "ray.worker_num_gpus",
                "is 0: Ray would give the cuda actors no GPU (no CUDA_VISIBLE_DEVICES)",
                "set ray.worker_num_gpus = 1 (one actor per GPU), or a fraction to share one",
            )
        )
    return problems


def restart_only(changes: list[tuple[str, Any, Any]]) -> list[Problem]:
    """A warning per changed key that only a restart applies."""
    problems = []
    for key, old, new in changes:
        name = key.split(": ", 1)[-1]
        if name in START_ONLY_KEYS:
            problems.append(
                Problem(
                    CONFIG,
                    name,
                    f"changed from {old!r} to {new!r}, but the executor keeps {old!r} until "
                    "taogpud restarts (the workers were rolled on the running executor)",
                    "restart taogpud to apply it: sudo systemctl restart taogpud",
                    severity="warning",
                )
            )
    return problems
