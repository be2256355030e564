"""Which socket a non-root user's client finds, and what a user outside the socket's group is
told: with real users and a real group, created here (CI runs as root).

Each case forks, drops to the user with setresuid/setresgid/setgroups, and runs the client
(or taogpuctl's `run`) in the child: the interpreter under /root is not reachable by another
user, so a fresh `python` as that user could not start, but a forked one already has
everything imported.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from taogpud import cli
from taogpud.client import Client, DaemonUnreachable, NotInGroup
from taogpud.host import paths

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="creates users and a group and switches to them: needs root"
)
OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass(frozen=True)
class Users:
    group: str
    gid: int
    member: pwd.struct_passwd  # in the group, in /etc/group and in its session
    outsider: pwd.struct_passwd  # not in the group at all
    late: pwd.struct_passwd  # in /etc/group, but its session's groups predate that


def _tool(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    tag = f"tg{os.getpid() % 100000}"
    group, names = f"{tag}sock", [f"{tag}mem", f"{tag}out", f"{tag}late"]
    _tool("groupadd", "--system", group)
    try:
        for name in names:
            _tool("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name)
        for name in (names[0], names[2]):
            _tool("usermod", "-aG", group, name)
        member, outsider, late = (pwd.getpwnam(name) for name in names)
        yield Users(group, grp.getgrnam(group).gr_gid, member, outsider, late)
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True, check=False)
        subprocess.run(["groupdel", group], capture_output=True, check=False)


def _as_user(user: pwd.struct_passwd, groups: list[int], work: Callable[[], Any]) -> Any:
    """work() in a forked child running as `user` with exactly `groups`; its JSON result.
    The child's stderr comes back as the result's "stderr" when work returns a dict."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            sys.stderr = os.fdopen(err_w, "w")  # pytest's capture would swallow it
            os.setgroups(groups)
            os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
            os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
            os.write(out_w, json.dumps(work()).encode())
            code = 0
        except BaseException as exc:
            os.write(out_w, json.dumps({"error": repr(exc)}).encode())
        sys.stderr.flush()
        os._exit(code)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        result, stderr = out.read(), err.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"{result!r} {stderr}"
    answer = json.loads(result)
    if isinstance(answer, dict):
        answer["stderr"] = stderr
    return answer


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may traverse (pytest's tmp_path lies under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="taogpud-access-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def group_socket(open_dir: Path, users: Users) -> Iterator[Path]:
    """A listening socket, root:<group> 0660 like taogpud.socket's, answering `{}` once
    per connection; in a directory every user may traverse."""
    path = open_dir / "taogpud.sock"
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    listening.listen()
    os.chown(path, 0, users.gid)
    path.chmod(0o660)

    def serve() -> None:
        while True:
            try:
                conn, _ = listening.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(OK_RESPONSE)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    listening.shutdown(socket.SHUT_RDWR)
    listening.close()
    thread.join(5)


def _cli(argv: list[str]) -> Callable[[], dict[str, Any]]:
    return lambda: {"exit": cli.run(argv)}


def test_outsider_is_told_to_join_the_group_with_its_own_exit_code(
    users: Users, group_socket: Path
) -> None:
    """`taogpuctl --socket S status` outside the socket's group: the join-the-group line and
    exit 4, not a usage error about a socket that "is not readable"."""
    outsider = users.outsider
    answer = _as_user(outsider, [], _cli(["--socket", str(group_socket), "status"]))
    assert answer["exit"] == cli.EXIT_NOT_IN_GROUP == 4, answer
    wanted = (
        f"taogpuctl: you are not in group {users.group}: "
        f"`sudo usermod -aG {users.group} $USER`, then log in again"
    )
    assert answer["stderr"].startswith(wanted), answer["stderr"]
    assert "--help" not in answer["stderr"]


def test_member_reaches_the_socket(users: Users, group_socket: Path) -> None:
    """A member of the group gets an answer through the same 0660 socket."""

    def health() -> dict[str, Any]:
        with Client(group_socket, timeout_s=5) as client:
            return {"health": client.health()}

    assert _as_user(users.member, [users.gid], health)["health"] == {}


def test_member_whose_session_predates_the_group_is_told_to_log_in_again(
    users: Users, group_socket: Path
) -> None:
    """In /etc/group but not in this session's groups: log in again, not usermod."""

    def denied() -> dict[str, Any]:
        with Client(group_socket, timeout_s=5) as client:
            try:
                client.health()
            except NotInGroup as exc:
                return {"message": exc.message, "hint": exc.hint}
        return {}

    answer = _as_user(users.late, [], denied)
    assert answer["message"] == f"you were added to group {users.group} after this session began"
    assert "log in again" in answer["hint"] and "usermod" not in answer["hint"]


def test_without_a_user_daemon_the_client_uses_the_system_socket(
    users: Users, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No TAOGPUD_SOCKET and no socket of a user daemon: /run/taogpud/taogpud.sock, and a
    failure names both places it looked."""
    monkeypatch.delenv("TAOGPUD_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(open_dir / "runtime"))
    own = open_dir / "runtime/taogpud/taogpud.sock"

    def found() -> dict[str, Any]:
        client = Client(timeout_s=2)
        answer: dict[str, Any] = {"path": client.socket_path, "tried": client.tried}
        try:
            client.health()
        except DaemonUnreachable as exc:
            answer["message"] = exc.message
        return answer

    answer = _as_user(users.member, [users.gid], found)
    assert answer["path"] == str(paths.SYSTEM_SOCKET)
    assert answer["tried"] == [str(own), str(paths.SYSTEM_SOCKET)]
    if not paths.SYSTEM_SOCKET.exists():  # a host running taogpud would answer instead
        assert answer["message"] == (
            f"no daemon socket at {paths.SYSTEM_SOCKET} "
            f"(looked at {own}, then {paths.SYSTEM_SOCKET})"
        )


def test_a_user_daemons_socket_wins_over_the_system_one(
    users: Users, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket under the user's own XDG_RUNTIME_DIR (their own daemon) is the one used."""
    monkeypatch.delenv("TAOGPUD_SOCKET", raising=False)
    runtime = open_dir / "runtime"
    (runtime / "taogpud").mkdir(parents=True)
    own = runtime / "taogpud/taogpud.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(own))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        answer = _as_user(users.member, [users.gid], lambda: {"path": Client().socket_path})
    assert answer["path"] == str(own)


def test_taogpud_socket_alone_when_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$TAOGPUD_SOCKET is the only place looked at, whoever asks."""
    chosen = tmp_path / "env.sock"
    assert paths.client_sockets({"TAOGPUD_SOCKET": str(chosen)}) == (chosen, [chosen])
