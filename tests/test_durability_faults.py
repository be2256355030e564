"""Nothing lost, proven with real faults on a real daemon: kill -9 with a retryable job
running, a job outliving the drain, a second daemon on the same state directory, a damaged
store, a full disk, a dead stdout pipe, a config written in two steps, relative paths.

A scenario several tests read (a kill -9 and its restart, a drain, a damaged store) runs
once, in a module-scoped fixture; each test asserts its own part of it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import fill, mounted_tmpfs

from taogpud.client import ApiError
from taogpud.daemon.state_lock import LOCK_NAME, lock_state_dir
from taogpud.errors import StateDirNotOurs
from taogpud.jobs.store import JobStore
from taogpud.testing import (
    CPU_CONFIG,
    RunningDaemon,
    cpu_pair,
    ctl_command,
    ctl_env,
    daemon_command,
    deep_merge,
    start_daemon,
    to_toml,
    wait_for_ready,
    wait_until,
    write_pair,
)

NOBODY = pwd.getpwnam("nobody")
ONE_SLOT: dict[str, Any] = {
    "runtime": {"cpu_devices": 1},
    "backend": {"cuda": {"stream_count": 1}},
}


def job_events(daemon: RunningDaemon, event: str, job_id: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events(event) if e.get("job_id") == job_id]


class KilledRetryable(NamedTuple):
    """One slot, a max_retries=1 job running at kill -9, then a restart until it ended."""

    again: RunningDaemon  # the restart (stopped): its trace
    job_id: str
    finished: dict[str, Any]  # the job as the restart's wait answered it
    status: dict[str, Any]  # the restart's status once the job ended


@pytest.fixture(scope="module")
def killed_retryable(module_daemon_factory: Callable[..., RunningDaemon]) -> KilledRetryable:
    """The scenario two tests read: one slot, a 1.5 s job with max_retries=1, kill -9 once it
    runs, a restart, the job waited for."""
    daemon = module_daemon_factory(config=ONE_SLOT)
    try:
        with daemon.client() as client:
            job = client.submit("sleep", {"ms": 1500}, max_retries=1)
        daemon.wait_running(job["id"])
    finally:
        daemon.stop(signal.SIGKILL)
    again = daemon.restart()
    try:
        with again.client() as client:
            finished = client.wait(job["id"], timeout_s=30)
            status = client.status()
    finally:
        again.stop()
    return KilledRetryable(again, job["id"], finished, status)


@pytest.mark.xdist_group("killed_retryable")  # one worker, so the scenario runs once
def test_job_with_retries_runs_again_after_a_restart(killed_retryable: KilledRetryable) -> None:
    """A job running at kill -9 that allows retries runs again and succeeds; attempts=1."""
    assert killed_retryable.finished["status"] == "succeeded"
    assert killed_retryable.finished["attempts"] == 1


@pytest.mark.xdist_group("killed_retryable")
def test_kill_9_with_a_retryable_job_queues_it_once_and_runs_it_once(
    killed_retryable: KilledRetryable,
) -> None:
    """One slot, a max_retries=1 job running at kill -9: the restart comes up (once), the job
    runs once more and succeeds, with one job.running and one job.succeeded for its id."""
    again, job_id, finished, status = killed_retryable
    assert finished["status"] == "succeeded"
    assert finished["attempts"] == 1
    assert len(job_events(again, "job.running", job_id)) == 1
    assert len(job_events(again, "job.succeeded", job_id)) == 1
    assert again.events("store.recovered")[0]["queued"] == 1
    assert status["queued"] == 0


class OutlivedDrain(NamedTuple):
    """A daemon stopped by SIGTERM (drain_timeout_s 1) while two 3 s jobs ran, one without
    retries (`lone`) and one with max_retries=1 (`retryable`), then started again."""

    first: RunningDaemon  # the run that drained (stopped): its trace
    lone_id: str
    retryable_id: str
    lone_after: dict[str, Any]  # `lone` as the restart shows it
    retryable_done: dict[str, Any]  # `retryable` as the restart's wait answered it
    ctl_wait: subprocess.CompletedProcess[str]  # `taogpuctl wait retryable --json`, from
    # before the stop until it exited


@pytest.fixture(scope="module")
def outlived_drain(
    module_daemon_factory: Callable[..., RunningDaemon],
) -> Iterator[OutlivedDrain]:
    """The scenario three tests read (level debug, for job.finish_dropped): both jobs
    running, `taogpuctl wait` started on the retryable one, SIGTERM, a restart, the retryable
    one waited for."""
    daemon = module_daemon_factory(
        settings={"logging": {"level": "debug"}}, config={"scheduling": {"drain_timeout_s": 1}}
    )
    try:
        with daemon.client() as client:
            lone = client.submit("sleep", {"ms": 3000})
            retryable = client.submit("sleep", {"ms": 3000}, max_retries=1)
        daemon.wait_running(lone["id"])
        daemon.wait_running(retryable["id"])
    except BaseException:
        daemon.kill()
        raise
    command = [*ctl_command(daemon.socket_path), "wait", retryable["id"], "--json"]
    waiting = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ctl_env()
    )
    try:
        daemon.stop(signal.SIGTERM)
        again = daemon.restart()
        try:
            out, err = waiting.communicate(timeout=120)
            with again.client() as client:
                done = client.wait(retryable["id"], timeout_s=60)
                lone_after = client.get(lone["id"])
        finally:
            again.stop()
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    ctl_wait = subprocess.CompletedProcess(command, waiting.returncode, out, err)
    yield OutlivedDrain(daemon, lone["id"], retryable["id"], lone_after, done, ctl_wait)


@pytest.mark.xdist_group("outlived_drain")  # one worker, so the scenario runs once
def test_a_job_outliving_the_drain_stays_interrupted(outlived_drain: OutlivedDrain) -> None:
    """drain_timeout_s 1 and a 3 s job: it is interrupted at the deadline, and its worker's
    late finish (at 3 s, while the workers stop) is dropped: after a restart it is still
    interrupted, and no job.succeeded was ever written for it."""
    daemon, job_id = outlived_drain.first, outlived_drain.lone_id
    assert job_events(daemon, "job.interrupted", job_id)
    assert not job_events(daemon, "job.succeeded", job_id)
    dropped = job_events(daemon, "job.finish_dropped", job_id)
    assert [d["reported"] for d in dropped] == ["succeeded"]
    assert outlived_drain.lone_after["status"] == "interrupted"


@pytest.mark.xdist_group("outlived_drain")
def test_a_retryable_job_outliving_the_drain_runs_again_after_the_restart(
    outlived_drain: OutlivedDrain,
) -> None:
    """drain_timeout_s 1 and a 3 s job that allows one retry (a restart or an upgrade, not
    the job's fault): queued again with its attempt counted, never interrupted; the next
    start runs it to success, and its first attempt's late finish is dropped."""
    daemon, job_id = outlived_drain.first, outlived_drain.retryable_id
    done = outlived_drain.retryable_done
    assert job_events(daemon, "job.retry", job_id)
    assert not job_events(daemon, "job.interrupted", job_id)
    assert not job_events(daemon, "job.succeeded", job_id)
    assert (done["status"], done["attempts"]) == ("succeeded", 1), done


@pytest.mark.xdist_group("outlived_drain")
def test_taogpuctl_wait_rides_through_a_restart(outlived_drain: OutlivedDrain) -> None:
    """`taogpuctl wait` on a job queued again at the drain deadline: the daemon stops (its
    socket file goes) and starts again; the wait reconnects and exits 0 with the job's
    success, instead of exit 3 the moment the socket was gone."""
    waited = outlived_drain.ctl_wait
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["status"] == "succeeded"


# -- one daemon per state directory ------------------------------------------------------


def test_a_second_daemon_on_the_same_state_dir_exits_75_naming_the_holder(
    daemon: RunningDaemon,
) -> None:
    """Another socket, the same state dir: exit 75 (may pass later; systemd does not loop on
    it) at once, one line with the holder's pid and socket; the live store is not moved
    aside and its kept outputs stay."""
    with daemon.client() as client:
        kept = client.run("vector_add", {"size": 1000}, keep_outputs=True)
    started = time.monotonic()
    second = subprocess.run(
        daemon_command(daemon.home, "other.sock"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    took_s = time.monotonic() - started
    assert second.returncode == 75, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert f"pid {daemon.proc.pid}" in lines[0]
    assert str(daemon.socket_path) in lines[0]
    assert took_s < 10
    assert not list(daemon.state_dir.glob("*damaged*"))
    assert not (daemon.home / "other.sock").exists()
    with daemon.client() as client:
        assert client.download_output(kept["id"], "c")
        assert client.run("noop")["status"] == "succeeded"


@pytest.mark.slow
def test_a_busy_store_is_an_error_never_damage(tmp_path: Path) -> None:
    """'database is locked' (another process holds the file) raises; nothing is moved aside."""
    path = tmp_path / "jobs.sqlite3"
    JobStore(path).close()
    holder = sqlite3.connect(path)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            JobStore(path)
    finally:
        holder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.sqlite3"]


class DamagedStore(NamedTuple):
    """A daemon that kept an output, stopped; its store overwritten with text; started again."""

    again: RunningDaemon  # the start on the damaged store (stopped): its trace
    state_dir: Path
    kept_id: str  # the job whose output was kept before the damage
    ran: dict[str, Any]  # a job the fresh store ran


@pytest.fixture(scope="module")
def damaged_store(module_daemon_factory: Callable[..., RunningDaemon]) -> DamagedStore:
    """The scenario two tests read."""
    daemon = module_daemon_factory()
    try:
        with daemon.client() as client:
            kept = client.run("vector_add", {"size": 1000}, keep_outputs=True)
    finally:
        daemon.stop()
    (daemon.state_dir / "jobs.sqlite3").write_bytes(b"this is not a database" * 100)
    again = daemon.restart()
    try:
        again.wait_for_event(lambda e: e.get("event") == "daemon.ready")
        with again.client() as client:
            ran = client.run("noop")
    finally:
        again.stop()
    return DamagedStore(again, daemon.state_dir, kept["id"], ran)


@pytest.mark.xdist_group("damaged_store")  # one worker, so the scenario runs once
def test_damaged_store_is_moved_aside(damaged_store: DamagedStore) -> None:
    """A store that is not SQLite is kept aside, a fresh one starts, and the log says where."""
    assert damaged_store.ran["status"] == "succeeded"
    damaged = damaged_store.again.events("store.damaged")[0]
    assert Path(damaged["moved_to"]).read_bytes().startswith(b"this is not a database")
    assert "fresh store" in damaged["hint"]


@pytest.mark.xdist_group("damaged_store")
def test_outputs_are_not_pruned_against_a_fresh_store(damaged_store: DamagedStore) -> None:
    """A damaged store is moved aside and a fresh one started: the kept outputs it cannot
    account for stay on disk (housekeeping runs at start)."""
    assert damaged_store.again.events("store.damaged")
    assert (damaged_store.state_dir / "outputs" / damaged_store.kept_id / "c.npy").exists()


# -- a failed start ----------------------------------------------------------------------


def test_a_failed_start_says_why_in_status(daemon_home: Path) -> None:
    """A config error exits 2 (never restarted) and sends STATUS=failed to start: <the line>,
    the same line as on stderr."""
    home = daemon_home / "bad"
    home.mkdir()
    (home / "config.toml").write_text("[scheduling]\nmax_concurent_tasks = 3\n")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(home / "notify"))
    listener.settimeout(30)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "taogpud", "--config", str(home / "config.toml"),
             "--socket", str(home / "s.sock"), "--state-dir", str(home / "state")],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "NOTIFY_SOCKET": str(home / "notify")},
        )  # fmt: skip
        datagram = listener.recv(4096).decode()
    finally:
        listener.close()
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert "max_concurent_tasks" in line
    assert datagram.startswith("STATUS=failed to start: config error:")
    assert "max_concurent_tasks" in datagram


def test_the_unit_never_restarts_a_failed_start_nor_limits_a_persons_restarts() -> None:
    """Every exit of a failed start (2 config, 4 another user's state, 6 a backend this host
    can never run, 75 may pass later) is in RestartPreventExitStatus=, so no failed start is
    retried in a loop; the start limit leaves room for a person's ten restarts in a minute,
    and the starts before them."""
    unit = Path(__file__).parent.parent / "systemd" / "taogpud.service"
    keys: dict[str, list[str]] = {}
    for raw in unit.read_text().splitlines():
        if "=" in raw and not raw.startswith("#"):
            key, _, value = raw.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    from taogpud.daemon import lifecycle

    codes = {lifecycle.EXIT_CONFIG, lifecycle.EXIT_NO_PERMISSION}
    codes |= {lifecycle.EXIT_HOST_CANNOT_RUN, lifecycle.EXIT_MAY_PASS_LATER}
    assert {str(code) for code in codes} == set(keys["RestartPreventExitStatus"][0].split())
    assert float(keys["StartLimitIntervalSec"][0]) <= 60
    assert int(keys["StartLimitBurst"][0]) >= 2 + 10


# -- a state directory that is another user's ---------------------------------------------


@pytest.fixture
def nobody_state(tmp_path: Path) -> Iterator[Path]:
    """A state directory of user nobody's, in a folder nobody may pass through."""
    if os.geteuid() != 0:
        pytest.skip("making a directory another user's needs root")
    base = Path(tempfile.mkdtemp(prefix="taogpud-owner-", dir="/tmp"))
    base.chmod(0o711)
    state = base / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield state
    finally:
        shutil.rmtree(base)


@pytest.mark.process
def test_root_refuses_a_state_dir_another_user_owns(nobody_state: Path, tmp_path: Path) -> None:
    """A daemon run as root on the service user's state directory exits 4 (never retried)
    naming the owner, and leaves nothing of root's there: no lock, no store."""
    home = tmp_path / "home"
    write_pair(home, *cpu_pair())
    command = daemon_command(home)
    command[command.index("--state-dir") + 1] = str(nobody_state)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{nobody_state} belongs to user nobody" in lines[0]
    assert "--state-dir" in lines[0]
    assert list(nobody_state.iterdir()) == []


def test_a_lock_root_left_is_named_with_its_owner_and_the_fix(nobody_state: Path) -> None:
    """The service's user meets root's 0600 lock in its own state directory: the refusal
    names the file, its owner and the exact chown, instead of a bare Permission denied."""
    lock = nobody_state / LOCK_NAME
    lock.write_text("")
    lock.chmod(0o600)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, user nobody
        os.close(read_end)
        os.setgroups([])
        os.setresgid(NOBODY.pw_gid, NOBODY.pw_gid, NOBODY.pw_gid)
        os.setresuid(NOBODY.pw_uid, NOBODY.pw_uid, NOBODY.pw_uid)
        try:
            lock_state_dir(nobody_state, None)
            said = "locked"
        except StateDirNotOurs as exc:
            said = str(exc)
        os.write(write_end, said.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    assert said == (
        f"{lock} cannot be opened by user nobody: it belongs to user root (a run as that "
        f"user left it): `sudo chown -R nobody: {nobody_state}`"
    )


# -- relative paths ----------------------------------------------------------------------


def test_relative_paths_are_resolved_at_start(daemon_home: Path) -> None:
    """--settings/--config/--socket/--state-dir given relative: the daemon reports absolute
    paths, and doctor run from another directory finds the same files."""
    home = daemon_home / "rel"
    write_pair(home, *cpu_pair())
    command = [
        sys.executable, "-m", "taogpud", "--settings", "settings.json", "--config",
        "config.toml", "--socket", "taogpud.sock", "--state-dir", "state",
    ]  # fmt: skip
    (home / "logs").mkdir(exist_ok=True)
    with (home / "logs" / "rel.log").open("wb") as out:
        proc = subprocess.Popen(command, cwd=home, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_ready(RunningDaemon(proc, home, run=9), 60)
        doctor = subprocess.run(
            [sys.executable, "-m", "taogpud.cli", "--socket", str(home / "taogpud.sock"),
             "doctor", "--json"],
            capture_output=True, text=True, timeout=120, check=False, cwd="/",
        )  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["config_files"]["status"] == "pass", checks["config_files"]


# -- a full disk -------------------------------------------------------------------------


@pytest.fixture
def small_state_dir(daemon_home: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs the test mounts (CI runs as root; skipped with the reason elsewhere)."""
    with mounted_tmpfs(daemon_home / "small", 4) as mount:
        yield mount


def test_a_full_disk_refuses_submits_and_loses_no_accepted_job(
    daemon_home: Path, small_state_dir: Path
) -> None:
    """The state dir fills: submits answer 507 state_disk_full (never 500), naming the state
    dir and the space left; reads still work; once space returns, submits are taken again
    and the records kept pending are written. After a restart every job answered 201 is
    found, finished."""
    home = daemon_home / "full"
    home.mkdir()
    (home / "state").symlink_to(small_state_dir)
    daemon = start_daemon(home, None, None)
    accepted: list[str] = []
    refused: list[dict[str, Any]] = []
    try:
        with daemon.client() as client:
            accepted += [client.submit("noop")["id"] for _ in range(5)]
            filler = fill(small_state_dir)
            for _ in range(3000):  # the WAL takes a few pages before the disk says no
                try:
                    accepted.append(client.submit("noop")["id"])
                except ApiError as exc:
                    assert exc.http_status == 507, exc
                    refused.append({"code": exc.code, "message": exc.message})
                    if len(refused) >= 20:
                        break
            assert client.get(accepted[0])["id"] == accepted[0]  # reads are served
            # A withdrawn job leaves the queue at once; an accepted one may wait a moment for
            # the slot of a withdrawn job whose worker is being told to stop.
            wait_until(
                lambda: client.status()["queued"] == 0, "the queue empty while the disk is full"
            )
            assert client.status()["jobs_total"] == len(accepted)  # the refused are not counted
            filler.unlink()
            wait_until(  # the store's retry (every WRITE_RETRY_S) writes what is pending
                lambda: client.status()["store_write_failure"] is None,
                "the pending records written once there is space",
            )
            accepted += [client.submit("noop")["id"] for _ in range(5)]
            for job_id in accepted:
                client.wait(job_id, timeout_s=30)
    finally:
        daemon.stop()
    assert len(refused) == 20
    assert {r["code"] for r in refused} == {"state_disk_full"}
    assert str(home / "state") in refused[0]["message"]
    assert "bytes are free" in refused[0]["message"]
    assert daemon.events("store.write_failed")
    assert daemon.events("store.writable_again")
    again = daemon.restart()
    try:
        with again.client() as client:
            found = [client.get(job_id)["status"] for job_id in accepted]
    finally:
        again.stop()
    assert found == ["succeeded"] * len(accepted)


# -- a stdout that is dead or full -------------------------------------------------------


def launch_into_pipe(home: Path) -> tuple[subprocess.Popen[bytes], RunningDaemon]:
    """A daemon whose stdout is a pipe the test holds (as `taogpud | tee log`), ready."""
    write_pair(home, *cpu_pair())
    (home / "logs").mkdir()
    with (home / "logs" / "pipe-stderr.log").open("wb") as err:
        proc = subprocess.Popen(daemon_command(home), cwd=home, stdout=subprocess.PIPE, stderr=err)
    daemon = RunningDaemon(proc, home, run=8)
    wait_for_ready(daemon, 60)
    return proc, daemon


@pytest.mark.parametrize("pipe", ["dead", "full"])
def test_a_dead_or_full_stdout_never_keeps_sigterm_from_stopping_it(
    daemon_home: Path, pipe: str
) -> None:
    """stdout a pipe whose reader is gone (EPIPE) or never reads (full at 64 KiB): jobs still
    run, status counts the lost lines (dead), and SIGTERM stops the daemon, exit 0."""
    proc, daemon = launch_into_pipe(daemon_home / pipe)
    assert proc.stdout is not None
    try:
        if pipe == "dead":
            proc.stdout.close()
        with daemon.client(timeout_s=20) as client:
            for _ in range(100):  # far more than a pipe's 64 KiB of trace lines
                assert client.run("noop")["status"] == "succeeded"
            status = client.status()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert code == 0
    if pipe == "dead":
        assert status["log_write_failures"] > 0


# -- a config written in two steps -------------------------------------------------------


QUIET_S = 1.0  # the watched reload's quiet period in the two-step test


def test_a_config_written_in_two_steps_is_applied_whole(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """config.toml rewritten in place in two writes 0.25 s apart, the first of which parses
    (no [scheduling] table yet: the defaults 8 and 1000): only the whole file is applied."""
    scheduling = {"max_concurrent_tasks": 3, "queue_limit": 40}
    quiet = {"TAOGPUD_CONFIG__RELOAD__QUIET_S": str(QUIET_S)}  # 4× the writes' gap
    daemon = daemon_factory(config={"scheduling": scheduling}, env=quiet)
    whole = to_toml(
        deep_merge(CPU_CONFIG, {"scheduling": {**scheduling, "strategy": "least_loaded"}})
    )
    first, cut, rest = whole.partition("[scheduling]")
    with daemon.config_path.open("w") as out:
        out.write(first)
        out.flush()
        time.sleep(0.25)
        out.write(cut + rest)
    with daemon.client() as client:
        deadline = time.monotonic() + 20
        while client.config_status()["generation"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(QUIET_S + 1.5)  # a later reload (one quiet period after a change) too
        status = client.status()
        generation = client.config_status()["generation"]
    applied = [c for e in daemon.events("config.reloaded") for c in e["changes"]]
    assert generation == 2, applied
    assert {c["key"].split(": ")[1] for c in applied} == {"scheduling.strategy"}
    assert (status["max_concurrent_tasks"], status["queue_limit"]) == (3, 40)
