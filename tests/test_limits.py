"""No client can starve the rest: head size and time limits, connections capped per uid and
in all (taogpud/doors), each tried through the daemon's real socket."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SharedInProcess

from taogpud.testing import DaemonHandle, InProcessDaemon, RunningDaemon

PER_UID, IN_ALL = 6, 10
LIMITS = {"server": {"max_connections_per_uid": PER_UID, "max_connections": IN_ALL}}
HEAD_TIMEOUT_S = 0.5
HEALTH = b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n"


LIMITED = {"server": {**LIMITS["server"], "head_timeout_s": HEAD_TIMEOUT_S}}


@pytest.fixture
def limited(shared_inprocess: SharedInProcess) -> InProcessDaemon:
    """A daemon with small caps and a short head timeout, in-process, that its tests share:
    each holds connections of its own and ends them, and reads its own trace lines."""
    return shared_inprocess.get(LIMITED).trace_from_now()


@pytest.fixture
def limited_alone(inprocess_factory: Callable[..., InProcessDaemon]) -> InProcessDaemon:
    """`limited` for a test that reads a line the daemon says once in NOISE_EVERY_S (a
    daemon of its own: another test's line would hold it back)."""
    return inprocess_factory(config=LIMITED)


@pytest.fixture(scope="module")
def limited_process(module_daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    """`limited` as a process of its own: its memory, descriptors and limits read, a second
    user connecting. Its tests share it (their connections end with them); only one makes
    it refuse a connection, and reads the refusals' log line."""
    return module_daemon_factory(config=LIMITED)


# The tests on limited_process, and those on limited, each run on one worker, so that each
# daemon starts once.
SHARED = pytest.mark.xdist_group("limits_process")
SHARED_IN_PROCESS = pytest.mark.xdist_group("limits_in_process")


def connect(daemon: DaemonHandle) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(daemon.socket_path))
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the daemon closes the connection."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def answer_of(data: bytes) -> tuple[int, Any]:
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def ask_health(sock: socket.socket) -> int:
    """GET /v1/health on an open connection: its status, its whole answer read."""
    sock.sendall(HEALTH)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or _closed()
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536) or _closed()
    return int(head.split(b" ")[1])


def _closed() -> bytes:
    raise AssertionError("the daemon closed the connection")


def open_fds(daemon: RunningDaemon) -> int:
    return len(list(Path(f"/proc/{daemon.proc.pid}/fd").iterdir()))


def wait_for_fds(daemon: RunningDaemon, count: int, timeout_s: float = 10.0) -> int:
    """The daemon's open fds once they are down to `count` (or the count at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while (now := open_fds(daemon)) > count and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


# -- heads ---------------------------------------------------------------------------------


@SHARED_IN_PROCESS
@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ([f"x-pad-{i}: {'a' * 1000}" for i in range(80)], "head passed 65536"),  # 80 KiB
        ([f"x-long: {'a' * 9000}"], "'x-long' passed 8192"),
    ],
    ids=["head-over-64-KiB", "line-over-8-KiB"],
)
def test_an_oversized_head_is_431_and_closed(
    limited: InProcessDaemon, headers: list[str], words: str
) -> None:
    """A head over 64 KiB, or one line over 8 KiB: 431 in the error shape, then closed."""
    head = "GET /v1/health HTTP/1.1\r\nhost: x\r\n" + "".join(h + "\r\n" for h in headers)
    with connect(limited) as sock:
        sock.sendall(head.encode() + b"\r\n")
        status, body = answer_of(read_all(sock))
    assert status == 431
    assert set(body) == {"code", "message", "hint"} and body["code"] == "head_too_large"
    assert words in body["message"]


@SHARED
def test_an_endless_header_is_cut_at_the_limit(limited_process: RunningDaemon) -> None:
    """A header that streams on (1 MiB of it) is answered 431 once 64 KiB have come, and the
    daemon stays lean and serves on."""
    rss_before = _rss_kib(limited_process)
    with connect(limited_process) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nx-endless: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(64):
                sock.sendall(b"a" * 16384)
        status, body = answer_of(read_all(sock))
    assert (status, body["code"]) == (431, "head_too_large")
    assert _rss_kib(limited_process) - rss_before < 8 * 1024  # nothing near the streamed MiB kept
    with connect(limited_process) as sock:
        assert ask_health(sock) == 200


@SHARED_IN_PROCESS
def test_a_head_within_its_time_keeps_the_connection(limited: InProcessDaemon) -> None:
    """Requests on one connection, each head complete in time: the connection serves on
    past head_timeout_s (the timer counts one head, not the connection's life)."""
    with connect(limited) as sock:
        for _ in range(3):
            assert ask_health(sock) == 200
            time.sleep(HEAD_TIMEOUT_S * 0.6)


@pytest.mark.parametrize("sent", [b"", b"GET /v1/health HTTP/1.1\r\nhost: x\r\n"])
def test_a_head_that_never_ends_is_closed(limited_alone: InProcessDaemon, sent: bytes) -> None:
    """Nothing, or a head without its end: the connection closes after server.head_timeout_s."""
    with connect(limited_alone) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        assert read_all(sock) == b""
        waited = time.monotonic() - started
    assert HEAD_TIMEOUT_S * 0.8 <= waited < HEAD_TIMEOUT_S + 5
    limited_alone.wait_for_event(lambda e: e.get("event") == "door.head_timeout")


# -- connections ---------------------------------------------------------------------------


@SHARED
def test_connections_per_uid_are_capped_while_another_uid_is_served(
    limited_process: RunningDaemon,
) -> None:
    """root holds its PER_UID connections; more are answered 503 and closed at once, logged
    once (rate-limited) with the uid; another uid is still served; the fds come back."""
    other = _other_uid()
    traced = limited_process.trace_from_now()  # this test's lines (the daemon is shared)
    baseline = open_fds(limited_process)
    with _connections(limited_process, PER_UID) as held:
        assert all(ask_health(sock) == 200 for sock in held)
        for _ in range(5):
            with connect(limited_process) as extra:
                status, body = answer_of(read_all(extra))
                assert (status, body["code"]) == (503, "too_many_connections")
        assert _health_as(limited_process, other) == 200
        assert all(ask_health(sock) == 200 for sock in held)  # the held ones still work
    assert wait_for_fds(limited_process, baseline) <= baseline
    refusals = traced.events("door.connection_refused")
    assert [(e["uid"], e["count"], e["level"]) for e in refusals] == [(0, 1, "warning")]
    with _connections(limited_process, PER_UID) as again:  # freed: the uid has its room back
        assert all(ask_health(sock) == 200 for sock in again)


def test_connections_in_all_are_capped(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """With the cap in all below the per-uid one, the connection past it is refused."""
    daemon = inprocess_factory(config={"server": {"max_connections": 3}})
    with _connections(daemon, 3) as held:
        assert all(ask_health(sock) == 200 for sock in held)
        with connect(daemon) as extra:
            assert answer_of(read_all(extra))[0] == 503
    with connect(daemon) as sock:
        assert ask_health(sock) == 200


@SHARED
def test_the_open_file_limit_is_raised_to_the_hard_limit(limited_process: RunningDaemon) -> None:
    """Every connection is a file descriptor: the daemon's soft limit is its hard limit."""
    limits = Path(f"/proc/{limited_process.proc.pid}/limits").read_text().splitlines()
    (line,) = [line for line in limits if line.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    assert soft == hard


@contextlib.contextmanager
def _connections(daemon: DaemonHandle, count: int) -> Iterator[list[socket.socket]]:
    held = [connect(daemon) for _ in range(count)]
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def _other_uid() -> int:
    if os.geteuid() != 0:
        pytest.skip("needs root, to connect as a second user (CI runs as root)")
    return pwd.getpwnam("nobody").pw_uid


def _health_as(daemon: RunningDaemon, uid: int) -> int:
    """GET /v1/health from a forked child that became `uid` before it connected (so
    SO_PEERCRED names that uid); its status comes back through a pipe."""
    daemon.home.chmod(0o711)  # mkdtemp's 0700 would keep the other user from the socket
    daemon.home.parent.chmod(0o711)
    gid = daemon.socket_path.stat().st_gid
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only what is imported already, then _exit
        status = 0
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            with connect(daemon) as sock:
                status = ask_health(sock)
        finally:
            os.write(write_end, str(status).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        status = int(answer.read() or 0)
    os.waitpid(pid, 0)
    return status


def _rss_kib(daemon: RunningDaemon) -> int:
    for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
