"""The messages on a worker's pipe, both directions. Plain dataclasses, pickled.

daemon → worker: RunJob, CancelJob, SetMemoryFraction, Ping, Stop
worker → daemon: Warm, WarmFailed, InfoUpdated, JobFinished, Pong
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from taogpud.backends.base import DeviceInfo
from taogpud.pool.regions import RegionRef
from taogpud.pool.shm import ArrayRef

# A worker's exit status after its device became unusable (a sticky CUDA error, a lost
# OpenCL device): it reported the job first, then left.
EXIT_DEVICE_UNUSABLE = 86


@dataclass(frozen=True)
class RunJob:
    job_id: str
    task: str
    params: dict[str, Any]
    inputs: dict[str, ArrayRef | RegionRef]
    output_dir: str | None  # where to keep the outputs; None: do not keep them
    output_region: RegionRef | None = None  # outputs into the client's memory (pool/regions.py)


@dataclass(frozen=True)
class OutputFile:
    """A kept output, written by the worker as NAME.npy in the job's output directory."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    offset: int | None = None  # written into the client's memory at this offset, not a file
    written: str | None = None  # there how: "in_place" (by the task), "copy", "d2h"


@dataclass(frozen=True)
class CancelJob:
    job_id: str


@dataclass(frozen=True)
class SetMemoryFraction:
    """A reload changed gpu.memoryFraction: take the new cap for jobs from now on."""

    fraction: float


@dataclass(frozen=True)
class Ping:
    token: int


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Warm:
    info: DeviceInfo
    pid: int


@dataclass(frozen=True)
class WarmFailed:
    reason: str


@dataclass(frozen=True)
class InfoUpdated:
    info: DeviceInfo


@dataclass(frozen=True)
class JobFinished:
    job_id: str
    status: str  # a JobState value: succeeded | failed | cancelled
    run_ms: float
    result: dict[str, Any] | None = None
    outputs: dict[str, OutputFile] = field(default_factory=dict)
    error: tuple[str, str, str] | None = None  # (code, message, hint)
    timings: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Pong:
    token: int


ToWorker = RunJob | CancelJob | SetMemoryFraction | Ping | Stop
FromWorker = Warm | WarmFailed | InfoUpdated | JobFinished | Pong
