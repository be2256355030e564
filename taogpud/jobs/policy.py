"""The scheduling keys of config.toml as one frozen value: a reload swaps the whole of it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from taogpud.config import ConfigSnapshot
from taogpud.jobs import placement

# A running job told to stop (cancel, timeout) gets this long before its worker is killed; a
# program whose starter is gone, this long between its SIGTERM and its SIGKILL.
CANCEL_GRACE_S = 5.0
# A program lease revoked before its start was reported (a cancel, a timeout) ends its job at
# once, but its starter may have started the program in the instant before it heard: the
# devices stay held until that starter answers (its report refused) or exits, or this long at
# most, so a hung starter (SIGSTOP) does not hold them for ever. A starter hung past it that
# wakes and starts the program anyway is refused at its report and kills it (Programs.stop).
REVOKE_GRACE_S = CANCEL_GRACE_S


@dataclass(frozen=True)
class Policy:
    """The scheduling keys of config.toml; a reload swaps the whole value."""

    max_concurrent_tasks: int = 8
    strategy: str = "round_robin"
    gpu_affinity: bool = True
    queue_limit: int = 1000
    job_timeout_s: float | None = None
    enable_profiling: bool = True
    allow_user_kernels: bool = False  # the `kernel` task: CUDA C from clients
    allow_fallback_to_cpu: bool = False  # a program never seen on its GPU: flagged, not stopped
    first_use_timeout_s: float = 60.0  # gpu.firstUseTimeoutS (proof.py)
    program_log_bytes: int = 16 << 20  # scheduling.program_log_kb: a detached program's log

    @functools.cached_property
    def rules(self) -> placement.Rules:
        """The keys placement obeys (taogpud.jobs.placement), made once per policy."""
        return placement.Rules(self.strategy, self.gpu_affinity, self.max_concurrent_tasks)

    @classmethod
    def from_snapshot(cls, snapshot: ConfigSnapshot) -> Policy:
        scheduling = snapshot.config.scheduling
        return cls(
            max_concurrent_tasks=scheduling.max_concurrent_tasks,
            strategy=scheduling.strategy,
            gpu_affinity=scheduling.gpu_affinity,
            queue_limit=scheduling.queue_limit,
            job_timeout_s=scheduling.job_timeout_s,
            enable_profiling=snapshot.config.runtime.enable_profiling,
            allow_user_kernels=snapshot.config.backend.cuda.allow_user_kernels,
            allow_fallback_to_cpu=snapshot.settings.gpu.allow_fallback_to_cpu,
            first_use_timeout_s=snapshot.settings.gpu.first_use_timeout_s,
            program_log_bytes=scheduling.program_log_kb << 10,
        )
