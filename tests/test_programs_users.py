"""Programs and other users (docs/programs.md): who may start, see and stop one, tried as
real local users through the socket (created here: CI runs as root; elsewhere these skip)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taogpud.client import Client
from taogpud.jobs.policy import REVOKE_GRACE_S
from taogpud.programs import leases
from taogpud.testing import RunningDaemon, wait_until
from tests.test_access_users import (
    User,
    as_user,
    outcome_as,
    pytestmark,  # noqa: F401  (skips without root and useradd)
    shared_daemon,  # noqa: F401  (a fixture)
    users,  # noqa: F401  (a fixture)
    value,
)
from tests.test_daemon import raw_request


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


@contextlib.contextmanager
def _living_as(user: User, action: Callable[[], Any]) -> Iterator[Any]:
    """`action` run as `user` in a forked child, as as_user runs it; its value, while the
    child lives on (a lease's starter that has gone quiet) until the block ends."""
    answer_read, answer_write = os.pipe()
    hold_read, hold_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(answer_read)
        os.close(hold_write)
        with os.fdopen(answer_write, "w") as out:
            out.write(json.dumps(outcome_as(user, action)))
        os.read(hold_read, 1)  # end of file once the parent closes its end
        os._exit(0)
    os.close(answer_write)
    os.close(hold_read)
    try:
        with os.fdopen(answer_read) as answer:
            outcome = json.loads(answer.read() or '{"raised": "the helper died"}')
        assert "raised" not in outcome, f"as {user.name}: {outcome['raised']}"
        yield value(outcome)
    finally:
        os.close(hold_write)
        os.waitpid(pid, 0)


def _granted_unstarted(socket_path: Path) -> Callable[[], Any]:
    """As the user: a lease on both devices, granted, its program never started."""

    def action() -> Any:
        with Client(socket_path, timeout_s=30) as client:
            job = client.submit_program(["true"], cwd="/", gpus=2)
            if job["status"] == "queued":
                job = client.lease(job["id"], after="queued", wait_s=60)["job"]
            return {"id": job["id"], "status": job["status"]}

    return action


# Another user's reports for a program she does not own: a start, and an exit with and
# without the start it carries (Programs.started, Programs.exited).
FOREIGN_REPORTS = (
    ("started", {"pid": "MINE"}),
    ("exited", {"exit_code": 0, "pid": "MINE"}),
    ("exited", {"exit_code": 0}),
)


def _foreign_reports(daemon: RunningDaemon, job_id: str) -> Callable[[], Any]:
    def action() -> Any:
        answers = []
        for report, body in FOREIGN_REPORTS:
            sent = {k: os.getpid() if v == "MINE" else v for k, v in body.items()}
            path = f"/v1/programs/{job_id}/{report}"
            answers.append(raw_request(daemon, "POST", path, json.dumps(sent).encode()))
        return answers

    return action


def _revoked_then_reported_by_another(
    people: dict[str, User], daemon: RunningDaemon
) -> tuple[list[Any], str, bool]:
    """alice's lease on both devices revoked (cancelled before its start) while her starter
    lives; a program queued behind it; carol's reports for alice's lease. What carol was
    answered, the queued program's phase after them, and whether that phase was read
    within REVOKE_GRACE_S of the cancel (after which the devices go back anyway)."""
    with (
        _living_as(people["alice"], _granted_unstarted(daemon.socket_path)) as holder,
        daemon.client() as client,
    ):
        assert holder["status"] == "running", holder
        waiting = client.submit_program(["true"], cwd="/", gpus=1)
        assert waiting["status"] == "queued", waiting
        cancelled_at = time.monotonic()
        assert client.cancel(holder["id"])["status"] == "cancelled"
        answers = value(as_user(people["carol"], _foreign_reports(daemon, holder["id"])))
        phase = client.lease(waiting["id"])["phase"]
        in_time = time.monotonic() - cancelled_at < REVOKE_GRACE_S
    # alice's starter has exited: it can start nothing there now, so the devices go back.
    with daemon.client() as client:
        assert client.lease(waiting["id"], after="queued", wait_s=60)["phase"] == "granted"
    return answers, phase, in_time


def test_another_users_report_for_a_revoked_lease_is_refused_and_frees_nothing(
    users: dict[str, User],  # noqa: F811
    shared_daemon: Callable[..., Any],  # noqa: F811
) -> None:
    """alice's lease revoked before its start: its devices stay held until her starter can
    start nothing on them. carol's /started or /exited for it (a start, an exit with its
    start, a bare exit) is refused 403 in the one error shape, and is not her starter's
    answer: the devices stay held, the program queued behind waits; alice's starter's
    exit then gives them back. (A fresh daemon again, at most twice, should the host be
    too slow to read the queued phase within the grace: after it, the devices are back
    whoever spoke.)"""
    for _ in range(3):
        answers, phase, in_time = _revoked_then_reported_by_another(users, shared_daemon())
        if in_time:
            break
    assert in_time, "the queued program's phase was read past REVOKE_GRACE_S three times"
    for (report, _), (status, answer) in zip(FOREIGN_REPORTS, answers, strict=True):
        assert (status, set(answer), answer["code"]) == (
            403,
            {"code", "message", "hint"},
            "forbidden",
        ), (report, answer)
        assert f"belongs to uid {users['alice'].uid}" in answer["message"], answer
        assert answer["hint"], answer
    assert phase == "queued"  # carol's word is not alice's starter's: nothing went back


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
