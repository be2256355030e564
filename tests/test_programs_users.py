"""Programs and other users (docs/programs.md): who may start, see and stop one, tried as
real local users through the socket (created here: CI runs as root; elsewhere these skip)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taogpud.client import Client
from taogpud.programs import leases
from taogpud.testing import wait_until
from tests.test_access_users import (
    User,
    as_user,
    pytestmark,  # noqa: F401  (skips without root and useradd)
    shared_daemon,  # noqa: F401  (a fixture)
    users,  # noqa: F401  (a fixture)
    value,
)


def _start_sleeper(socket_path: Path) -> Callable[[], Any]:
    """As the user: queue a program, start `sleep` under its lease, report it; the helper
    then exits, leaving the program to run on under its lease."""

    def action() -> Any:
        with Client(socket_path, timeout_s=30) as client:
            job = client.submit_program(["sleep", "600"], cwd="/")
            lease = client.lease(job["id"])
            while lease["phase"] == "queued":
                lease = client.lease(job["id"], after="queued", wait_s=30)
            process = subprocess.Popen(["sleep", "600"], start_new_session=True)
            client.program_started(job["id"], process.pid)
            return {"job_id": job["id"], "pid": process.pid}

    return action


def _call(socket_path: Path, call: Callable[[Client], Any]) -> Callable[[], Any]:
    def action() -> Any:
        with Client(socket_path, timeout_s=30) as client:
            return call(client)

    return action


def test_others_see_a_program_but_not_what_it_runs_and_may_not_touch_it(
    users: dict[str, User],  # noqa: F811
    shared_daemon: Callable[..., Any],  # noqa: F811
) -> None:
    """carol sees alice's program's id, state, device and owner, never its argv, cwd, lease
    or log; she may not cancel it nor claim a process for it; alice may not start it twice,
    nor report a process that is not hers or not her own descendant (at its start, or with
    its exit: a program over at once is reported once); her cancel stops it."""
    daemon = shared_daemon()
    sock = daemon.socket_path
    started = value(as_user(users["alice"], _start_sleeper(sock)))
    job_id, pid = started["job_id"], started["pid"]
    seen = value(as_user(users["carol"], _call(sock, lambda c: c.get(job_id))))
    assert (seen["task"], seen["status"], seen["device"]) == ("program", "running", "cpu:0")
    assert seen["peer"]["uid"] == users["alice"].uid and seen["params"] == {}
    log = as_user(users["carol"], _call(sock, lambda c: c.program_log(job_id)))
    assert log["api_error"][:2] == [403, "forbidden"]
    lease = as_user(users["carol"], _call(sock, lambda c: c.lease(job_id)))
    assert lease["api_error"][:2] == [403, "forbidden"]
    cancel = as_user(users["carol"], _call(sock, lambda c: c.cancel(job_id)))
    assert cancel["api_error"][:2] == [403, "forbidden"]
    claim = as_user(users["carol"], _call(sock, lambda c: c.program_started(job_id, pid)))
    assert claim["api_error"][:2] == [403, "forbidden"]
    twice = as_user(users["alice"], _call(sock, lambda c: c.program_started(job_id, pid)))
    assert (
        twice["api_error"][:2] == [409, "conflict"]
        and "was started already" in twice["api_error"][2]
    )

    def claim_for_a_new_job(claimed_pid: int, with_exit: bool) -> Callable[[Client], Any]:
        def call(client: Client) -> Any:
            other = client.submit_program(["true"], cwd="/", device=1)
            wait_until(lambda: client.lease(other["id"])["phase"] != "queued", "granted", 60)
            if with_exit:
                return client.program_exited(other["id"], exit_code=0, pid=claimed_pid)
            return client.program_started(other["id"], claimed_pid)

        return call

    for with_exit in (False, True):
        root = daemon.proc.pid
        roots = as_user(users["alice"], _call(sock, claim_for_a_new_job(root, with_exit)))
        assert roots["api_error"][:2] == [403, "forbidden"], (with_exit, roots)
        assert "belongs to uid 0" in roots["api_error"][2]
        not_mine = as_user(users["alice"], _call(sock, claim_for_a_new_job(pid, with_exit)))
        assert not_mine["api_error"][:2] == [403, "forbidden"], (with_exit, not_mine)
        assert "not a descendant of the caller" in not_mine["api_error"][2]
    own = value(as_user(users["alice"], _call(sock, lambda c: c.get(job_id))))
    assert own["params"]["argv"] == ["sleep", "600"]
    value(as_user(users["alice"], _call(sock, lambda c: c.cancel(job_id))))
    with daemon.client() as client:
        ended = client.wait(job_id, timeout_s=60)
    # Its starter is gone: the daemon signalled it (it may: it runs as root here).
    assert ended["status"] == "cancelled", ended
    process = leases.read_process(pid)  # gone, or a zombie that init has not reaped yet
    assert process is None or process.exited or process.start != ended["program"]["pid_start"]


@pytest.mark.parametrize("reused", [False, True], ids=["same process", "reused pid"])
def test_a_pid_is_its_process_only_with_its_start_time(reused: bool) -> None:
    """A pid another process took later is not the program: its start time differs."""
    with subprocess.Popen(["sleep", "60"]) as process:
        facts = leases.read_process(process.pid)
        assert facts is not None and facts.ppid > 0
        start = facts.start + (1 if reused else 0)
        assert leases.alive(process.pid, start) is not reused
        process.kill()
    assert not leases.alive(process.pid, facts.start)
