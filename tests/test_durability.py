"""Nothing lost: restarts (clean and kill -9), retries, outputs and inputs across restarts,
a full disk, other users, idle connections and hostile requests (a damaged store and a job
retried after kill -9: test_durability_faults)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from conftest import fill, mounted_tmpfs

from taogpud import wire
from taogpud.arrayfiles import images
from taogpud.client import Client
from taogpud.errors import StateDiskFull
from taogpud.jobs.records import JobRecord, JobState
from taogpud.jobs.store import JobStore, Tell
from taogpud.testing import RunningDaemon, start_daemon, wait_until

NOBODY = 65534


def terminal_states(client: Client, job_ids: list[str]) -> list[str]:
    return [client.wait(job_id, timeout_s=60)["status"] for job_id in job_ids]


@pytest.fixture(scope="module")
def module_daemon(module_daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    """conftest's (one daemon for the tests that act only on their own jobs, arrays and
    connections), with the per-uid connection cap raised past the thousand idle connections
    of one of them (all from one uid: tests/test_limits.py has the caps)."""
    return module_daemon_factory(config={"server": {"max_connections_per_uid": 1100}})


# Its tests run on one worker, so that it starts once.
SHARED = pytest.mark.xdist_group("durability_module_daemon")


# -- restarts --------------------------------------------------------------------------------


def test_kill_9_under_load_loses_no_accepted_job(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """kill -9 mid-load: after a restart every accepted job is accounted for, none twice;
    each job the first run's trace said succeeded is found succeeded and never runs again."""
    daemon = daemon_factory(config={"scheduling": {"max_concurrent_tasks": 2}})
    with daemon.client() as client:
        accepted = [client.submit("sleep", {"ms": 40})["id"] for _ in range(30)]
    daemon.wait_for_event(lambda e: e.get("event") == "job.succeeded")
    daemon.stop(signal.SIGKILL)
    said_succeeded = {e["job_id"] for e in daemon.events("job.succeeded")}
    again = daemon.restart()
    try:
        with again.client() as client:
            states = terminal_states(client, accepted)
    finally:
        again.stop()
    assert len(states) == 30
    assert set(states) <= {"succeeded", "interrupted"}
    assert states.count("interrupted") <= 2  # at most the jobs running at the kill
    assert states.count("succeeded") >= 28
    final = dict(zip(accepted, states, strict=True))
    assert said_succeeded and all(final[job_id] == "succeeded" for job_id in said_succeeded)
    ran_again = {e["job_id"] for e in again.events("job.running")}
    assert not ran_again & said_succeeded
    # The store held at least what the trace said: a commit may also hold ends whose lines
    # the kill cut off, never fewer.
    assert again.events("store.recovered")[0]["jobs"] <= 30 - len(said_succeeded)


ANSWERS = ("wait", "cancel", "compute")


class EndShown(NamedTuple):
    shown: dict[str, Any]  # the job as the answer before the kill showed it
    found: dict[str, Any]  # the job as the restart found it
    ran_again: list[dict[str, Any]]  # the restart's job.running lines for it


def answer_then_kill(daemon: RunningDaemon, answer: str) -> tuple[str, dict[str, Any]]:
    """Give `answer` on a job and kill -9 the daemon the moment it is given: (job id, shown)."""
    with daemon.client() as client:
        if answer == "wait":
            job = client.submit("sleep", {"ms": 300})
            shown = client.wait(job["id"], timeout_s=30)
        elif answer == "cancel":
            client.submit("sleep", {"ms": 5000})  # holds the one slot
            job = client.submit("sleep", {"ms": 1})
            shown = client.cancel(job["id"])
        else:
            a = np.arange(1000, dtype=np.float32)
            job = shown = client.compute("vector_add", a=a, b=a).job
        daemon.proc.send_signal(signal.SIGKILL)  # within a millisecond of the answer
    daemon.kill()
    return job["id"], dict(shown)


@pytest.fixture(scope="module")
def ends_shown(module_daemon_factory: Callable[..., RunningDaemon]) -> dict[str, EndShown]:
    """One slot; for each answer in turn: the answer, kill -9, a restart that reads the job
    (and then gives the next answer): four starts for the three kills."""
    daemon = module_daemon_factory(config={"scheduling": {"max_concurrent_tasks": 1}})
    ends: dict[str, EndShown] = {}
    try:
        for answer in ANSWERS:
            job_id, shown = answer_then_kill(daemon, answer)
            daemon = daemon.restart()
            with daemon.client() as client:
                found = client.get(job_id)
            # Read now, with the barrier of a live daemon: its recovery, which would run the
            # job again, came before its first answer.
            ran_again = [e for e in daemon.events("job.running") if e["job_id"] == job_id]
            ends[answer] = EndShown(shown, dict(found), ran_again)
    finally:
        daemon.stop()
    return ends


@pytest.mark.xdist_group("ends_shown")  # one worker, so the scenario runs once
@pytest.mark.parametrize("answer", ANSWERS)
def test_an_end_a_client_was_shown_is_what_a_restart_finds(
    ends_shown: dict[str, EndShown], answer: str
) -> None:
    """kill -9 the moment an answer shows a job's end (a wait's succeeded, a queued job's
    cancel, a compute's answer on the shared-memory socket): the restart finds it ended so,
    and a cancelled job never runs."""
    shown, found, ran_again = ends_shown[answer]
    assert shown["status"] == {"cancel": "cancelled"}.get(answer, "succeeded")
    assert found["status"] == shown["status"]
    assert not ran_again


@SHARED
def test_job_with_retries_survives_a_worker_crash(module_daemon: RunningDaemon) -> None:
    """kill -9 of the worker: a job with max_retries=1 runs again elsewhere and succeeds."""
    daemon = module_daemon
    with daemon.client() as client:
        job = client.submit("sleep", {"ms": 1500}, max_retries=1)
        ran = daemon.wait_running(job["id"])
        os.kill(ran["worker_pid"], signal.SIGKILL)
        finished = client.wait(job["id"], timeout_s=30)
    assert finished["status"] == "succeeded"
    assert finished["attempts"] == 1
    assert finished["worker_pid"] != ran["worker_pid"]


def test_outputs_and_queued_inputs_survive_a_restart(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """A kept output survives a restart; a queued job keeps its inputs; nothing else stays."""
    daemon = daemon_factory(config={"scheduling": {"max_concurrent_tasks": 1}})
    a, b = np.arange(1000, dtype=np.float32), np.ones(1000, dtype=np.float32)
    with daemon.client() as client:
        done = client.run("vector_add", {"size": 1000}, keep_outputs=True)
        client.submit("sleep", {"ms": 300})
        ids = {name: client.upload_array(array)["id"] for name, array in (("a", a), ("b", b))}
        queued = client.submit("vector_add", inputs=ids, keep_outputs=True)
        client.upload_array(a)  # used by no job: released at the clean stop
    daemon.stop(signal.SIGTERM)
    namespace = images.namespace_of(daemon.state_dir)
    assert len(list(images.SHM_DIR.glob(f"{images.PREFIX}{namespace}.*"))) == 2  # a and b, kept
    again = daemon.restart()
    try:
        with again.client() as client:
            kept = np.load(io.BytesIO(client.download_output(done["id"], "c")))
            ran = client.wait(queued["id"], timeout_s=30)
            c = np.load(io.BytesIO(client.download_output(queued["id"], "c")))
    finally:
        again.stop()
    assert kept.shape == (1000,)
    assert ran["status"] == "succeeded"
    np.testing.assert_array_equal(c, a + b)


def test_store_prunes_by_age_and_count(tmp_path: Path) -> None:
    """Finished jobs past the age limit or beyond the newest N are deleted; unfinished stay."""
    store = JobStore(tmp_path / "jobs.sqlite3", keep_finished=5, keep_finished_s=3600)
    now = time.time()
    for n in range(12):
        job = JobRecord(id=f"j{n:02d}", task="noop", params={}, created_at=now - 7200)
        job.status, job.finished_at = JobState.succeeded, now - (7200 if n < 3 else n)
        store.add(job)
    store.add(JobRecord(id="waiting", task="noop", params={}, created_at=now - 7200))
    assert store.prune(now) == 3 + 4
    store.close()
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        left = sorted(row[0] for row in db.execute("SELECT id FROM jobs"))
    assert left == ["j03", "j04", "j05", "j06", "j07", "waiting"]


def test_finish_callbacks_run_once_soon_after_and_can_be_forgotten(tmp_path: Path) -> None:
    """when_finished: called once, in a later step of the loop than the finish itself; a
    callback forgotten first is never called and leaves nothing behind."""

    async def scenario() -> tuple[list[str], list[str]]:
        store = JobStore(tmp_path / "jobs.sqlite3")
        calls: list[str] = []
        for job_id in ("kept", "forgotten"):
            store.add(JobRecord(id=job_id, task="noop", params={}))
        callbacks = {
            job_id: lambda job_id=job_id: calls.append(job_id) for job_id in ("kept", "forgotten")
        }
        assert all(store.when_finished(job_id, cb) for job_id, cb in callbacks.items())
        store.forget("forgotten", callbacks["forgotten"])
        for job_id in ("kept", "forgotten"):
            job = store.get(job_id)
            assert job is not None
            job.status = JobState.succeeded
            store.mark_finished(job)
        during_the_finish = list(calls)
        await asyncio.sleep(0)
        assert not store.when_finished("kept", callbacks["kept"])  # finished: no later call
        store.close()
        return during_the_finish, calls

    during_the_finish, calls = asyncio.run(scenario())
    assert during_the_finish == []
    assert calls == ["kept"]


# -- a full disk -------------------------------------------------------------------------


@pytest.fixture
def small_state_dir(daemon_home: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs as the state directory, so outputs can run out of space."""
    with mounted_tmpfs(daemon_home / "small", 2) as mount:
        yield mount


def test_what_waits_for_a_commit_waits_out_a_full_disk(small_state_dir: Path) -> None:
    """A trace line (JobStore.tell, Tell.TRACE): told once a commit holds the change, in
    order; while the disk refuses commits, held (a trace line never tells of a change a
    restart would not find); never for a job discarded meanwhile."""

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        store = JobStore(small_state_dir / "jobs.sqlite3")
        calls: list[str] = []
        try:
            first = JobRecord(id="first", task="noop", params={})
            store.add(first)
            store.tell(lambda: calls.append("first"), Tell.TRACE, first.id)
            before_the_commit = list(calls)
            store.flush()
            filler = fill(small_state_dir)
            for job_id in ("held", "discarded", "last"):
                store.add(JobRecord(id=job_id, task="noop", params={"pad": "x" * 200_000}))
                store.tell(lambda job_id=job_id: calls.append(job_id), Tell.TRACE, job_id)
            with pytest.raises(StateDiskFull):
                store.flush()
            while_full = list(calls)
            store.discard("discarded")
            filler.unlink()
            store.flush()
            return before_the_commit, while_full, calls
        finally:
            store.close()

    before_the_commit, while_full, calls = asyncio.run(scenario())
    assert before_the_commit == []
    assert while_full == ["first"]
    assert calls == ["first", "held", "last"]


def test_each_telling_on_a_full_disk(small_state_dir: Path) -> None:
    """JobStore.tell while the disk refuses the commit: an answer is told all the same, its
    record pending; a new job's acceptance is refused (StateDiskFull) and nobody told, unless
    some commit holds that job already; a trace line waits for the commit that succeeds."""

    async def scenario() -> tuple[list[str], list[str], bool]:
        store = JobStore(small_state_dir / "jobs.sqlite3")
        told: list[str] = []
        try:
            store.add(JobRecord(id="on_disk", task="noop", params={}))
            store.flush()
            filler = fill(small_state_dir)
            store.add(JobRecord(id="new", task="noop", params={"pad": "x" * 200_000}))
            told.append(store.tell(lambda: "answer"))
            with pytest.raises(StateDiskFull):
                store.tell(lambda: "accepted new", Tell.ACCEPTANCE, "new")
            told.append(store.tell(lambda: "accepted on_disk", Tell.ACCEPTANCE, "on_disk"))
            store.tell(lambda: told.append("trace"), Tell.TRACE, "new")
            while_full, new_committed = list(told), store.committed("new")
            filler.unlink()
            store.flush()
            return while_full, told, new_committed
        finally:
            store.close()

    while_full, told, new_committed = asyncio.run(scenario())
    assert while_full == ["answer", "accepted on_disk"]
    assert not new_committed
    assert told == ["answer", "accepted on_disk", "trace"]


def test_no_space_for_outputs_fails_the_job_cleanly(
    daemon_home: Path, small_state_dir: Path
) -> None:
    """Outputs larger than the disk: no_space_for_outputs, no partial file, the daemon serves on."""
    home = daemon_home / "full"
    home.mkdir()
    (home / "state").symlink_to(small_state_dir)
    daemon = start_daemon(home, None, None)
    try:
        with daemon.client() as client:
            big = client.run("vector_add", {"size": 1_000_000}, keep_outputs=True)
            small = client.run("vector_add", {"size": 1000}, keep_outputs=True)
    finally:
        daemon.stop()
    assert big["status"] == "failed"
    assert big["error"]["code"] == "no_space_for_outputs"
    assert "state directory" in big["error"]["hint"]
    assert small["status"] == "succeeded"
    assert not (small_state_dir / "outputs" / big["id"]).exists()


# -- who may do what -------------------------------------------------------------------------


def as_nobody(daemon: RunningDaemon, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` as uid 65534 against the daemon's socket; what it prints comes back.

    The child imports as root and then drops to nobody: the interpreter may live where
    nobody cannot read (orjson too, which the client imports only when it is first made:
    imported after the drop here, it killed the child with SIGSEGV), and SO_PEERCRED
    records the uid at connect time."""
    for folder in (daemon.home.parent, daemon.home):
        folder.chmod(0o755)
    daemon.socket_path.chmod(0o666)
    script = (
        "import os, orjson\nfrom taogpud.client import ApiError, Client\n"
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        f"client = Client({str(daemon.socket_path)!r})\n{code}"
    )
    try:
        return subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        daemon.socket_path.chmod(0o660)  # as the daemon made it (the daemon is shared)


@SHARED
def test_other_users_may_not_touch_a_job(module_daemon: RunningDaemon) -> None:
    """uid 65534 may not cancel root's job or read its outputs; its own job records its uid."""
    daemon = module_daemon
    with daemon.client() as client:
        job = client.run("vector_add", {"size": 100}, keep_outputs=True)
    result = as_nobody(
        daemon,
        f"""
job_id = {job["id"]!r}
for call in (lambda: client.cancel(job_id), lambda: client.download_output(job_id, "c")):
    try:
        call()
        print("allowed")
    except ApiError as exc:
        print(exc.code)
print(client.run("noop")["peer"]["uid"])
""",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["forbidden", "forbidden", str(NOBODY)]


# -- overload and hostile clients ------------------------------------------------------------


@SHARED
def test_a_thousand_idle_connections_do_not_block_others(module_daemon: RunningDaemon) -> None:
    """1,000 connections that send nothing, one that sent half a request: others are served.
    (All from one uid, so its cap is raised past them: module_daemon.)"""
    daemon = module_daemon
    idle = []
    try:
        for _ in range(1000):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(daemon.socket_path))
            idle.append(sock)
        slow = idle[0]
        slow.sendall(b"POST /v1/jobs HTTP/1.1\r\n")
        with daemon.client() as client:
            started = time.monotonic()
            assert client.run("noop")["status"] == "succeeded"
            assert client.health()["ok"]
            served_s = time.monotonic() - started
    finally:
        for sock in idle:
            sock.close()
    assert served_s < 10  # generous: the point is that it was served at all


def raw_exchange(daemon: RunningDaemon, request: bytes, close_early: bool = False) -> bytes:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(daemon.socket_path))
    sock.sendall(request)
    if close_early:
        sock.close()
        return b""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and b"}" in data:
                break
    except TimeoutError:
        pass
    sock.close()
    return data


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0


@SHARED
def test_hand_made_bad_requests_get_answers_and_harm_nothing(module_daemon: RunningDaemon) -> None:
    """Truncated bodies, wrong content types, huge headers, invalid UTF-8: 4xx, daemon serves on."""
    daemon = module_daemon
    body = b'{"task": "noop"}'
    head = b"POST /v1/jobs HTTP/1.1\r\nhost: x\r\n"
    truncated = head + b"content-type: application/json\r\ncontent-length: 100\r\n\r\n" + body
    raw_exchange(daemon, truncated, close_early=True)
    wrong_type = head + b"content-type: text/plain\r\ncontent-length: 16\r\n\r\n" + body
    bad_utf8 = b'{"task": "\xff\xfe"}'
    invalid = head + b"content-type: application/json\r\ncontent-length: 14\r\n\r\n" + bad_utf8
    huge = b"GET /v1/health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n"
    answers = [raw_exchange(daemon, r) for r in (wrong_type, invalid, huge)]
    statuses = [status_of(a) for a in answers]
    assert 400 <= statuses[0] < 500  # JSON under another content type is refused, not guessed
    assert b"application/json" in answers[0]
    assert 400 <= statuses[1] < 500
    assert statuses[2] in (200, 400, 431)  # served, or refused whole: never a crash
    with daemon.client() as client:
        assert client.run("noop")["status"] == "succeeded"


@SHARED
def test_a_submit_cut_off_midway_is_no_job(module_daemon: RunningDaemon) -> None:
    """A body that parses as a job but is shorter than its Content-Length (the client hung up)
    submits nothing."""
    daemon = module_daemon
    body = b'{"task": "noop"}'
    with daemon.client() as client:
        before = [j["id"] for j in client.list_jobs()]  # other tests' jobs (newest first)
    head = b"POST /v1/jobs?wait_s=1 HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    raw_exchange(daemon, head + b"content-length: 100\r\n\r\n" + body, close_early=True)
    with daemon.client() as client:
        # The hang-up reached the daemon before this job did; the job's round trip through a
        # worker gives its loop time to have acted on it.
        job = client.run("noop")
        assert [j["id"] for j in client.list_jobs()] == [job["id"], *before]


@SHARED
def test_an_upload_cut_off_midway_leaves_nothing_behind(module_daemon: RunningDaemon) -> None:
    """A client that announces a 4 MiB .npy and hangs up after 1 MiB: the half-filled image
    is removed from /dev/shm, and the next upload and job run as usual."""
    daemon = module_daemon

    def daemons_images() -> set[Path]:
        return set(images.SHM_DIR.glob(f"{images.PREFIX}{images.namespace_of(daemon.state_dir)}.*"))

    before = daemons_images()
    image = wire.npy_header((2**20,), "<f4") + bytes(4 * 2**20)
    head = (
        "POST /v1/arrays HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
        f"content-length: {len(image)}\r\n\r\n"
    )
    raw_exchange(daemon, head.encode() + image[: 2**20], close_early=True)
    wait_until(
        lambda: daemons_images() == before, "the half-filled image to leave /dev/shm", poll_s=0.05
    )
    with daemon.client() as client:
        kept = client.upload_array(np.ones(2**20, dtype=np.float32))
        job = client.run("reduce_sum", inputs={"x": kept["id"]})
    assert job["status"] == "succeeded", job


def test_full_dev_shm_is_a_clear_error(
    small_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload bigger than the room left in /dev/shm (here a 2 MiB tmpfs) is array_store_full."""
    from taogpud.arrayfiles.store import ArrayStore
    from taogpud.errors import ArrayStoreFull

    monkeypatch.setattr(images, "SHM_DIR", small_state_dir)
    with pytest.raises(ArrayStoreFull) as full:
        ArrayStore(budget_bytes=1 << 30)._create(4 << 20)
    assert "no room" in full.value.message
    assert list(small_state_dir.iterdir()) == []  # nothing half-made is left


def test_pruning_gives_the_space_back(tmp_path: Path) -> None:
    """The pages of pruned jobs go back to the file system (an incremental vacuum after the
    prune), not onto the database's free list for ever: the file shrinks."""
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path, keep_finished=100)
    now = time.time()
    for n in range(3000):
        job = JobRecord(id=f"{n:017x}", task="noop", params={"pad": "x" * 1000}, created_at=now)
        job.status, job.finished_at = JobState.succeeded, now + n
        store.add(job)
    store.flush()
    store.close()  # the WAL copied into the file: its size is the store's
    full = path.stat().st_size
    store = JobStore(path, keep_finished=100)
    assert store.prune(now) == 2900
    store.close()
    assert path.stat().st_size < full / 5, (path.stat().st_size, full)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 100
