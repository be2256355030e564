"""A lease granted but never started (docs/programs.md, "A lease never started"): a cancel or
a timeout ends its job at once, while its starter lives; its devices go back to the queue
only once that starter can no longer start a program on them (it answered, it is gone, or
the grace passed), and a start it reports after that is refused and killed.

The in-process daemon on the CPU pair (two devices, two slots each). This process is the
starter that never starts its program (a client of the raw API that asks for a lease and
does nothing with it), or a ProgramRun holding a grant the daemon has since revoked: its
start comes after the revoke, as a starter's that was slow (SIGSTOPped, swapped out) does.
The tests share the module's in-process daemon (`shared`), each leaving it as it found it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from taogpud.client import Client
from taogpud.client.program import ProgramRun
from taogpud.jobs import programs
from taogpud.testing import ClientProcess, InProcessDaemon, same_code_env
from tests.test_daemon import raw_request

pytestmark = pytest.mark.xdist_group("programs")

FOREVER_S = 3600.0  # a grace no test outlasts: the devices come back for another reason
WAIT_S = 60.0  # generous: a state reached, never a speed measured


@pytest.fixture
def forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """A revoked lease's devices held until its starter answers or exits, never by the clock."""
    monkeypatch.setattr(programs, "REVOKE_GRACE_S", FOREVER_S)


@pytest.fixture
def shared(module_inprocess_daemon: InProcessDaemon) -> Iterator[InProcessDaemon]:
    """The module's daemon, left as the test found it: what its leases still hold afterwards
    (this process asked for them and started nothing) is cancelled and answered for, as a
    starter that never started its program answers; so every device is free again."""
    yield module_inprocess_daemon
    with module_inprocess_daemon.client() as client:
        for job in client.list_jobs():
            if not _ended(job):
                client.cancel(job["id"])
            if job["task"] == "program" and job["program"]["pid"] is None:
                client.program_exited(job["id"], exit_code=None, not_started="none started")


@pytest.fixture
def program() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this one's, to report as a program's (it is this process's descendant)."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def _hold_both(client: Client, **request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A lease on both devices, granted and never started; behind it, a program queued."""
    holder = _when_granted(client, client.submit_program(["true"], cwd="/", gpus=2, **request))
    waiting = client.submit_program(["true"], cwd="/", gpus=1)
    assert waiting["status"] == "queued", waiting
    return dict(holder), dict(waiting)


def _when_granted(client: Client, job: Any) -> dict[str, Any]:
    """The job's record once its lease is granted (its devices' workers warm)."""
    if job["status"] == "queued":
        job = client.lease(job["id"], after="queued", wait_s=WAIT_S)["job"]
    assert job["status"] == "running" and job["program"]["devices"], job
    return dict(job)


def _ended(job: Any) -> bool:
    return job["status"] not in ("queued", "running")


def _phase(client: Client, job_id: str) -> str:
    return str(client.lease(job_id)["phase"])


def _granted(client: Client, job_id: str) -> str:
    """The lease's phase once it leaves `queued` (WAIT_S at most)."""
    return str(client.lease(job_id, after="queued", wait_s=WAIT_S)["phase"])


def _refused_as_revoked(status: int, answer: Any, job_id: str) -> None:
    assert (status, set(answer), answer["code"]) == (
        409,
        {"code", "message", "hint"},
        "lease_revoked",
    ), answer
    assert job_id in answer["message"] and "revoked" in answer["message"], answer
    assert answer["hint"], answer


@pytest.mark.usefixtures("forever")
def test_a_cancel_ends_a_lease_never_started_and_its_devices_wait_for_its_starter(
    shared: InProcessDaemon, program: subprocess.Popen[bytes]
) -> None:
    """Cancelled while its starter (this process) lives and has started nothing: the job ends
    `cancelled` in the cancel's own answer. The program queued behind it is not placed
    while that starter could still start on those devices; its start, reported after, is
    refused (409 lease_revoked), and then the queued program gets them."""
    with shared.client() as client:
        holder, waiting = _hold_both(client)
        cancelled = client.cancel(holder["id"])
        assert cancelled["status"] == "cancelled", cancelled
        assert cancelled["error"]["code"] == "cancelled" and cancelled["program"]["pid"] is None
        assert _phase(client, holder["id"]) == "ended"
        assert _phase(client, waiting["id"]) == "queued"  # the starter has not answered
        body = json.dumps({"pid": program.pid}).encode()
        path = f"/v1/programs/{holder['id']}/started"
        _refused_as_revoked(*raw_request(shared, "POST", path, body), holder["id"])
        assert _granted(client, waiting["id"]) == "granted"
        assert client.get(holder["id"])["program"]["pid"] is None  # never taken as started


@pytest.mark.usefixtures("forever")
def test_a_timeout_ends_a_lease_never_started_and_a_late_exit_with_a_pid_is_refused(
    shared: InProcessDaemon, program: subprocess.Popen[bytes]
) -> None:
    """Its timeout passes while its starter lives and has started nothing: the job ends
    `timed_out`. A start reported with its exit after that (one request for a short
    program) is refused too, and answers for the starter: the devices go back."""
    with shared.client() as client:
        holder, waiting = _hold_both(client, timeout_s=0.5)
        ended = client.wait(holder["id"], timeout_s=WAIT_S)
        assert ended["status"] == "timed_out", ended
        assert (
            ended["error"]["code"] == "timed_out"
            and "timeout of 0.5 s" in ended["error"]["message"]
        )
        assert _phase(client, waiting["id"]) == "queued"
        body = json.dumps({"exit_code": 0, "pid": program.pid}).encode()
        path = f"/v1/programs/{holder['id']}/exited"
        _refused_as_revoked(*raw_request(shared, "POST", path, body), holder["id"])
        assert _granted(client, waiting["id"]) == "granted"
        assert client.get(holder["id"])["status"] == "timed_out"  # ended once


def test_a_revoked_leases_devices_come_back_after_the_grace(
    shared: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starter that never answers (hung, SIGSTOPped) and lives on holds nothing past the
    grace: the program queued behind is placed then."""
    monkeypatch.setattr(programs, "REVOKE_GRACE_S", 0.2)
    with shared.client() as client:
        holder, waiting = _hold_both(client)
        assert client.cancel(holder["id"])["status"] == "cancelled"
        assert _granted(client, waiting["id"]) == "granted"


# A client that asks for a lease on both devices and never starts anything.
SILENT_CLIENT = """
c.submit_program(["true"], cwd="/", gpus=2)
print("ready", flush=True)
import time
time.sleep(600)
"""


@pytest.mark.usefixtures("forever")
def test_a_revoked_leases_devices_come_back_when_its_starter_exits(
    shared: InProcessDaemon,
) -> None:
    """The lease's client, another process, is alive when its lease is cancelled; the queued
    program is placed once it exits (it can start nothing any more)."""
    silent = ClientProcess(shared.socket_path, SILENT_CLIENT)
    try:
        with shared.client() as client:
            (holder,) = [j for j in client.list_jobs() if not _ended(j)]  # the silent one's
            holder = _when_granted(client, holder)
            waiting = client.submit_program(["true"], cwd="/", gpus=1)
            assert client.cancel(holder["id"])["status"] == "cancelled"
            assert _phase(client, waiting["id"]) == "queued"
            assert silent.proc.poll() is None  # cancelled while it lives
            silent.kill()
            assert _granted(client, waiting["id"]) == "granted"
    finally:
        if silent.proc.poll() is None:
            silent.kill()


@pytest.mark.parametrize("at_once", [False, True], ids=["started", "exited-with-pid"])
def test_a_starter_whose_start_is_refused_kills_the_program_and_ends_with_the_job(
    shared: InProcessDaemon, at_once: bool
) -> None:
    """ProgramRun holding a grant revoked since (cancelled before it started the program):
    it starts the program, its report is refused, and it kills the program's process group
    (SIGKILL), reaps it and returns the job as it ended. Either report: /started (a long
    program), or /exited with the pid (one over at once)."""
    argv, within = (["true"], 600.0) if at_once else (["sleep", "600"], 0.0)
    with shared.client() as client:
        run = ProgramRun(client, argv, cwd="/", gpus=2, report_within_s=within)
        job = _when_granted(client, run.submit())
        assert client.cancel(job["id"])["status"] == "cancelled"
        outcome = run.follow(job)  # its grant, as it held it before the cancel
    assert run.process is not None and run.process.returncode is not None  # reaped
    if not at_once:
        assert run.process.returncode == -signal.SIGKILL
    ended = outcome.job
    assert (ended["id"], ended["status"], ended["result"]) == (job["id"], "cancelled", None)
    assert ended["program"]["pid"] is None and outcome.exit_status == 1


# A detached supervisor's run (taogpud.client.supervise: subreaper, output shipped as the
# log) of a grant it holds while the test cancels it: it goes on when told on stdin.
SUPERVISOR = """
import json, sys
from taogpud.client import Client
from taogpud.client.program import ProgramRun
from taogpud.client.supervise import LogShipper
shipper = LogShipper(sys.argv[1])
with Client(sys.argv[1]) as client:
    argv = ["sh", "-c", "echo out; exec sleep 600"]
    run = ProgramRun(client, argv, cwd="/", gpus=2, reap_descendants=True, on_output=shipper)
    job = run.submit()
    if job["status"] == "queued":
        job = client.lease(job["id"], after="queued", wait_s=60)["job"]
    shipper.job_id = job["id"]
    print(job["id"], flush=True)
    sys.stdin.readline()
    outcome = run.follow(job)
    print(json.dumps({"status": outcome.job["status"], "returncode": run.process.returncode,
                      "exit_status": outcome.exit_status}), flush=True)
"""


def test_a_detached_supervisor_kills_a_program_whose_start_was_refused(
    shared: InProcessDaemon,
) -> None:
    """The supervisor `exec --detach` leaves (a subreaper shipping the output) takes the same
    path: its program killed and reaped, its own exit status the job's (1, cancelled)."""
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(shared.socket_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=same_code_env(os.environ),
    )  # fmt: skip
    assert supervisor.stdin is not None and supervisor.stdout is not None
    try:
        job_id = supervisor.stdout.readline().strip()
        with shared.client() as client:
            assert client.cancel(job_id)["status"] == "cancelled"
        supervisor.stdin.write("go\n")
        supervisor.stdin.flush()
        out, _ = supervisor.communicate(timeout=WAIT_S)
        said = json.loads(out)
        assert said == {"status": "cancelled", "returncode": -signal.SIGKILL, "exit_status": 1}
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.communicate()
