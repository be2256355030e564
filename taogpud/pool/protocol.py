"""The messages on a worker's pipe, both directions: plain dataclasses, sent with `send` and
read with `receive` (one pickled tuple each).

daemon → worker: RunJob, CancelJob, SetMemoryFraction, Ping, Stop
worker → daemon: Warm, WarmFailed, InfoUpdated, JobFinished, Pong
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from taogpud.arrayfiles.images import ArrayRef
from taogpud.backends.base import DeviceInfo
from taogpud.memfd.regions import RegionRef

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
    frozen_objects: int = 0  # start-up's objects the worker froze out of GC scans (heap.py)


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


# On the pipe a message is a tuple: its kind's number, then its fields in order. A tuple
# pickles and unpickles in C; a dataclass goes through copyreg in Python, with a pickler made
# per message by multiprocessing's send. Measured here, a RunJob took 4.4 µs to pickle that
# way and a JobFinished 3.2 µs to unpickle, against 0.5 and 0.7 µs as tuples; a worker between
# tiny jobs runs with cold caches, where each such µs is three to five.
_KINDS: tuple[type, ...] = (
    RunJob, CancelJob, SetMemoryFraction, Ping, Stop, Warm, WarmFailed, InfoUpdated,
    JobFinished, Pong,
)  # fmt: skip
_KIND_OF = {kind: number for number, kind in enumerate(_KINDS)}


def send(conn: Connection, message: ToWorker | FromWorker) -> None:
    fields = message.__dict__.values()  # a dataclass's fields, in the order __init__ takes
    conn.send_bytes(pickle.dumps((_KIND_OF[type(message)], *fields), pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """The next message (a ToWorker or a FromWorker, as the pipe's direction says). Raises
    EOFError or OSError as Connection.recv does."""
    kind, *fields = pickle.loads(conn.recv_bytes())
    return _KINDS[kind](*fields)
