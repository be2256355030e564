"""What the MCP tools answer: pydantic models (their JSON schemas are the tools' output
schemas) and pure functions from the daemon's answers to them. No SDK here, no socket:
tests feed these the daemon's own JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from taogpud.observability import nvml
from taogpud.wire import FINISHED_STATES, DeviceJson, JobJson, StatusJson, TaskJson

Job = JobJson  # a job record as the daemon answers it (taogpud.jobs.records.JobRecord)


class Caps(BaseModel):
    max_concurrent_tasks: int = Field(description="jobs running at once, all devices together")
    queue_limit: int = Field(description="jobs waiting at most; past it a submit is refused")
    strategy: str = Field(description="how a device is chosen: round_robin or least_loaded")
    gpu_affinity: bool = Field(description="jobs of one affinity key stay on one device")


class Device(BaseModel):
    device: str = Field(description="the daemon's label, e.g. gpu:0 (cpu:0 on the CPU pair)")
    index: int
    backend: str = Field(description="cuda, opencl or cpu")
    name: str | None
    uuid: str | None = Field(description="the GPU's UUID (NVML), None off a CUDA GPU")
    memory_total_bytes: int | None
    memory_cap_bytes: int | None = Field(description="the most the daemon lets jobs reserve")
    memory_free_bytes: int | None = Field(description="free now, read from NVML; None off a GPU")
    running: int = Field(description="jobs running on it now")
    slots: int = Field(description="jobs it runs at once")
    health: str = Field(description="its worker: warm (ready), starting, restarting or dead")
    problem: str | None = Field(description="why its worker is not warm, if it is not")


class GpuStatus(BaseModel):
    state: str = Field(description="the daemon: ready, starting, draining or stopping")
    backend: str
    fallback: bool = Field(description="true: jobs run on the CPU although a GPU was configured")
    fallback_reason: str | None
    running: int
    queued: int
    caps: Caps
    devices: list[Device]
    tasks: list[str] = Field(description="the task names run_task takes")


class JobSummary(BaseModel):
    id: str
    task: str
    status: str = Field(description="queued, running, succeeded, failed, cancelled, timed_out …")
    finished: bool
    device: str | None = Field(description="where it ran, e.g. gpu:0")
    backend: str | None
    fallback: bool = Field(description="true: it ran on the CPU instead of the GPU asked for")
    fallback_reason: str | None
    queue_ms: float | None
    run_ms: float | None
    timings: dict[str, float] = Field(description="h2d_ms, kernel_ms, d2h_ms where measured")
    result: dict[str, Any] | None
    error: dict[str, Any] | None = Field(description="{code, message} of a job that failed")
    record: dict[str, Any] = Field(description="the daemon's whole job record")


class RunTaskResult(JobSummary):
    note: str = Field(description="what to do next, when it did not finish within wait_s")


class ProgramStarted(JobSummary):
    log_path: str = Field(description="where the program's output goes (stdout and stderr)")
    note: str = Field(description="what happens next, and how to follow it")


class EvidenceFact(BaseModel):
    key: str
    value: Any
    nvidia_smi: str | None = Field(description="the nvidia-smi query that shows the same fact")


class JobWithEvidence(JobSummary):
    evidence: list[EvidenceFact] = Field(description="what NVML saw while the job ran")
    evidence_note: str


def gpu_status(
    status: StatusJson,
    devices: list[DeviceJson],
    tasks: list[TaskJson],
    inventory: nvml.Inventory | None,
) -> GpuStatus:
    """The daemon's status, devices and catalog, with each GPU's free memory from NVML."""
    workers = {worker["index"]: worker for worker in status.get("workers") or []}
    free = free_memory(inventory)
    return GpuStatus(
        state=status["state"],
        backend=status["backend"],
        fallback=status["fallback"],
        fallback_reason=status.get("fallback_reason"),
        running=status["running"],
        queued=status["queued"],
        caps=Caps.model_validate(status, from_attributes=False),
        devices=[device_of(d, workers.get(d["index"], {}), free) for d in devices],
        tasks=[task["name"] for task in tasks],
    )


def free_memory(inventory: nvml.Inventory | None) -> dict[str, int | None]:
    """UUID → free bytes, as NVML reads them on this host."""
    cards = inventory.devices if inventory is not None else ()
    return {card.uuid: card.memory_free_bytes for card in cards if card.uuid}


def device_of(device: DeviceJson, worker: Mapping[str, Any], free: dict[str, int | None]) -> Device:
    uuid = device.get("uuid")
    return Device(
        device=device["device"],
        index=device["index"],
        backend=device["backend"],
        name=device.get("name"),
        uuid=uuid,
        memory_total_bytes=device.get("memory_total_bytes"),
        memory_cap_bytes=device.get("memory_cap_bytes"),
        memory_free_bytes=free.get(uuid) if uuid else None,
        running=worker.get("running", 0),
        slots=worker.get("slots", 0),
        health=worker.get("state") or device.get("worker_state") or "unknown",
        problem=worker.get("problem"),
    )


def summary_fields(job: Job) -> dict[str, Any]:
    """The fields every job answer leads with, and the whole record after them."""
    return {
        "id": job["id"],
        "task": job["task"],
        "status": job["status"],
        "finished": job["status"] in FINISHED_STATES,
        "device": job.get("device"),
        "backend": job.get("backend"),
        "fallback": bool(job.get("fallback")),
        "fallback_reason": job.get("fallback_reason"),
        "queue_ms": job.get("queue_ms"),
        "run_ms": job.get("run_ms"),
        "timings": job.get("timings") or {},
        "result": job.get("result"),
        "error": job.get("error"),
        "record": job,
    }


def run_task_result(job: Job) -> RunTaskResult:
    fields = summary_fields(job)
    note = ""
    if not fields["finished"]:
        note = (
            f"job {job['id']} is still {job['status']}: it goes on; call the `job` tool with "
            f"job_id {job['id']} later (or `taogpuctl wait {job['id']}`)"
        )
    return RunTaskResult(**fields, note=note)


def job_with_evidence(job: Job) -> JobWithEvidence:
    facts, note = evidence_facts(job)
    evidence = [EvidenceFact(**fact) for fact in facts]
    return JobWithEvidence(**summary_fields(job), evidence=evidence, evidence_note=note)


def evidence_facts(job: Job) -> tuple[list[dict[str, Any]], str]:
    """Each NVML fact beside the nvidia-smi query that shows it (as `show --evidence`)."""
    evidence = job.get("evidence") or {}
    if not evidence and not job.get("backend"):
        return [], "no NVML evidence yet: the job has not run"
    if not evidence:
        return [], f"no NVML evidence: the job ran on {job['backend']}, not a CUDA GPU"
    smi = nvml.NVIDIA_SMI  # the table `taogpuctl show --evidence` prints
    facts = [{"key": k, "value": v, "nvidia_smi": smi.get(k)} for k, v in evidence.items()]
    return facts, "what NVML saw while the job ran; each fact's nvidia-smi query shows it too"


MAX_LOG_LINES = 200  # job_logs' `lines` at most
MAX_LOG_CHARS = 32_000  # the lines job_logs answers, as JSON, at most: an agent's context is dear


MAX_OUTPUT_CHARS = 16_000  # of a program's output, the tail job_logs answers


class JobLogs(BaseModel):
    job_id: str
    lines: list[dict[str, Any]] = Field(description="its trace lines, oldest first")
    truncated: bool = Field(description="true: older lines (or a line's end) were left out")
    output: str | None = Field(
        default=None, description="a program run_program started: the end of its output"
    )
    output_truncated: bool = Field(default=False, description="true: its output began earlier")


def job_summary(job: Job) -> JobSummary:
    return JobSummary(**summary_fields(job))


def job_lines(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's own lines: without the `mcp.call` lines that name it (job_logs' own among
    them: reading the tail must not push the job's lines out of it)."""
    return [event for event in events if event.get("event") != "mcp.call"]


def job_logs(job_id: str, events: list[dict[str, Any]], lines: int) -> JobLogs:
    """The last `lines` events, then the newest of them that fit MAX_LOG_CHARS; a single
    line longer than that is cut to its event and time, with its length."""
    tail = events[-lines:]
    truncated = len(events) > len(tail)
    kept: list[dict[str, Any]] = []
    used = 0
    for event in reversed(tail):
        size = len(json.dumps(event, default=str))
        if used + size > MAX_LOG_CHARS:
            truncated = True
            if not kept:  # even the newest line alone is too long
                kept.append({**_line_head(event), "cut_chars": size})
            break
        kept.append(event)
        used += size
    return JobLogs(job_id=job_id, lines=kept[::-1], truncated=truncated)


def _line_head(event: dict[str, Any]) -> dict[str, Any]:
    return {key: event[key] for key in ("timestamp", "event", "status") if key in event}


def program_started(job: Job, log_path: str) -> ProgramStarted:
    note = (
        f"job {job['id']} is {job['status']}: this server starts the program as your user "
        "once its lease is granted; `job` shows it, its output is in log_path. It runs while "
        "this MCP session does (the agent ends the server, and the program with it)"
    )
    return ProgramStarted(**summary_fields(job), log_path=log_path, note=note)


def output_tail(path: Path) -> tuple[str | None, bool]:
    """The last MAX_OUTPUT_CHARS characters of a program's log (its bytes as UTF-8, a bad
    byte replaced), and whether it held more; (None, False) when there is no such log."""
    try:
        with path.open("rb") as log:
            start = max(0, log.seek(0, os.SEEK_END) - MAX_OUTPUT_CHARS * 4)  # ≤ 4 bytes a char
            log.seek(start)
            text = log.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None, False
    return text[-MAX_OUTPUT_CHARS:], start > 0 or len(text) > MAX_OUTPUT_CHARS
