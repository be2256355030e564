"""The soak's door floods (scripts/soak.py): idle connections held against the relay's TCP
port (no uid: a non-member needs no token to open them) and against the `.shm` socket (by
another uid than the load's clients), for the second half of a phase while 8 clients run jobs.

Each fault opens its connections, notes how many the door refused at once, and holds the
rest until `hold_s` has passed; the phase's own accounting says whether any job was lost,
and its p99 what the flood cost the other user's jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from taogpud.memfd.protocol import socket_path_for
from taogpud.testing import RunningDaemon

FLOOD_CONNECTIONS = 600  # each flood: over the caps (64 without a uid, 256 a uid), bounded
REFUSAL_WAIT_S = 2.0  # a refused connection has its answer by then (a note, not a check)

Fault = Callable[[RunningDaemon, list[str]], RunningDaemon]


def relay_address(daemon: RunningDaemon) -> tuple[str, int]:
    with daemon.client() as client:
        listen = client.relay_token()["listen"]
    host, _, port = str(listen).rpartition(":")
    return host.strip("[]"), int(port)


def refused_at_once(held: list[socket.socket]) -> int:
    """How many of `held` the door answered (refused) without being asked anything, by
    REFUSAL_WAIT_S after the last was opened."""
    time.sleep(REFUSAL_WAIT_S)
    readable = 0
    for start in range(0, len(held), 500):  # select's own limit on one call
        readable += len(select.select(held[start : start + 500], [], [], 0)[0])
    return readable


def relay_flood(hold_s: float) -> Fault:
    """FLOOD_CONNECTIONS idle TCP connections to the relay, held for `hold_s`."""

    def fault(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
        _more_descriptors()
        address = relay_address(daemon)
        held = []
        for _ in range(FLOOD_CONNECTIONS):
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(address, timeout=10))
        notes.append(f"relay TCP: {len(held)} opened, {refused_at_once(held)} refused at once")
        threading.Timer(hold_s, _close_all, (held,)).start()
        return daemon

    return fault


def shm_flood(hold_s: float) -> Fault:
    """FLOOD_CONNECTIONS idle `.shm` connections as `nobody` (a forked child), for `hold_s`."""

    def fault(daemon: RunningDaemon, notes: list[str]) -> RunningDaemon:
        path = socket_path_for(daemon.socket_path)
        for folder in (daemon.home, daemon.home.parent):
            folder.chmod(0o711)  # nobody reaches the socket (0660, its group)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read_end)
            _hold_as_nobody(path, write_end, hold_s)
        os.close(write_end)
        with os.fdopen(read_end) as report:
            opened, refused = json.loads(report.read() or "[0, 0]")
        notes.append(f".shm as nobody: {opened} opened, {refused} refused at once")
        threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()
        return daemon

    return fault


def _hold_as_nobody(path: Path, report_fd: int, hold_s: float) -> None:
    outcome = [0, 0]
    try:
        gid = path.stat().st_gid
        _more_descriptors()
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        nobody = pwd.getpwnam("nobody").pw_uid
        os.setresuid(nobody, nobody, nobody)
        held = []
        for _ in range(FLOOD_CONNECTIONS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with contextlib.suppress(OSError):
                sock.connect(str(path))
                held.append(sock)
        outcome = [len(held), refused_at_once(held)]
    finally:
        os.write(report_fd, json.dumps(outcome).encode())
        os.close(report_fd)
    threading.Event().wait(hold_s)
    os._exit(0)


def _close_all(held: list[socket.socket]) -> None:
    for sock in held:
        sock.close()


def _more_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
