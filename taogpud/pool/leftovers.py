"""The daemon's stop ends what spawning left behind: multiprocessing's resource tracker.

The first spawn starts the tracker (`python -c 'from multiprocessing.resource_tracker import
main; main(FD)'`), a child of the daemon that ignores SIGINT and SIGTERM and leaves only when
every holder of its pipe has closed it: just *after* the daemon exits. Under systemd that is too
late, the unit has stopped and systemd kills it as a left-over process (KillMode=mixed). It
tracks nothing of ours (arrays are files in /dev/shm, not multiprocessing.shared_memory), so
once no spawned process is alive it can go with SIGKILL, the only signal it does not ignore.
A later spawn finds it gone and starts a new one (ResourceTracker.ensure_running).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from pathlib import Path

TRACKER_MARK = b"multiprocessing.resource_tracker"


def own_children() -> list[int]:
    """This process's direct children, from /proc (every thread's list)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*"):
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in (task / "children").read_text().split()]
    return pids


def end_resource_tracker() -> int | None:
    """SIGKILL and reap our resource tracker once no spawned child lives; its pid, or None."""
    if multiprocessing.active_children():
        return None  # a worker (of another pool, in a test process) still holds it
    for pid in own_children():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if TRACKER_MARK in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return pid
    return None
