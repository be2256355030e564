"""Job records (the store that keeps them is store.py; their states are taogpud.wire's).

The record is the API's job view too: what a client reads is exactly what the
daemon knows, including where the job really ran.
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Any

from pydantic import BaseModel, Field

from taogpud.host.unix_socket import PeerCred

# The states are the wire's (the client reads them too); the `as` re-exports them from here.
from taogpud.wire import JobState as JobState  # noqa: PLC0414


class JobErrorView(BaseModel):
    code: str
    message: str
    hint: str = ""


class OutputView(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    nbytes: int
    offset: int | None = None  # in the client's shared memory (docs/shared-memory.md)
    # How it got there: "in_place" (the task computed it there: no copy), "copy" (computed
    # elsewhere in host memory, then copied in), "d2h" (the device's copy landed there).
    written: str | None = None


class Peer(BaseModel):
    """Who submitted the job, from SO_PEERCRED on the Unix socket."""

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def of(cls, cred: PeerCred) -> Peer:
        """The submitter a connection's SO_PEERCRED names (host/unix_socket.py reads it)."""
        return cls(pid=cred.pid, uid=cred.uid, gid=cred.gid)


PROGRAM_TASK = "program"  # a job that is a user's own program under a lease (docs/programs.md)


class ProgramView(BaseModel):
    """A program's lease: what it asked for, what it was given, and its process.

    The daemon never starts it: the submitting user's process does, in its own cwd and
    environment plus `env` below, and reports the pid, which the daemon checks and follows.
    Its argv, cwd and name are in the job's params (hidden from other users, access.view_of)."""

    gpus: int = 1  # devices wanted at once
    share: bool = False  # one slot of its device, not the whole device
    mem_bytes: int | None = None  # --mem; None: each device's whole cap
    # The lease, once granted:
    devices: list[str] = Field(default_factory=list)  # "gpu:0", "cpu:1"
    device_indexes: list[int] = Field(default_factory=list)
    device_uuids: list[str | None] = Field(default_factory=list)
    reserved_bytes: list[int] = Field(default_factory=list)  # per device, for admission
    deadline: float | None = None  # unix time its timeout stops it
    env: dict[str, str] = Field(default_factory=dict)  # set for the program by its starter
    # Its processes: the client that asked (and starts it), and the program itself. A pid is
    # that process only with its start time (/proc/PID/stat, clock ticks since boot).
    client_pid: int | None = None
    client_start: int | None = None
    pid: int | None = None
    pid_start: int | None = None
    stop: str | None = None  # "cancelled" | "timed_out": its starter was told to stop it
    log_bytes: int = 0  # its output kept as its log (a detached program: --detach)
    log_dropped_bytes: int = 0  # past scheduling.program_log_kb


class JobRecord(BaseModel):
    id: str
    task: str
    params: dict[str, Any]
    inputs: dict[str, str] = Field(default_factory=dict)  # input name → array id
    status: JobState = JobState.queued
    priority: int = 0  # higher runs first
    timeout_s: float | None = None
    affinity: str | None = None
    requested_device: int | None = None
    keep_outputs: bool = False
    max_retries: int = 0  # runs again this many times after a worker crash or a restart
    attempts: int = 0  # runs started so far that ended without a result
    peer: Peer = Field(default_factory=Peer)
    estimate_bytes: int = 0
    # Where it really ran: filled in by the worker, never by the request.
    backend: str | None = None
    device: str | None = None
    device_index: int | None = None
    device_uuid: str | None = None
    compute_capability: str | None = None
    fallback: bool = False
    fallback_reason: str | None = None
    worker_pid: int | None = None
    node_id: str | None = None  # the Ray node it ran on (executor "ray"); None on "local"
    node_hostname: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    # Timings (ms). h2d/kernel/d2h only with enable_profiling.
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    queue_ms: float | None = None
    run_ms: float | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    outputs: list[OutputView] = Field(default_factory=list)
    error: JobErrorView | None = None
    # Inputs from the client's own memory: {"handover": "shared" | "sealed", "bytes": N}.
    memory: dict[str, Any] | None = None
    program: ProgramView | None = None  # a user's own program (task "program"), else None


_id_bits = random.Random(secrets.randbits(64))  # ids need to be unique, not secret


def new_job_id() -> str:
    """Unique without coordination: 24 random bits, then the ms clock (ids of different
    milliseconds never clash). The random bits come first so that the 6 characters a person
    types tell apart jobs made together (a clock first made every job of one second share 8);
    what needs the order of creation sorts by `created_at` (the store's column), never by
    id. (Access to a job goes by the caller's uid, never by knowing its id, so the bits come
    from a seeded generator: a system call per id showed in the daemon's profile.)"""
    return f"{_id_bits.getrandbits(24):06x}{time.time_ns() // 1_000_000:011x}"
