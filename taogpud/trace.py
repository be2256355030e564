"""One trace line per job state change: the proof of where each job ran.

A job that ran on the CPU because CUDA could not start is logged at WARNING with
its fallback reason, every time: a fallback is never silent.

Lines are written just after the event loop's current callback, not inside it: a job's
`queued` line after its order went to the worker, its `succeeded` line after its answer
went to the client. The fields and the timestamp are taken when the state changes; only
the rendering and the write wait. On a tiny job that took about 60 µs of the daemon's
work off the path from request to answer (bench/run.py, "Where the time goes").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from taogpud.jobs import JobRecord, JobState
from taogpud.logging import get_logger, write_lines

log = get_logger("taogpud.jobs")


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


def job_event(job: JobRecord) -> None:
    level = (
        "warning" if job.fallback or job.status in (JobState.failed, JobState.timed_out) else "info"
    )
    deferred(level, f"job.{job.status.value}", **job_fields(job))


_pending: list[tuple[str, str, dict[str, Any]]] = []  # (level, event, fields), oldest first


def deferred(level: str, event: str, **fields: Any) -> None:
    """Log `event` once the loop's current callback is done (now, outside a loop), in order
    with the other deferred lines; its timestamp is now."""
    fields["_at"] = time.time()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a thread of its own, or a tool: nothing to wait for
        getattr(log, level)(event, **fields)
        return
    _pending.append((level, event, fields))
    if len(_pending) == 1:
        loop.call_soon(flush)


def flush() -> None:
    """Write every deferred line now: through the configured processors (level, redaction,
    JSON, the journal), then the stdout ones in one write (logging.configure() sends lines
    to stdout; unconfigured, structlog's default renderer gives text)."""
    lines: list[bytes] = []
    processors = structlog.get_config()["processors"]
    batch = _pending[:]
    _pending.clear()
    for level, event, fields in batch:
        fields["event"] = event
        rendered: Any = fields
        try:
            for processor in processors:  # the last one renders the line's bytes
                rendered = processor(None, level, rendered)
        except structlog.DropEvent:  # below the level, or gone to the journal
            continue
        lines.append(rendered if isinstance(rendered, bytes) else str(rendered).encode())
    if lines:
        lines.append(b"")
        write_lines(b"\n".join(lines))  # never blocks the loop, never raises (logging.py)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
