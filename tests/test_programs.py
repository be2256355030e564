"""Users' own programs under a lease (docs/programs.md), through a real daemon's socket.

Real programs (shell and Python scripts) started by `taogpuctl exec` as real processes, on
the CPU pair (two devices, two slots each). They wait on files the test makes, never on a
clock: a program says it runs by creating `started`, and ends once `release` exists.

The tests share one daemon (`daemon` here), each leaving it as it found it: every program of
its own ended, nothing queued, no device held; the test that kills a daemon starts its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taogpud.client.program import ProgramRun
from taogpud.errors import UnsupportedExecutor
from taogpud.jobs.records import Peer
from taogpud.programs import leases
from taogpud.testing import RunningDaemon, ctl_command, ctl_env, wait_until
from taogpud.wire import ProgramRequest
from tests.test_daemon import raw_request
from tests.test_scheduler_states import Incarnation

pytestmark = pytest.mark.xdist_group("programs")

# Says it runs, then waits for `release`; prints its lease's environment; exits with $1.
HOLDER = """
import json, os, pathlib, sys, time
here = pathlib.Path(sys.argv[1])
names = ("TAOGPUD_JOB_ID", "TAOGPUD_DEVICES", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
env = {name: os.environ.get(name) for name in names}
(here / "env.json").write_text(json.dumps({**env, "cwd": os.getcwd(), "pid": os.getpid()}))
(here / "started").touch()
while not (here / "release").exists():
    time.sleep(0.02)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def shared_daemon(module_daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    """The module's daemon: debug logging (one test reads its api.request lines) and 1 KB
    program logs (one test fills one; the others' logs are a few bytes)."""
    return module_daemon_factory(
        settings={"logging": {"level": "debug"}}, config={"scheduling": {"program_log_kb": 1}}
    )


@pytest.fixture
def daemon(shared_daemon: RunningDaemon) -> RunningDaemon:
    """The module's daemon once the tests before have left it idle (their starters report
    their programs' ends as their fixtures release them): nothing running or queued. One
    test at a time: the group "programs" keeps this module's tests on one worker."""
    with shared_daemon.client() as client:

        def idle() -> bool:
            return not client.list_jobs("running") and not client.list_jobs("queued")

        wait_until(idle, "the earlier tests' programs ended", 60)
    return shared_daemon


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "holder.py").write_text(HOLDER)
    return tmp_path


class Exec:
    """`taogpuctl exec … -- python3 holder.py DIR STATUS` running in the background."""

    def __init__(self, daemon: RunningDaemon, folder: Path, *flags: str, status: int = 0) -> None:
        self.folder = folder
        folder.mkdir(exist_ok=True)
        program = [sys.executable, str(folder.parent / "holder.py"), str(folder), str(status)]
        self.proc = subprocess.Popen(
            [*ctl_command(daemon.socket_path), "exec", *flags, "--", *program],
            cwd=folder,
            env=ctl_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group, as a terminal's foreground job
        )

    def wait_started(self) -> dict[str, Any]:
        started = self.folder / "started"
        wait_until(lambda: started.exists() or self.proc.poll() is not None, "started", 60)
        assert self.proc.poll() is None, self.proc.communicate()
        return dict(json.loads((self.folder / "env.json").read_text()))

    def release(self) -> tuple[int, str, str]:
        (self.folder / "release").touch()
        return self.finish()

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err


@pytest.fixture
def execs() -> Iterator[list[Exec]]:
    started: list[Exec] = []
    yield started
    for run in started:  # a failed test leaves no program waiting
        (run.folder / "release").touch()
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.communicate()


def test_exec_runs_the_program_here_as_the_caller_with_the_lease(
    daemon: RunningDaemon, work: Path
) -> None:
    """Its cwd, the lease's devices in its environment (on the CPU: no GPU, OpenMP threads
    from thread_num), its output on taogpuctl's stdout, its exit status taogpuctl's."""
    script = work / "show.sh"
    script.write_text('echo "devices=$TAOGPUD_DEVICES cuda=[$CUDA_VISIBLE_DEVICES] dir=$PWD"\n'
                      "exit 3\n")  # fmt: skip
    done = subprocess.run(
        [*ctl_command(daemon.socket_path), "exec", "--", "sh", str(script)],
        cwd=work,
        env=ctl_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    with daemon.client() as client:
        (job,) = [j for j in client.list_jobs() if j["params"].get("cwd") == str(work)]
    assert job["device"] in ("cpu:0", "cpu:1")  # either: the shared daemon's devices are free
    assert done.stdout.strip() == f"devices={job['device']} cuda=[] dir={work}"
    assert "the program exited with status 3" in done.stderr
    assert (job["task"], job["status"]) == ("program", "failed")
    assert job["result"] == {"exit_code": 3, "signal": None}
    assert job["error"]["code"] == "program_failed"
    assert job["params"]["argv"] == ["sh", str(script)] and job["params"]["cwd"] == str(work)
    assert job["program"]["env"]["OMP_NUM_THREADS"] == "1"
    assert job["program"]["pid"] is not None and job["program"]["client_pid"] is not None


def test_a_program_takes_its_whole_device_unless_it_shares(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """A program on device 0 keeps tasks off it until it ends (device 1 stays free); with
    --share it takes one of the two slots and a task runs beside it."""
    whole = Exec(daemon, work / "whole", "--device", "0")
    execs.append(whole)
    env = whole.wait_started()
    assert env["TAOGPUD_DEVICES"] == "cpu:0" and env["cwd"] == str(work / "whole")
    with daemon.client() as client:
        held = client.submit("noop", device=0)
        assert client.get(held["id"])["status"] == "queued"
        assert client.run("noop", device=1, wait_s=60)["status"] == "succeeded"
        assert whole.release()[0] == 0
        assert client.wait(held["id"], timeout_s=60)["status"] == "succeeded"
        shared = Exec(daemon, work / "shared", "--device", "0", "--share", "--mem", "1M")
        execs.append(shared)
        shared_id = shared.wait_started()["TAOGPUD_JOB_ID"]
        beside = client.run("noop", device=0, wait_s=60)
        assert beside["status"] == "succeeded" and beside["device"] == "cpu:0"
        assert shared.release()[0] == 0
        record = client.get(shared_id)
        assert record["program"]["share"] and record["program"]["reserved_bytes"] == [1 << 20]


def test_a_gang_waits_for_all_its_devices_holding_none(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """--gpus 2 while device 0 is held: queued (taogpuctl says where), and device 1 stays
    free for others meanwhile; once device 0 is back it gets both."""
    first = Exec(daemon, work / "first", "--device", "0")
    execs.append(first)
    first.wait_started()
    gang = Exec(daemon, work / "gang", "--gpus", "2")
    execs.append(gang)
    with daemon.client() as client:
        wait_until(lambda: bool(client.list_jobs(status="queued")), "queued", 60)
        queued = client.list_jobs(status="queued")[0]
        assert client.lease(queued["id"])["queue_position"] == 1
        assert client.run("noop", device=1, wait_s=60)["status"] == "succeeded"
    assert first.release()[0] == 0
    env = gang.wait_started()
    assert env["TAOGPUD_DEVICES"] == "cpu:0,cpu:1" and env["OMP_NUM_THREADS"] == "2"
    code, _, err = gang.release()
    assert code == 0 and "queued, position 1 in the queue" in err


def test_priority_orders_waiting_programs(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """With both devices held, a later program of higher priority waits ahead of an earlier
    one; a program asking for more devices than the host has is refused at once."""
    holder = Exec(daemon, work / "holder", "--gpus", "2")
    execs.append(holder)
    holder.wait_started()
    with daemon.client() as client:
        low = client.submit_program(["true"], priority=0)
        high = client.submit_program(["true"], priority=5)
        try:
            assert client.lease(high["id"])["queue_position"] == 1
            assert client.lease(low["id"])["queue_position"] == 2
        finally:  # while queued: granted once the holder ends, they would hold the devices
            for waiting in (low, high):
                client.cancel(waiting["id"])
    too_many = daemon.ctl("exec", "--gpus", "3", "--", "true")
    assert too_many.returncode == 2
    assert "needs 3 devices at once; this host has 2" in too_many.stderr


def test_cancel_stops_the_program_and_the_job_ends_cancelled(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """taogpuctl cancel ID: its starter sends SIGTERM; the program's status is taogpuctl's."""
    run = Exec(daemon, work / "run", status=0)
    execs.append(run)
    env = run.wait_started()
    cancelled = daemon.ctl("cancel", env["TAOGPUD_JOB_ID"])
    assert cancelled.returncode == 0, cancelled.stderr
    code, _, err = run.finish()
    assert code == 128 + signal.SIGTERM
    with daemon.client() as client:
        job = client.get(env["TAOGPUD_JOB_ID"])
    assert job["status"] == "cancelled" and job["result"]["signal"] == "SIGTERM"
    assert f"job {job['id']} cancelled" in err


def test_ctrl_c_reaches_the_program_and_cancels_the_job(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """SIGINT to taogpuctl's process group (what a terminal's Ctrl-C does) is forwarded to
    the program (a KeyboardInterrupt in Python); the job ends cancelled."""
    run = Exec(daemon, work / "run")
    execs.append(run)
    env = run.wait_started()
    os.killpg(run.proc.pid, signal.SIGINT)
    code, _, err = run.finish()
    assert code == 128 + signal.SIGINT  # Python ends itself by SIGINT after KeyboardInterrupt
    assert "KeyboardInterrupt" in err
    with daemon.client() as client:
        job = client.get(env["TAOGPUD_JOB_ID"])
    assert job["status"] == "cancelled" and job["result"]["signal"] == "SIGINT"


def test_a_timeout_stops_the_program(daemon: RunningDaemon, work: Path, execs: list[Exec]) -> None:
    run = Exec(daemon, work / "run", "--timeout", "0.5")
    execs.append(run)
    code, _, err = run.finish()  # it never gets `release`
    assert code == 128 + signal.SIGTERM
    assert "timed_out" in err and "ran past its timeout of 0.5 s" in err


def test_a_starter_killed_while_queued_takes_its_job_along(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """kill -9 of taogpuctl while its program waits: the job ends cancelled (client_gone)
    and the program is never started."""
    holder = Exec(daemon, work / "holder", "--gpus", "2")
    execs.append(holder)
    holder.wait_started()
    waiting = Exec(daemon, work / "waiting")
    execs.append(waiting)
    with daemon.client() as client:
        wait_until(lambda: bool(client.list_jobs(status="queued")), "queued", 60)
        job_id = client.list_jobs(status="queued")[0]["id"]
        waiting.proc.kill()
        job = client.wait(job_id, timeout_s=60)
    assert job["status"] == "cancelled" and job["error"]["code"] == "client_gone"
    assert holder.release()[0] == 0
    assert not (work / "waiting" / "started").exists()


def test_a_starter_killed_mid_program_leaves_it_running_under_its_lease(
    daemon: RunningDaemon, work: Path, execs: list[Exec]
) -> None:
    """kill -9 of taogpuctl while its program runs: the program runs on and its device stays
    held; once the program ends, the lease is released and the job ends, status unknown."""
    run = Exec(daemon, work / "run", "--device", "0")
    execs.append(run)
    env = run.wait_started()
    run.proc.kill()
    run.proc.wait()  # its pipes stay open: the program holds them
    assert leases.read_process(env["pid"]) is not None  # the program outlived its starter
    with daemon.client() as client:
        held = client.submit("noop", device=0)
        assert client.get(held["id"])["status"] == "queued"
        (run.folder / "release").touch()
        job = client.wait(env["TAOGPUD_JOB_ID"], timeout_s=60)
        assert (
            job["status"] == "interrupted" and "exit status is unknown" in job["error"]["message"]
        )
        assert client.wait(held["id"], timeout_s=60)["status"] == "succeeded"


def test_the_ray_executor_refuses_programs(tmp_path: Path) -> None:
    """Under executor "ray" a program is refused at submit, saying why and what to do (the
    real scheduler and store over the state machine's fake pool)."""
    incarnation = Incarnation(tmp_path / "jobs.sqlite3")
    incarnation.pool.executor = "ray"
    request = ProgramRequest(["true"], "/")
    caller = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    try:
        with pytest.raises(UnsupportedExecutor) as refused:
            incarnation.call(incarnation.scheduler.submit_program, request, caller)
    finally:
        incarnation.end()
    assert "local executor only; this daemon runs executor 'ray'" in refused.value.message
    assert refused.value.http_status == 422 and "docs/programs.md" in refused.value.hint


def test_a_daemon_killed_mid_program_adopts_its_lease_after_the_restart(
    daemon_factory: Callable[..., RunningDaemon], work: Path, execs: list[Exec]
) -> None:
    """kill -9 of the daemon while two programs run: both run on. One ends while the daemon
    is down: its starter reports the status once it is back. The other is adopted (pid and
    start time): its device stays held (a task for it waits) until it ends, succeeded."""
    daemon = daemon_factory()
    kept = Exec(daemon, work / "kept", "--device", "0")
    ended = Exec(daemon, work / "ended", "--device", "1", status=4)
    execs.extend([kept, ended])
    kept_id = kept.wait_started()["TAOGPUD_JOB_ID"]
    ended_id = ended.wait_started()["TAOGPUD_JOB_ID"]
    daemon.kill()
    (ended.folder / "release").touch()  # it ends while the daemon is down (or restarting)
    again = daemon.restart()
    try:
        assert ended.finish()[0] == 4  # its starter waited for the daemon to report it
        with again.client() as client:
            assert client.wait(ended_id, timeout_s=60)["result"]["exit_code"] == 4
            assert client.get(kept_id)["status"] == "running"
            waiting = client.submit("noop", device=0)
            assert client.get(waiting["id"])["status"] == "queued"
            assert kept.release()[0] == 0
            assert client.wait(kept_id, timeout_s=60)["status"] == "succeeded"
            assert client.wait(waiting["id"], timeout_s=60)["status"] == "succeeded"
        adopted = [e["job_id"] for e in again.events("program.adopted")]
        assert adopted.count(kept_id) == 1
    finally:
        again.stop()


def test_a_detached_program_logs_to_the_daemon_and_wait_returns_its_status(
    daemon: RunningDaemon, work: Path
) -> None:
    """--detach prints the id at once; the supervisor runs the program, its stdout and
    stderr go to the daemon as its log (logs ID, -f to its end), and wait ID exits with
    the program's status."""
    script = work / "talk.sh"
    script.write_text(
        'echo "out $TAOGPUD_DEVICES"; echo err >&2; touch started\n'
        "while [ ! -e release ]; do sleep 0.02; done; echo bye; exit 5\n"
    )
    detached = subprocess.run(
        [*ctl_command(daemon.socket_path), "exec", "--detach", "--", "sh", str(script)],
        cwd=work, env=ctl_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert detached.returncode == 0, detached.stderr
    job_id = detached.stdout.strip()
    try:
        wait_until((work / "started").exists, "the detached program started", 60)
        out = _its_first_lines(daemon, job_id)
    finally:  # the program loops until released: a failed check must not leave it running
        (work / "release").touch()
    waited = daemon.ctl("wait", job_id)
    assert waited.returncode == 5, waited.stderr
    assert daemon.ctl("logs", job_id, "-f").stdout.splitlines() == [out, "err", "bye"]
    with daemon.client() as client:
        job = client.get(job_id)
    assert job["status"] == "failed" and job["program"]["log_bytes"] == len(f"{out}\nerr\nbye\n")


def _its_first_lines(daemon: RunningDaemon, job_id: str) -> str:
    """The detached talk.sh's log before its release: its lease's device, then stderr's
    line; the first line, which names the device, is returned."""

    def logged() -> str:
        return daemon.ctl("logs", job_id).stdout

    wait_until(lambda: "err" in logged(), "its output in the log", 60)
    with daemon.client() as client:
        out = f"out {client.get(job_id)['device']}"  # its lease's device: either, both free
    assert out in ("out cpu:0", "out cpu:1")
    assert logged().splitlines() == [out, "err"]
    return out


def test_a_detached_programs_log_is_bounded_and_cancel_stops_it(
    daemon: RunningDaemon, work: Path
) -> None:
    """Past scheduling.program_log_kb the log says it was cut; cancel ID sends SIGTERM."""
    script = work / "flood.sh"
    script.write_text("head -c 5000 /dev/zero | tr '\\0' x; echo; exec sleep 600\n")
    detached = daemon.ctl("exec", "--detach", "--", "sh", str(script))
    assert detached.returncode == 0, detached.stderr
    job_id = detached.stdout.strip()
    with daemon.client() as client:
        wait_until(lambda: client.get(job_id)["program"]["log_dropped_bytes"] > 0, "log cut", 60)
        log = daemon.ctl("logs", job_id).stdout
        assert log.startswith("x" * 1024) and "reached its bound of 1024 bytes" in log
        assert daemon.ctl("cancel", job_id).returncode == 0
        job = client.wait(job_id, timeout_s=60)
    assert job["status"] == "cancelled" and job["result"]["signal"] == "SIGTERM"


def test_a_program_over_at_once_costs_two_requests_and_its_pid_is_checked(
    daemon: RunningDaemon,
) -> None:
    """A program that ends before `report_within_s` costs its starter two requests: the
    submit, and its exit, which carries its pid (a zombie until the daemon has checked it
    as /started would and noted its start time); no /started, and no lease long-poll on a
    connection of its own (it ends before `follow_after_s`). With 8 submitters of short
    programs, those were a third and a quarter of the daemon's requests."""
    daemon = daemon.trace_from_now()  # debug: api.request lines, this test's from here
    with daemon.client() as client:
        run = ProgramRun(client, ["true"], follow_after_s=600.0, report_within_s=600.0)
        outcome = run.run()
    assert outcome.job["status"] == "succeeded" and outcome.exit_status == 0
    assert run.process is not None and outcome.job["program"]["pid"] == run.process.pid
    assert outcome.job["program"]["pid_start"] is not None

    def program_requests() -> list[str]:  # its submit, and every one naming its job
        paths = [line["path"] for line in daemon.events("api.request")]
        mine = f"/v1/programs/{outcome.job['id']}/"
        return [path for path in paths if path == "/v1/programs" or path.startswith(mine)]

    wait_until(lambda: len(program_requests()) >= 2, "the exit's request line", 30)
    requests = program_requests()
    assert len(requests) == 2 and requests[1].endswith("/exited"), requests


def test_an_exit_reported_with_its_pid_keeps_the_exit_status(daemon: RunningDaemon) -> None:
    """A program killed by a signal, or failing, within the window: the one report carries
    its status as the zombie left it (waitid WNOWAIT), as a reaped one's would."""
    with daemon.client() as client:
        killed = ProgramRun(client, ["sh", "-c", "kill -9 $$"], report_within_s=600.0).run()
        failed = ProgramRun(client, ["sh", "-c", "exit 3"], report_within_s=600.0).run()
    by_signal = {"exit_code": None, "signal": "SIGKILL"}
    assert (killed.exit_status, killed.job["result"]) == (137, by_signal)
    assert (failed.exit_status, failed.job["result"]) == (3, {"exit_code": 3, "signal": None})
    assert killed.job["program"]["pid"] and failed.job["program"]["pid"]


# A starter that follows its lease only after 600 s, of a program that leaves a child behind
# at once: the orphan it reaps is what a cancel must still reach.
REPO = Path(__file__).resolve().parent.parent
ORPHAN_STARTER = """
import sys
from taogpud.client import Client
from taogpud.client.program import ProgramRun
argv = ["sh", "-c", "sleep 600 & echo $! > orphan.pid; exit 0"]
with Client(sys.argv[1]) as client:
    run = ProgramRun(client, argv, reap_descendants=True, follow_after_s=600.0)
    print(run.run().job["status"])
"""


def test_a_cancel_reaches_what_a_program_over_at_once_left_running(
    daemon: RunningDaemon, work: Path
) -> None:
    """Its program has ended, its child runs on (the starter reaps it): the lease is followed
    from then, so a cancel stops the child and the job ends cancelled."""
    starter = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_STARTER, str(daemon.socket_path)],
        cwd=work, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        with daemon.client() as client:
            wait_until(lambda: client.list_jobs("running"), "the program's lease", 60)
            (job,) = client.list_jobs("running")
            pid_file = work / "orphan.pid"
            wait_until(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"), "it", 60)
            orphan = int(pid_file.read_text())
            client.cancel(job["id"])
            out, _ = starter.communicate(timeout=60)
            assert out.strip() == "cancelled" and client.get(job["id"])["status"] == "cancelled"
        assert leases.read_process(orphan) is None  # stopped with its group, and reaped
    finally:
        starter.kill()
        starter.communicate()
        if (work / "orphan.pid").exists():  # a failed test leaves no sleep behind
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int((work / "orphan.pid").read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/programs", b'{"argv": [], "cwd": "/"}', "body.argv"),
        ("/v1/programs", b'{"argv": ["true"], "cwd": "/", "gpus": "two"}', "body.gpus"),
        ("/v1/programs/JOB/started", b'{"pid": 1}', "body.pid"),
        ("/v1/programs/JOB/exited", b'{"exit_code": 0, "pid": "x"}', "body.pid"),
        ("/v1/programs/JOB/exited", b'{"exit_code": 0, "colour": "red"}', "body.colour"),
    ],
)
def test_a_bad_program_body_is_refused_in_the_one_error_shape(
    daemon: RunningDaemon, path: str, body: bytes, where: str
) -> None:
    """The program routes validate their own bodies (api/direct.py): still 422 in the one
    error shape, naming where in the body it was wrong; a body that is not JSON, 400."""
    with daemon.client() as client:
        job = client.submit_program(["true"], cwd="/")
        try:
            status, answer = raw_request(daemon, "POST", path.replace("JOB", job["id"]), body)
            assert (status, set(answer), answer["code"]) == (
                422,
                {"code", "message", "hint"},
                "invalid_request",
            )
            assert where in answer["message"], answer
            status, answer = raw_request(
                daemon, "POST", path.replace("JOB", job["id"]), body, {"content-type": "text/plain"}
            )
            assert status in (400, 422) and set(answer) == {"code", "message", "hint"}, answer
            assert "application/json" in answer["message"], answer
        finally:  # its lease, granted to this process, revoked, and its starter's word given
            client.cancel(job["id"])
            client.program_exited(job["id"], exit_code=None, not_started="started nothing")
