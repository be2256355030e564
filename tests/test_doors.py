"""Every door held to the same rules (taogpud/doors): the listeners a running daemon holds
are found in /proc, each must be one the daemon registered, and the same battery runs
against every one of them: an idle-connection flood by a member (per uid) and by a
non-member over TCP (no uid), an endless head, a slow body, an oversized Content-Length;
while each flood is held, another member's job still runs.

A listener added later without the policy fails here: either it is not in the registry
(`GET /v1/status` doors) while /proc shows it listening, or the battery breaks it. Floods are
bounded (tens of connections over lowered caps) and every wait has a ceiling.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_access_users import User, as_user, become, make_users, value
from test_access_users import pytestmark as _needs_root

from taogpud.client import Client
from taogpud.testing import RunningDaemon
from taogpud.testing.fake_provider import FakeProvider, fake_provider

# real users (root and useradd: CI runs as root); one worker, so that module_quickd starts once
pytestmark = [_needs_root, pytest.mark.xdist_group("doors")]
KEY = "sk-doors-" + "0123456789abcdef" * 2
PER_UID, WITHOUT_UID, IN_ALL = 12, 6, 200
FLOOD_EXTRA = 30  # connections past the cap each flood opens
SERVER = {
    "max_connections_per_uid": PER_UID,
    "max_connections_without_uid": WITHOUT_UID,
    "max_connections": IN_ALL,
    "head_timeout_s": 30,
    "body_timeout_s": 30,
}
SHORT_CLOCKS = {**SERVER, "head_timeout_s": 1, "body_timeout_s": 1}
READ_CEILING_S = 20  # a wait that ends long before, unless the door failed
TOO_MANY = "too_many_connections"
SO_ACCEPTCON = 0x10000  # /proc/net/unix flags: a listening socket
TCP_LISTEN = "0A"


@pytest.fixture(scope="module")
def users() -> dict[str, User]:
    return make_users()


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    """What the relay door forwards to (no test here reads what it was sent)."""
    with fake_provider(KEY) as server:
        yield server


def _start(factory: Callable[..., RunningDaemon], base_url: str, server: dict[str, Any]) -> Any:
    settings = {"provider": {"baseUrl": base_url, "maxRetries": 0}}
    config = {
        "api": {"base_url": base_url},
        "relay": {"enabled": True, "listen": "127.0.0.1:0"},
        "server": server,
    }
    daemon = factory(settings, config, env={"TAOTOKEN_API_KEY": KEY})
    daemon.home.chmod(0o711)  # members reach its sockets (0660 root:taogpu)
    daemon.home.parent.chmod(0o711)
    return daemon


@pytest.fixture
def doorsd(daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider) -> RunningDaemon:
    """Caps low enough to reach with tens of connections; clocks long enough to hold them."""
    return _start(daemon_factory, provider.base_url, SERVER)


@pytest.fixture(scope="module")
def module_quickd(
    module_daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> RunningDaemon:
    """The same, with one-second head and body timeouts, for the tests here that flood
    nothing (a flood's summary lines come up to 10 s after it): they share it."""
    return _start(module_daemon_factory, provider.base_url, SHORT_CLOCKS)


@pytest.fixture
def quickd(module_quickd: RunningDaemon) -> RunningDaemon:
    """module_quickd, its trace begun at the test's start."""
    return module_quickd.trace_from_now()


# -- finding the doors -----------------------------------------------------------------------


def unix_http(daemon: RunningDaemon, method: str, path: str) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with httpx.Client(transport=transport, base_url="http://taogpud", timeout=30) as client:
        return client.request(method, path)


def registered_doors(daemon: RunningDaemon) -> list[dict[str, Any]]:
    doors = unix_http(daemon, "GET", "/v1/status").json()["doors"]
    assert isinstance(doors, list)
    return doors


def listening_inodes(pid: int) -> set[int]:
    """The inodes of every listening socket process `pid` holds, from /proc alone."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            link = str(fd.readlink())
            if link.startswith("socket:["):
                held.add(int(link[8:-1]))
    listening = set()
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[3], 16) & SO_ACCEPTCON:
            listening.add(int(fields[6]))
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN:
                listening.add(int(fields[9]))
    return held & listening


def test_every_listening_socket_is_a_registered_door(quickd: RunningDaemon) -> None:
    """What /proc shows the daemon listening on is exactly what its door registry lists:
    the control socket, the `.shm` socket and the relay's TCP port."""
    doors = registered_doors(quickd)
    assert sorted(d["name"] for d in doors) == ["control", "relay", "shm"]
    assert {d["inode"] for d in doors} == listening_inodes(quickd.proc.pid)
    kinds = {d["name"]: d["kind"] for d in doors}
    assert kinds == {"control": "http", "relay": "http", "shm": "shm"}


# -- speaking to a door ----------------------------------------------------------------------


def connect(door: dict[str, Any]) -> socket.socket:
    address = door["address"]
    if address.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(READ_CEILING_S)
        sock.connect(address)
    else:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=READ_CEILING_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything until the daemon hangs up (TimeoutError past READ_CEILING_S: it did not)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def http_answer(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head else 0
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    return status, parsed if isinstance(parsed, dict) else {}


def shm_message(data: bytes) -> dict[str, Any]:
    if len(data) < 4:
        return {}
    length = struct.unpack(">I", data[:4])[0]
    parsed = json.loads(data[4 : 4 + length])
    return parsed if isinstance(parsed, dict) else {}


def probe(door: dict[str, Any], sock: socket.socket) -> str:
    """One request on an open connection: the error code of its first answer (or "served").
    A connection refused at the door has its answer waiting already: nothing is sent on it
    (over TCP, bytes sent to a closed socket could reset it before its answer is read)."""
    if not select.select([sock], [], [], 0)[0]:
        with contextlib.suppress(OSError):
            sock.sendall(_probe_bytes(door))
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while not _whole(door, data) and (chunk := sock.recv(65536)):
            data += chunk
    if door["kind"] == "http":
        status, body = http_answer(data)
        return str(body.get("code") or status)
    error = shm_message(data).get("error") or {}
    return str(error.get("code") or "served")


def _probe_bytes(door: dict[str, Any]) -> bytes:
    if door["kind"] == "http":
        return b"GET /v1/health HTTP/1.1\r\nhost: %s\r\n\r\n" % door["address"].encode()
    return struct.pack(">I", 2) + b"{}"


def _whole(door: dict[str, Any], data: bytes) -> bool:
    if door["kind"] != "http":
        return len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def members_job_runs(daemon: RunningDaemon, member: User) -> None:
    """Another member's job, over the control socket, while a flood is held."""

    def run() -> Any:
        with Client(daemon.socket_path, timeout_s=60) as client:
            return client.run("noop", {})["status"]

    assert value(as_user(member, run)) == "succeeded"


# -- the floods ------------------------------------------------------------------------------


@contextlib.contextmanager
def flood(door: dict[str, Any], user: User, count: int) -> Iterator[list[str]]:
    """`count` connections to `door` opened as `user` in a forked child, each probed once;
    the codes come back while the child still holds the connections, which it closes when
    the block ends."""
    codes_read, codes_write = os.pipe()
    release_read, release_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(codes_read)
        os.close(release_write)
        codes: list[str] = []
        try:
            become(user)
            held = [connect(door) for _ in range(count)]
            codes = [probe(door, sock) for sock in held]
        except BaseException as exc:
            codes = [f"raised {type(exc).__name__}: {exc}"]
        os.write(codes_write, json.dumps(codes).encode())
        os.close(codes_write)
        os.read(release_read, 1)
        os._exit(0)
    os.close(codes_write)
    os.close(release_read)
    try:
        with os.fdopen(codes_read) as answer:
            yield json.loads(answer.read() or '["the child died"]')
    finally:
        os.write(release_write, b"x")
        os.close(release_write)
        os.waitpid(pid, 0)


def test_an_idle_flood_by_one_member_is_capped_at_every_unix_door(
    users: dict[str, User], doorsd: RunningDaemon
) -> None:
    """alice opens PER_UID + FLOOD_EXTRA connections to each Unix door: PER_UID are served,
    the rest refused at once (too_many_connections, in each door's own framing); carol's job
    still runs and carol is still served by the same door meanwhile."""
    unix_doors = [d for d in registered_doors(doorsd) if d["address"].startswith("/")]
    assert {d["name"] for d in unix_doors} == {"control", "shm"}
    for door in unix_doors:
        with flood(door, users["alice"], PER_UID + FLOOD_EXTRA) as codes:
            assert codes.count(TOO_MANY) == FLOOD_EXTRA, (door["name"], codes)
            assert TOO_MANY not in codes[:PER_UID], (door["name"], codes)
            members_job_runs(doorsd, users["carol"])
            with flood(door, users["carol"], 1) as carols:
                assert carols != [TOO_MANY] and not carols[0].startswith("raised")
            seen = {d["name"]: d for d in registered_doors(doorsd)}[door["name"]]
            assert seen["refused"] >= FLOOD_EXTRA
    lines = doorsd.events("door.connection_refused")
    assert 1 <= len(lines) <= 2 * len(unix_doors)  # a summary line, never one per refusal
    assert sum(line["count"] for line in lines) <= 2 * FLOOD_EXTRA


def test_an_idle_flood_without_a_uid_is_capped_at_the_tcp_door(
    users: dict[str, User], doorsd: RunningDaemon
) -> None:
    """mallory, no member, floods the relay's TCP port: the peers without a uid share
    WITHOUT_UID connections, the rest are refused at once; members' jobs still run."""
    (door,) = [d for d in registered_doors(doorsd) if not d["address"].startswith("/")]
    with flood(door, users["mallory"], WITHOUT_UID + FLOOD_EXTRA) as codes:
        assert codes.count(TOO_MANY) == FLOOD_EXTRA, codes
        assert TOO_MANY not in codes[:WITHOUT_UID], codes
        members_job_runs(doorsd, users["carol"])
    assert len(doorsd.events("door.connection_refused")) <= 2


# -- heads and bodies ------------------------------------------------------------------------


def relay_token(daemon: RunningDaemon) -> str:
    return str(unix_http(daemon, "POST", "/v1/relay/token").json()["token"])


def post_head(door: dict[str, Any], length: int, token: str) -> bytes:
    path = b"/v1/jobs" if door["name"] == "control" else b"/v1/chat/completions"
    return (
        b"POST %s HTTP/1.1\r\nhost: %s\r\nx-api-key: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (path, door["address"].encode(), token.encode(), length)
    )


def rss_kib(daemon: RunningDaemon) -> int:
    for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_an_endless_head_is_cut_at_every_door(
    users: dict[str, User], quickd: RunningDaemon
) -> None:
    """A head that streams on (1 MiB) at an HTTP door is answered 431 once 64 KiB came; a
    `.shm` message that declares more than its limit is refused before a byte of it is
    read. The daemon keeps none of it, and a member's job runs after each."""
    before = rss_kib(quickd)
    for door in registered_doors(quickd):
        with connect(door) as sock:
            if door["kind"] == "http":
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nhost: x\r\nx-endless: ")
                with contextlib.suppress(OSError):
                    for _ in range(64):
                        sock.sendall(b"a" * 16384)
                status, body = http_answer(read_until_closed(sock))
                assert (status, body.get("code")) == (431, "head_too_large"), door["name"]
            else:
                sock.sendall(struct.pack(">I", 0xFFFFFFFF))
                error = shm_message(read_until_closed(sock))["error"]
                assert "over the limit" in error["message"], error
        members_job_runs(quickd, users["carol"])
    assert rss_kib(quickd) - before < 16 * 1024


def slow_body_and_idle(door: dict[str, Any], token: str) -> None:
    """At one door, at once: a body begun and never finished, and a connection that sends
    nothing; the door hangs up on both."""
    with connect(door) as idle, connect(door) as sock:
        if door["kind"] == "http":
            sock.sendall(post_head(door, 100, token) + b'{"task": ')
            status, body = http_answer(read_until_closed(sock))
            assert (status, body.get("code")) == (408, "body_timeout"), door["name"]
        else:
            sock.sendall(struct.pack(">I", 100) + b'{"op": ')
            assert read_until_closed(sock) == b""
        assert read_until_closed(idle) == b""  # nothing sent: the head's clock


def test_a_slow_body_is_cut_at_every_door(users: dict[str, User], quickd: RunningDaemon) -> None:
    """A body (or `.shm` message) begun and never finished: the door hangs up once
    body_timeout_s has passed, with 408 body_timeout where HTTP can still say it; the
    first message never sent at all: closed at head_timeout_s. Every door's clocks run at
    once; then a member's job runs, once for each door."""
    token = relay_token(quickd)
    doors = registered_doors(quickd)
    with ThreadPoolExecutor(len(doors)) as pool:
        list(pool.map(slow_body_and_idle, doors, [token] * len(doors)))
    for _ in doors:
        members_job_runs(quickd, users["carol"])
    timeouts = quickd.events("door.body_timeout")
    assert {line["door"] for line in timeouts} == {"control", "relay"}
    assert {line["door"] for line in quickd.events("door.head_timeout")} == {
        "control",
        "relay",
        "shm",
    }


def test_an_oversized_content_length_is_refused_at_once_at_every_door(
    quickd: RunningDaemon,
) -> None:
    """A declared body over the door's limit is answered 413 in the error shape as soon as
    the head ends, before a byte of the body is sent; at `.shm`, a declared message over
    the limit likewise."""
    token = relay_token(quickd)
    for door in registered_doors(quickd):
        with connect(door) as sock:
            if door["kind"] == "http":
                sock.sendall(post_head(door, 1 << 50, token))
                status, body = http_answer(read_until_closed(sock))
                assert status == 413, (door["name"], status, body)
                assert set(body) == {"code", "message", "hint"}
                assert body["code"] == "body_too_large"
            else:
                sock.sendall(struct.pack(">I", (1 << 20) + 1))
                assert "over the limit" in shm_message(read_until_closed(sock))["error"]["message"]
