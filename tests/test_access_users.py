"""Data belongs to whoever uploaded it, tried as other local users would, through the socket.

Real users: alice and carol in group taogpu, mallory outside it, created here (CI runs as
root; elsewhere these tests skip). Each speaks to the daemon from a forked helper that drops
to the user with os.setresgid/os.setresuid after everything it needs is imported (the
interpreter may sit where the user could not even read it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taogpud import wire
from taogpud.arrayfiles import images
from taogpud.client import ApiError, Client, DaemonUnreachable
from taogpud.jobs.access import ADMIN_GROUP
from taogpud.testing import RunningDaemon

GROUP = "taogpu"
USERS_LOCK = Path("/tmp/taogpud-test-users.lock")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="creating users and switching to them needs root and useradd (CI runs as root)",
)


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def _ensure_user(name: str, *groups: str) -> User:
    """The system user `name` (no home, no shell) in `groups`; made if missing. Kept
    afterwards: parallel test workers share them, and they can log in nowhere."""
    with contextlib.suppress(KeyError):
        pwd.getpwnam(name)
        if groups:
            subprocess.run(["usermod", "-aG", ",".join(groups), name], check=True)
        return _user(name)
    extra = ["-G", ",".join(groups)] if groups else []
    command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    done = subprocess.run([*command, *extra, name], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"useradd {name}: {done.stderr}")
    return _user(name)


def _user(name: str) -> User:
    entry = pwd.getpwnam(name)
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return User(name, entry.pw_uid, entry.pw_gid, groups)


@pytest.fixture(scope="module")
def users() -> dict[str, User]:
    return make_users()


def make_users() -> dict[str, User]:
    """alice, carol (members), mallory (none), admin; made once, shared by test modules."""
    # One test worker at a time: useradd fails, not waits, while another holds /etc/passwd.
    with USERS_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for group in (GROUP, ADMIN_GROUP):
            subprocess.run(["groupadd", "-f", "--system", group], check=True)
        return {
            "alice": _ensure_user("tgd-alice", GROUP),
            "carol": _ensure_user("tgd-carol", GROUP),
            "mallory": _ensure_user("tgd-mallory"),
            "admin": _ensure_user("tgd-admin", GROUP, ADMIN_GROUP),
        }


def become(user: User) -> None:
    """This process (a forked child) turns into `user`: groups, then gid, then uid, each of
    the three ids (real, effective, saved), so that nothing can be taken back."""
    os.setgroups(list(user.groups))
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)


def outcome_as(user: User, action: Callable[[], Any]) -> dict[str, Any]:
    """In a forked child: become `user`, then run `action`. Its value as {"value": ...}, an
    ApiError as {"api_error": [status, code, message]}, anything else raised as {"raised": ...}."""
    try:
        become(user)
        return {"value": action()}
    except ApiError as exc:
        return {"api_error": [exc.http_status, exc.code, exc.message]}
    except BaseException as exc:
        return {"raised": f"{type(exc).__name__}: {exc}"}


def as_user(user: User, action: Callable[[], Any]) -> Any:
    """Run `action` in a forked child that is `user` (groups, gid, uid: all three ids of
    each); its value comes back as JSON, an ApiError as {"api_error": ...}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(outcome_as(user, action)))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        outcome = json.loads(answer.read() or '{"raised": "the helper died"}')
    os.waitpid(pid, 0)
    assert "raised" not in outcome, f"as {user.name}: {outcome['raised']}"
    return outcome


def value(outcome: dict[str, Any]) -> Any:
    assert "value" in outcome, f"expected an answer, got {outcome}"
    return outcome["value"]


@pytest.fixture
def shared_daemon(daemon_factory: Callable[..., Any], daemon_home: Path) -> Iterator[Any]:
    """A daemon other users can reach: its home traversable, its socket 0660 root:taogpu."""
    daemon_home.chmod(0o711)
    yield daemon_factory


@pytest.fixture(scope="module")
def module_daemon(module_daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    """One daemon other users can reach, for the tests that use only arrays and jobs of
    their own (by id) and change no setting: `shared_daemon`'s, started once."""
    daemon = module_daemon_factory()
    daemon.home.parent.chmod(0o711)
    return daemon


# The tests on module_daemon run on one worker, so that it starts once.
SHARED = pytest.mark.xdist_group("access_users_module_daemon")


def _client_call(socket_path: Path, call: Callable[[Client], Any]) -> Callable[[], Any]:
    def action() -> Any:
        with Client(socket_path, timeout_s=30) as client:
            return call(client)

    return action


def _upload(client: Client) -> str:
    return str(client.upload_array(np.arange(8, dtype=np.float32))["id"])


@SHARED
def test_another_users_array_id_answers_as_an_unknown_id(
    users: dict[str, User], module_daemon: RunningDaemon
) -> None:
    """carol naming alice's array id gets exactly what a made-up id gets; alice and root run."""
    daemon = module_daemon
    sock = daemon.socket_path
    alice_id = value(as_user(users["alice"], _client_call(sock, _upload)))
    made_up = "a" + "0" * 16

    def submit_with(array_id: str) -> Callable[[Client], Any]:
        return lambda c: c.submit("reduce_sum", inputs={"x": array_id})

    foreign = as_user(users["carol"], _client_call(sock, submit_with(alice_id)))
    unknown = as_user(users["carol"], _client_call(sock, submit_with(made_up)))
    assert foreign["api_error"][:2] == [404, "missing_input"]
    assert foreign["api_error"][2].replace(alice_id, made_up) == unknown["api_error"][2]
    own = as_user(
        users["alice"], _client_call(sock, lambda c: c.run("reduce_sum", inputs={"x": alice_id}))
    )
    assert value(own)["status"] == "succeeded" and value(own)["result"]["sum"] == 28.0
    with daemon.client() as root:  # root (and group taogpu-admin) may use anyone's
        assert root.run("reduce_sum", inputs={"x": alice_id})["status"] == "succeeded"


@SHARED
def test_another_users_job_shows_nothing_it_holds(
    users: dict[str, User], module_daemon: RunningDaemon
) -> None:
    """carol sees alice's job exists, not its params, inputs, result or outputs; she may not
    cancel it or download its output; alice sees it whole."""
    daemon = module_daemon
    sock = daemon.socket_path

    def alice_job(client: Client) -> Any:
        array_id = _upload(client)
        return client.run("sort", {"seed": 7}, inputs={"x": array_id}, keep_outputs=True)

    job = value(as_user(users["alice"], _client_call(sock, alice_job)))
    assert job["status"] == "succeeded" and job["inputs"] and job["outputs"]
    seen = value(as_user(users["carol"], _client_call(sock, lambda c: c.get(job["id"]))))
    listed = value(as_user(users["carol"], _client_call(sock, lambda c: c.list_jobs())))
    for view in (seen, next(j for j in listed if j["id"] == job["id"])):
        assert (view["task"], view["status"], view["peer"]["uid"]) == (
            "sort",
            "succeeded",
            users["alice"].uid,
        )
        assert view["params"] == {} and view["inputs"] == {}
        assert view["result"] is None and view["outputs"] == []
    refused = as_user(
        users["carol"], _client_call(sock, lambda c: c.download_output(job["id"], "sorted"))
    )
    assert refused["api_error"][:2] == [403, "forbidden"]
    cancel = as_user(users["carol"], _client_call(sock, lambda c: c.cancel(job["id"])))
    assert cancel["api_error"][:2] == [403, "forbidden"]
    own = value(as_user(users["alice"], _client_call(sock, lambda c: c.get(job["id"]))))
    assert own["inputs"] == job["inputs"] and own["result"] == job["result"]
    data = as_user(
        users["alice"], _client_call(sock, lambda c: len(c.download_output(job["id"], "sorted")))
    )
    assert value(data) > 32


@SHARED
def test_a_user_outside_the_group_cannot_connect(
    users: dict[str, User], module_daemon: RunningDaemon
) -> None:
    """mallory (not in taogpu) is refused by the socket's mode 0660 and told to join."""
    daemon = module_daemon

    def try_health() -> Any:
        try:
            with Client(daemon.socket_path, timeout_s=5) as client:
                return client.health()
        except DaemonUnreachable as exc:
            return {"unreachable": exc.message}

    outcome = value(as_user(users["mallory"], try_health))
    assert "unreachable" in outcome and "not in group taogpu" in outcome["unreachable"]


def test_uploads_evict_only_their_owners_pending_arrays(
    users: dict[str, User], shared_daemon: Callable[..., Any]
) -> None:
    """With a 1 MiB quota alice's second 600 KiB upload evicts her first, never carol's; a
    2 MiB one is refused naming the quota; status shows the quota and each caller's bytes."""
    daemon = shared_daemon(config={"memory": {"upload_quota_mb": 1}})
    sock = daemon.socket_path
    big = np.ones(150_000, dtype=np.float32)  # 600,000 bytes

    def upload_big(client: Client) -> str:
        return str(client.upload_array(big)["id"])

    alice_first = value(as_user(users["alice"], _client_call(sock, upload_big)))
    carols = value(as_user(users["carol"], _client_call(sock, upload_big)))
    value(as_user(users["alice"], _client_call(sock, upload_big)))

    def run_on(array_id: str) -> Callable[[Client], Any]:
        return lambda c: c.run("reduce_sum", inputs={"x": array_id})

    assert value(as_user(users["carol"], _client_call(sock, run_on(carols))))["status"] == (
        "succeeded"
    )
    gone = as_user(users["alice"], _client_call(sock, run_on(alice_first)))
    assert gone["api_error"][:2] == [404, "missing_input"]
    too_big = as_user(
        users["carol"], _client_call(sock, lambda c: c.upload_array(np.ones(2**19, np.float32)))
    )
    assert too_big["api_error"][:2] == [413, "array_too_large"]
    assert "quota of 1048576 bytes" in too_big["api_error"][2]
    status = value(as_user(users["carol"], _client_call(sock, lambda c: c.status())))
    arrays = status["arrays"]
    assert arrays["user_quota_bytes"] == 1 << 20
    assert arrays["your_pending_bytes"] == 600_128  # her one array: header 128 + data
    assert "never evicts another user's" in arrays["eviction"]


def _connect_as(user: User, socket_path: Path) -> socket.socket:
    """A Unix socket that `user` connected (SO_PEERCRED is taken at connect), handed back
    over SCM_RIGHTS: the test holds a connection of alice's without being alice."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            become(user)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(socket_path))
            socket.send_fds(theirs, [b"c"], [conn.fileno()])
        finally:
            os._exit(0)
    theirs.close()
    _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    os.waitpid(pid, 0)
    ours.close()
    assert fds, f"{user.name} could not connect to {socket_path}"
    return socket.socket(fileno=fds[0])


def _hold_upload(conn: socket.socket, data_bytes: int) -> None:
    """The head of an upload of `data_bytes` and its first 64 KiB; the rest never comes."""
    npy_head = wire.npy_header((data_bytes // 4,), "<f4")
    head = (
        f"POST {wire.UPLOAD_ARRAY.path} HTTP/1.1\r\nHost: localhost\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Content-Length: {len(npy_head) + data_bytes}\r\n\r\n"
    )
    conn.sendall(head.encode() + npy_head + bytes(64 * 1024))


def _until(check: Callable[[], bool], what: str) -> None:
    """Wait for what the daemon does on its own time (a bound for a hung daemon, not a speed)."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, f"never saw: {what}"
        time.sleep(0.02)


def test_uploads_held_mid_body_count_against_the_budget_and_their_owners_quota(
    users: dict[str, User], shared_daemon: Callable[..., Any]
) -> None:
    """Alice holds two 900 KiB uploads open mid-body (a 3 MiB budget, 2 MiB a user): status
    shows them reserved, /dev/shm holds no more than the budget, her third upload is refused
    by her quota and carol's 1.5 MiB one by the budget; once alice hangs up the reservations
    and the partial files are gone and carol's upload is taken. Before, every upload was
    taken, each reserving its size in /dev/shm, while status said 0 bytes were used."""
    daemon = shared_daemon(config={"memory": {"array_budget_mb": 3, "upload_quota_mb": 2}})
    sock, images = daemon.socket_path, _images_of(daemon.state_dir)
    size = 128 + 900 * 1024  # header and data of each held upload
    held = [_connect_as(users["alice"], sock) for _ in range(2)]
    for conn in held:
        _hold_upload(conn, 900 * 1024)
    with daemon.client() as root:
        assert root.status()["arrays"]["budget_bytes"] == 3 << 20
        _until(lambda: root.status()["arrays"]["reserved_bytes"] == 2 * size, "two reserved")
        assert sum(path.stat().st_size for path in images()) <= 3 << 20
        alices = value(as_user(users["alice"], _client_call(sock, lambda c: c.status())))
        assert alices["arrays"]["your_reserved_bytes"] == 2 * size
        third = as_user(users["alice"], _client_call(sock, lambda c: c.upload_array(_f32(900))))
        assert third["api_error"][:2] == [507, "array_store_full"]
        assert f"in progress have reserved {2 * size} bytes" in third["api_error"][2]
        carols = _client_call(sock, lambda c: c.upload_array(_f32(1536))["nbytes"])
        refused = as_user(users["carol"], carols)
        assert refused["api_error"][:2] == [507, "array_store_full"]
        assert f"{2 * size} are reserved by uploads still in progress" in refused["api_error"][2]
        for conn in held:
            conn.close()
        _until(lambda: root.status()["arrays"]["reserved_bytes"] == 0, "reservations back")
        assert images() == []  # the partial files went with their uploads
        assert value(as_user(users["carol"], carols)) == 1536 * 1024
        assert root.status()["arrays"]["used_bytes"] == 128 + 1536 * 1024


def _f32(kib: int) -> Any:
    return np.ones(kib * 256, np.float32)


def _images_of(state_dir: Path) -> Callable[[], list[Path]]:
    """The daemon's array images in /dev/shm (its namespace is its state directory's)."""
    pattern = f"{images.PREFIX}{images.namespace_of(state_dir)}.*"
    return lambda: sorted(images.SHM_DIR.glob(pattern))


@SHARED
def test_a_member_of_the_admin_group_may_use_and_see_anyones(
    users: dict[str, User], module_daemon: RunningDaemon
) -> None:
    """A user in taogpu-admin runs on alice's array and sees her job whole."""
    daemon = module_daemon
    sock = daemon.socket_path

    def alice_job(client: Client) -> Any:
        return client.run("reduce_sum", inputs={"x": _upload(client)})

    job = value(as_user(users["alice"], _client_call(sock, alice_job)))
    array_id = job["inputs"]["x"]
    ran = as_user(
        users["admin"], _client_call(sock, lambda c: c.run("reduce_sum", inputs={"x": array_id}))
    )
    assert value(ran)["result"]["sum"] == 28.0
    seen = value(as_user(users["admin"], _client_call(sock, lambda c: c.get(job["id"]))))
    assert seen["inputs"] == {"x": array_id} and seen["result"] == job["result"]
