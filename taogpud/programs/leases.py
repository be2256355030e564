"""A program's processes as the daemon sees them, standard library only: who owns one, whose
descendant it is, when it started, and its end followed with a pidfd.

The daemon never starts a user's program and holds no privilege over it (docs/programs.md):
it checks what a client tells it against /proc and SO_PEERCRED, and follows the process with
`os.pidfd_open`, which needs no permission over it. A pid names a process only together with
its start time (field 22 of /proc/PID/stat): a pid the kernel gave again is another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Callable
from typing import NamedTuple

MAX_ANCESTRY = 512  # parents walked up from a pid before giving up: deeper is no descendant
PROC_READ_BYTES = 4096  # /proc/PID/stat and status are one read of this (status ~1.5 KB)


class Process(NamedTuple):
    """What /proc says of one process."""

    pid: int
    ppid: int
    uid: int  # its real uid
    start: int  # clock ticks after boot: with the pid, this process and no other
    exited: bool = False  # a zombie: it has ended, its parent has not waited for it yet


def read_process(pid: int) -> Process | None:
    """The process `pid` as /proc shows it now (a zombie too: a program that ended before
    its starter reported it is still that program); None if there is none."""
    fields = _stat_fields(pid)
    status = None if fields is None else _read(f"/proc/{pid}/status")
    if fields is None or status is None:
        return None
    uid_line = next(line for line in status.splitlines() if line.startswith(b"Uid:"))
    uid, exited = int(uid_line.split()[1]), fields[0] == b"Z"
    return Process(pid, int(fields[1]), uid, int(fields[19]), exited)


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot), a zombie too; None if none."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def alive(pid: int | None, start: int | None) -> bool:
    """Whether the process that had `pid` and `start` is still there (not a reused pid;
    a zombie is: its parent has its exit status)."""
    return pid is not None and start is not None and start_time(pid) == start


def descends_from(process: Process, ancestor: int) -> bool:
    """Whether `ancestor` is `process` itself or one of its parents, grandparents, …"""
    pid, ppid = process.pid, process.ppid
    for _ in range(MAX_ANCESTRY):
        if ancestor in (pid, ppid):  # a program's starter is most often its parent: no read
            return True
        if ppid in (0, pid):
            return False
        fields = _stat_fields(ppid)
        if fields is None:
            return False
        pid, ppid = ppid, int(fields[1])
    return False


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the name (the state first), or None: no such process."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the name in () may hold spaces
    return None if fields[0] == b"X" else fields


def _read(path: str) -> bytes | None:
    """A /proc file whole, None if it is gone. os.read, not pathlib: 17 µs against 32 a
    read, 5 reads a program when they were read_bytes (bench/results/programs.md)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        pieces = [os.read(fd, PROC_READ_BYTES)]
        while len(pieces[-1]) == PROC_READ_BYTES:  # procfs hands a file out in pieces
            pieces.append(os.read(fd, PROC_READ_BYTES))
    except OSError:  # ESRCH: it ended between the open and the read
        return None
    finally:
        os.close(fd)
    return b"".join(pieces)


class Watch:
    """A process's end, followed with a pidfd read from the event loop: `on_end` is called
    once, when it has exited (at once if it is gone already or is not the process of
    `start`). `signal()` reaches that process and never one that took its pid after it."""

    def __init__(self, pid: int, start: int, on_end: Callable[[], None]) -> None:
        self.pid, self.start = pid, start
        self._on_end = on_end
        self._fd: int | None = None
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            asyncio.get_running_loop().call_soon(self._ended)
            return
        if not alive(pid, start):  # the pid was reused before the pidfd was opened
            os.close(fd)
            asyncio.get_running_loop().call_soon(self._ended)
            return
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self._ended)

    @property
    def ended(self) -> bool:
        return self._fd is None

    def signal(self, signum: int) -> bool:
        """Send `signum`; False where it is gone or not ours to signal (the packaged daemon
        runs as its own user: only the program's starter may stop it then)."""
        if self._fd is None:
            return False
        try:
            signal.pidfd_send_signal(self._fd, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self) -> None:
        """Stop following it, without calling on_end."""
        self._on_end = _nothing
        self._drop()

    def _ended(self) -> None:
        self._drop()
        on_end, self._on_end = self._on_end, _nothing
        on_end()

    def _drop(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(ValueError, RuntimeError):  # the loop may be closed
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None


def _nothing() -> None:
    return None


class Watches:
    """Processes each followed for several holders (a client's leases) with one Watch, from
    its first holder until it exits, however many holders come and go meanwhile: a client
    that runs short programs one after another is followed once, not once a program (its
    pidfd opened, its start read, the loop's reader added, then all undone: ~4% of the
    daemon's CPU under 8 submitters of `true`, bench/results/programs.md). `on_end(holder)`
    is called for each holder the process had when it ended."""

    def __init__(self, on_end: Callable[[str], None]) -> None:
        self._on_end = on_end
        self._watches: dict[tuple[int, int], Watch] = {}  # (pid, start) → its one Watch
        self._holders: dict[tuple[int, int], set[str]] = {}

    def follow(self, pid: int, start: int, holder: str) -> None:
        """Call on_end(holder) once the process of `pid` and `start` has ended (soon, if it
        has already)."""
        key = (pid, start)
        self._holders.setdefault(key, set()).add(holder)
        if key not in self._watches:
            self._watches[key] = Watch(pid, start, functools.partial(self._ended, key))

    def let_go(self, pid: int, start: int, holder: str) -> None:
        """`holder` no longer asks; the process stays followed (for its next holder)."""
        self._holders.get((pid, start), set()).discard(holder)

    def close(self) -> None:
        """Follow nothing any more (the daemon stops), calling no on_end."""
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
        self._holders.clear()

    def _ended(self, key: tuple[int, int]) -> None:
        self._watches.pop(key, None)
        for holder in sorted(self._holders.pop(key, set())):
            self._on_end(holder)


class Granted(NamedTuple):
    """One device of a lease, as the environment describes it."""

    backend: str  # "cuda" | "cpu" | "opencl"
    label: str  # "gpu:0"
    uuid: str | None
    thread_num: int  # the worker's BLAS/OpenMP threads (the CPU backend's share of the host)


def lease_env(job_id: str, devices: list[Granted], mem_bytes: list[int]) -> dict[str, str]:
    """What a program's starter adds to its environment: the devices it was given and no
    others. CUDA by UUID (never bare indices: CUDA and NVML may number devices differently)
    in PCI bus order; on the CPU, no GPU at all and the OpenMP threads of its workers."""
    env = {"TAOGPUD_JOB_ID": job_id, "TAOGPUD_DEVICES": ",".join(d.label for d in devices)}
    backends = {d.backend for d in devices}
    if backends == {"cuda"}:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or d.label for d in devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUPY_GPU_MEMORY_LIMIT"] = str(min(mem_bytes))  # CuPy's pool stops there
    elif backends == {"cpu"}:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the lease holds no GPU
        env["OMP_NUM_THREADS"] = str(sum(d.thread_num for d in devices))
    return env
