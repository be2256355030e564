"""A job's trace line: its fields and level (what taogpud.observability.trace writes is any
line; what a job's says is the jobs' own).

A job that ran on the CPU because CUDA could not start is logged at WARNING with its fallback
reason, every time: a fallback is never silent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taogpud.jobs.records import JobRecord, JobState
from taogpud.observability import trace


def job_fields(job: JobRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "job_id": job.id,
        "task": job.task,
        "status": job.status.value,
        "backend": job.backend,
        "device": job.device,
        "device_uuid": job.device_uuid,
        "fallback": job.fallback,
        "queue_ms": _round(job.queue_ms),
        "run_ms": _round(job.run_ms),
        "uid": job.peer.uid,
        "gid": job.peer.gid,
    }
    if job.fallback:
        fields["fallback_reason"] = job.fallback_reason
    if job.timings:
        fields.update({k: _round(v) for k, v in job.timings.items()})
    if job.error is not None:
        fields["error_code"] = job.error.code
        fields["error"] = job.error.message
    if job.worker_pid is not None:
        fields["worker_pid"] = job.worker_pid
    if job.evidence:  # cuda: what NVML saw while the job ran (backends/cuda/evidence.py)
        fields["evidence"] = job.evidence
    if job.node_id is not None:  # executor "ray": the node beside the device
        fields["node_id"], fields["node_hostname"] = job.node_id, job.node_hostname
    return fields


def job_line(job: JobRecord) -> Callable[[], None]:
    """The job's line as it stands now (its fields and timestamp taken here), logged when
    called: the scheduler has the store call it once a commit holds the change it tells
    (JobStore.tell, Tell.TRACE), so the trace never says what a restart would not find."""
    level = (
        "warning" if job.fallback or job.status in (JobState.failed, JobState.timed_out) else "info"
    )
    return trace.line(level, f"job.{job.status.value}", job_fields(job))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
