"""Arrays in the client's own memory: the `.shm` socket beside the daemon's, end to end.

A real daemon, real memfds handed over with SCM_RIGHTS, real workers mapping them; a real
second user (fork + setresuid) where the tests run as root.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taogpud.client import ApiError, Client
from taogpud.memfd import protocol
from taogpud.testing import ClientProcess, DaemonHandle, InProcessDaemon, RunningDaemon

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("shm_path")

SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
FROZEN = SIZE_SEALS | fcntl.F_SEAL_WRITE


def memfd(size: int, seals: int = SIZE_SEALS, allocated: bool = True) -> int:
    """A memfd of `size`; allocated: its pages allocated here, as the client does (so they
    are charged to this process), else sparse."""
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if allocated:
        os.posix_fallocate(fd, 0, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


class Raw:
    """The wire protocol by hand: what a client that gets things wrong sends."""

    def __init__(self, daemon: DaemonHandle) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(protocol.socket_path_for(daemon.socket_path)))

    def ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        protocol.send(self.sock, message, fds)
        return protocol.receive(self.sock)

    def attach(
        self, size: int = 1 << 20, seals: int = SIZE_SEALS, allocated: bool = True
    ) -> dict[str, Any]:
        fd = memfd(size, seals, allocated)
        try:
            return self.ask({"op": "attach"}, [fd])
        finally:
            os.close(fd)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(module_inprocess_daemon: InProcessDaemon) -> Iterator[Raw]:
    """A connection of its own to the module's daemon: the tests on it change nothing another
    test reads (refusals, and jobs on their own connection's memory)."""
    connection = Raw(module_inprocess_daemon)
    yield connection
    connection.close()


def region(offset: int, shape: list[int], dtype: str = "<f4", **extra: Any) -> dict[str, Any]:
    return {"offset": offset, "shape": shape, "dtype": dtype, **extra}


def submit(inputs: dict[str, Any], output: dict[str, int] | None = None) -> dict[str, Any]:
    return {"op": "submit", "task": "vector_add", "params": {}, "inputs": inputs, "output": output}


# -- the numpy-first client ------------------------------------------------------------------


def test_compute_runs_on_arrays_in_the_clients_memory(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    with module_inprocess_daemon.client() as client:
        a = client.empty(100_000, "float32")
        a[:] = np.arange(100_000, dtype=np.float32)
        b = np.full(100_000, 2.0, np.float32)  # not in the shared memory: copied in once
        out = client.compute("vector_add", a=a, b=b)
        np.testing.assert_array_equal(out["c"], a + 2)
        assert out.job["status"] == "succeeded"
        assert out.job["memory"] == {"handover": "shared", "bytes": 800_000}
        arena = client._shared().arena
        assert arena.offset_of(out["c"]) == out.job["outputs"][0]["offset"]  # no copy out
        again = client.compute("vector_add", a=out["c"], b=b)  # an output as the next input
        np.testing.assert_array_equal(again["c"], a + 4)


def test_frozen_inputs_go_in_a_sealed_memfd_and_the_record_says_so(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    with module_inprocess_daemon.client() as client:
        a = np.arange(1000, dtype=np.float64)  # the job's dtype is the inputs' (one rule)
        out = client.compute("vector_add", {"dtype": "float64"}, frozen=True, a=a, b=a)
        np.testing.assert_array_equal(out["c"], 2 * a)
        assert out.job["memory"]["handover"] == "sealed"


def test_outputs_larger_than_their_region_fail_the_job_naming_the_bytes(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    with module_inprocess_daemon.client() as client:
        a = client.empty(1 << 20, "float32")
        with pytest.raises(ApiError) as caught:
            client.compute("vector_add", a=a, b=a, out_bytes=4096)
        assert caught.value.code == "bad_region" and "4194304" in caught.value.message


def test_vector_add_computes_its_output_in_the_clients_memory(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    """The task writes c where the client reads it (numpy's out=): no copy follows."""
    with module_inprocess_daemon.client() as client:
        a = client.empty(1 << 16, "float32")
        a[:] = 1.5
        out = client.compute("vector_add", a=a, b=a)
        np.testing.assert_array_equal(out["c"], 3.0)
        assert out.job["outputs"][0]["written"] == "in_place"
        saxpy = client.compute("saxpy", {"alpha": 3.0}, x=a, y=a)
        np.testing.assert_array_equal(saxpy["out"], 6.0)
        assert saxpy.job["outputs"][0]["written"] == "in_place"
        m = client.empty((8, 8), "float32")
        m[:] = np.eye(8, dtype=np.float32) * 2
        matmul = client.compute("matmul", a=m, b=m)
        np.testing.assert_array_equal(matmul["c"], np.eye(8) * 4)
        assert matmul.job["outputs"][0]["written"] == "in_place"


def test_a_task_that_makes_its_own_output_is_copied_in_and_says_so(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    """sort makes its output itself (xp.sort has no out=): copied in, and the record says so."""
    with module_inprocess_daemon.client() as client:
        x = np.array([3, 1, 2], np.float32)
        out = client.compute("sort", x=x)
        np.testing.assert_array_equal(out["sorted"], [1, 2, 3])
        assert out.job["outputs"][0]["written"] == "copy"
        assert client._shared().arena.offset_of(out["sorted"]) is not None  # still in place


def test_outputs_over_http_are_files_and_name_no_placement(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    with module_inprocess_daemon.client() as client:
        job = client.run("vector_add", {"size": 16}, keep_outputs=True)
        assert job["outputs"][0]["written"] is None and job["outputs"][0]["offset"] is None


# -- several jobs in flight on one connection --------------------------------------------------


def test_two_computes_in_flight_on_one_connection_are_both_right(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    """Answers are matched by request id: the job that ends first is answered first."""
    with module_inprocess_daemon.client() as client:
        a = client.empty(4096, "float32")
        a[:] = 1
        slow = client.begin_compute("sleep", {"ms": 1500})
        fast = client.begin_compute("vector_add", a=a, b=np.full(4096, 2, np.float32))
        np.testing.assert_array_equal(fast.result()["c"], 3)
        fast_answered_at = time.time()
        slow_job = slow.result().job
        assert slow_job["status"] == "succeeded"
        # Not behind the sleep on the connection: its answer came before the sleep ended.
        assert slow_job["finished_at"] is not None and fast_answered_at < slow_job["finished_at"]
        results: dict[int, Any] = {}

        def add(k: int) -> None:
            x = np.full(1000, k, np.float32)
            results[k] = client.compute("vector_add", a=x, b=x)["c"]

        threads = [threading.Thread(target=add, args=(k,)) for k in range(1, 5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results) == [1, 2, 3, 4]
        for k, c in results.items():
            np.testing.assert_array_equal(c, 2 * k)


def test_a_client_past_the_limit_waits_for_a_place_instead_of_being_refused(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    """begin_compute blocks once max_in_flight jobs wait; every job then runs, none refused."""
    with module_inprocess_daemon.client() as client:
        x = client.empty(256, "float32")
        x[:] = 1
        jobs = [
            client.begin_compute("saxpy", {"alpha": float(k)}, x=x, y=x)
            for k in range(protocol.MAX_IN_FLIGHT + 4)
        ]
        for k, job in enumerate(jobs):
            np.testing.assert_array_equal(job.result()["out"], k + 1)


def test_pipelined_sealed_submits_each_get_their_own_memfd(raw: Raw) -> None:
    """Descriptors belong to the message they came with, even with requests back to back."""
    raw.attach()
    fds = []
    for value in (1.0, 5.0):
        fd = memfd(4096, 0)
        with mmap.mmap(fd, 4096) as mapped:
            np.frombuffer(mapped, np.float32)[:4] = value
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, FROZEN)
        fds.append(fd)
    for number, fd in enumerate(fds):
        message = {**submit({"a": region(0, [4]), "b": region(0, [4])}), "sealed": True}
        protocol.send(raw.sock, {**message, "id": number}, [fd])
        os.close(fd)
    buffer = bytearray()
    answers = {m["id"]: m for m in (protocol.receive(raw.sock, buffer) for _ in fds)}
    assert answers[0]["job"]["result"]["checksum"] == 8.0
    assert answers[1]["job"]["result"]["checksum"] == 40.0


def test_more_jobs_in_flight_than_allowed_are_refused_clearly(raw: Raw) -> None:
    limit = raw.attach()["max_in_flight"]
    assert limit == protocol.MAX_IN_FLIGHT
    sleep = {"op": "submit", "task": "sleep", "params": {"ms": 200}}
    raw.sock.sendall(b"".join(protocol.encode({**sleep, "id": n}) for n in range(limit + 1)))
    buffer = bytearray()
    first = protocol.receive(raw.sock, buffer)  # the refusal, before any sleep ends
    assert first["id"] == limit and first["error"]["code"] == "too_many_in_flight"
    assert f"{limit} jobs in flight" in first["error"]["message"]
    assert set(first["error"]) == {"code", "message", "hint"}
    rest = [protocol.receive(raw.sock, buffer) for _ in range(limit)]
    assert sorted(m["id"] for m in rest) == list(range(limit))
    assert all(m["job"]["status"] == "succeeded" for m in rest)
    assert raw.ask({**sleep, "params": {"ms": 0}, "id": "again"})["id"] == "again"


# -- refusals, each in the one error shape -------------------------------------------------------


def test_a_region_outside_the_memory_is_refused(raw: Raw) -> None:
    assert raw.attach(1 << 20)["memory"]["size"] == 1 << 20
    answer = raw.ask(submit({"a": region(1 << 20, [1]), "b": region(0, [1])}))
    assert answer["error"]["code"] == "region_outside_memory"
    assert "outside the memory of 1048576 bytes" in answer["error"]["message"]
    output = raw.ask(
        submit({"a": region(0, [1]), "b": region(0, [1])}, {"offset": 0, "nbytes": 2 << 20})
    )
    assert output["error"]["code"] == "region_outside_memory"


def test_a_size_or_dtype_that_disagrees_is_refused(raw: Raw) -> None:
    raw.attach()
    wrong_size = raw.ask(submit({"a": region(0, [4], nbytes=8), "b": region(0, [4])}))
    assert wrong_size["error"]["code"] == "region_mismatch"
    assert "8 bytes disagree with shape [4] of <f4 (16 bytes)" in wrong_size["error"]["message"]
    for dtype in ("|O", "nonsense", "V8"):
        answer = raw.ask(submit({"a": region(0, [4], dtype), "b": region(0, [4])}))
        assert answer["error"]["code"] == "region_mismatch", dtype
        assert set(answer["error"]) == {"code", "message", "hint"}


def test_a_descriptor_that_is_not_a_memfd_is_refused(raw: Raw) -> None:
    with tempfile.TemporaryFile() as file:
        answer = raw.ask({"op": "attach"}, [file.fileno()])
    assert answer["error"]["code"] == "not_memfd"
    read_end, write_end = os.pipe()
    answer = raw.ask({"op": "attach"}, [read_end])
    os.close(read_end), os.close(write_end)
    assert answer["error"]["code"] == "not_memfd" and "pipe:" in answer["error"]["message"]


def test_memory_whose_size_is_not_sealed_is_refused(raw: Raw) -> None:
    answer = raw.attach(seals=0)  # it could shrink under a worker and fault it
    assert answer["error"]["code"] == "not_sealed"
    assert "F_SEAL_SHRINK|F_SEAL_GROW" in answer["error"]["message"]


def test_a_sealed_handover_that_is_not_write_sealed_is_refused(raw: Raw) -> None:
    raw.attach()
    fd = memfd(4096)  # size-sealed only: the client could still change the "frozen" input
    message = {**submit({"a": region(0, [4]), "b": region(0, [4])}), "sealed": True}
    answer = raw.ask(message, [fd])
    os.close(fd)
    assert answer["error"]["code"] == "not_sealed" and "F_SEAL_WRITE" in answer["error"]["message"]
    fd = memfd(4096, FROZEN)
    answer = raw.ask(message, [fd])
    os.close(fd)
    assert (
        answer["job"]["status"] == "succeeded" and answer["job"]["memory"]["handover"] == "sealed"
    )


def test_regions_of_pages_the_client_never_allocated_are_refused(
    module_inprocess_daemon: InProcessDaemon,
) -> None:
    """A worker touching pages the client never allocated would allocate them itself, charged
    to the service (measured: 384 MiB of a client's untouched memory landed in the daemon's
    memory cgroup). A region past what the memory has allocated is refused, inputs and
    output alike, in a frozen memfd too; the same job on allocated pages runs. Before,
    each ran, on pages the worker allocated."""
    inputs = {"a": region(0, [4]), "b": region(4096, [4])}
    sparse, allocated, partly = (
        Raw(module_inprocess_daemon),
        Raw(module_inprocess_daemon),
        Raw(module_inprocess_daemon),
    )
    try:
        sparse.attach(1 << 20, allocated=False)
        answer = sparse.ask(submit(inputs))
        assert answer["error"]["code"] == "region_not_allocated", answer
        assert "input 'a': bytes 0..16 lie past the 0 bytes" in answer["error"]["message"]
        assert set(answer["error"]) == {"code", "message", "hint"}
        fd = memfd(4096, FROZEN, allocated=False)
        frozen = {**submit({"a": region(0, [4]), "b": region(0, [4])}), "sealed": True}
        sealed = allocated.ask(frozen, [fd])
        os.close(fd)
        assert sealed["error"]["code"] == "region_not_allocated", sealed
        allocated.attach(1 << 20)  # allocated, as Client does as it hands out space
        assert allocated.ask(submit(inputs))["job"]["status"] == "succeeded"
        fd = memfd(1 << 20, 0, allocated=False)
        os.posix_fallocate(fd, 0, 8192)  # the inputs' pages, not the output's
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS)
        assert "memory" in partly.ask({"op": "attach"}, [fd])
        os.close(fd)
        output = partly.ask(submit(inputs, {"offset": 8192, "nbytes": 4096}))
        assert output["error"]["code"] == "region_not_allocated", output
        assert "output: bytes 8192..12288 lie past the 8192 bytes" in output["error"]["message"]
    finally:
        for connection in (sparse, allocated, partly):
            connection.close()


def test_memory_over_the_users_quota_is_refused(raw: Raw) -> None:
    answer = raw.attach(64 << 30, allocated=False)  # no page is allocated: the size counts
    assert answer["error"]["code"] == "memory_quota_exceeded"
    assert "the quota is" in answer["error"]["message"]


# -- descriptors and mappings back to baseline ----------------------------------------------------


def held(pid: int) -> tuple[int, int]:
    """(open descriptors, memfd mappings) of a process."""
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    maps = Path(f"/proc/{pid}/maps").read_text().count("/memfd:")
    return fds, maps


def workers(daemon: DaemonHandle) -> list[int]:
    with daemon.client() as client:
        return [w["pid"] for w in client.status()["workers"]]


def settle(pids: list[int], baseline: list[tuple[int, int]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while [held(p) for p in pids] != baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [held(p) for p in pids] == baseline


def test_descriptors_and_mappings_return_to_baseline_after_1000_handovers(
    daemon: RunningDaemon,
) -> None:
    pids = [daemon.proc.pid, *workers(daemon)]
    with daemon.client() as client:
        client.health()  # the HTTP connection the baseline counts
        baseline = [held(p) for p in pids]
        for _ in range(1000):
            connection = Raw(daemon)
            assert "memory" in connection.attach(64 << 10)
            connection.close()
        for _ in range(20):  # jobs that map, write and unmap in the workers
            with Client(daemon.socket_path) as other:
                a = other.empty(1024, "float32")
                assert other.compute("vector_add", a=a, b=a).job["status"] == "succeeded"
        settle(pids, baseline)


def test_a_client_that_dies_mid_job_leaves_nothing_behind(daemon: RunningDaemon) -> None:
    pids = [daemon.proc.pid, *workers(daemon)]
    with daemon.client() as client:
        client.health()
        baseline = [held(p) for p in pids]
        child = ClientProcess(
            daemon.socket_path,
            "a = c.empty(4096, 'float32')\nprint('ready', flush=True)\n"
            "c.compute('sleep', {'ms': 1500})\n",
        )
        running = next(j for j in _poll_jobs(client, "running"))
        child.kill()
        assert held(daemon.proc.pid)[0] > baseline[0][0]  # the job still holds the memory
        assert client.wait(running["id"], timeout_s=10)["status"] == "succeeded"
        settle(pids, baseline)


def test_a_client_that_dies_with_several_jobs_in_flight_leaves_nothing_behind(
    daemon: RunningDaemon,
) -> None:
    pids = [daemon.proc.pid, *workers(daemon)]
    with daemon.client() as client:
        client.health()
        baseline = [held(p) for p in pids]
        child = ClientProcess(
            daemon.socket_path,
            "a = c.empty(4096, 'float32')\n"
            "jobs = [c.begin_compute('sleep', {'ms': 1000}) for _ in range(3)]\n"
            "jobs.append(c.begin_compute('vector_add', frozen=True, a=a, b=a))\n"
            "jobs.append(c.begin_compute('vector_add', a=a, b=np.ones(4096, np.float32)))\n"
            "print('ready', flush=True)\n"
            "import time; time.sleep(60)\n",
        )
        running = next(j for j in _poll_jobs(client, "running"))
        child.kill()
        assert held(daemon.proc.pid)[0] > baseline[0][0]  # the jobs still hold the memory
        assert client.wait(running["id"], timeout_s=10)["status"] == "succeeded"
        deadline = time.monotonic() + 15
        while client.list_jobs(status="queued") + client.list_jobs(status="running"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        settle(pids, baseline)


def _poll_jobs(client: Client, status: str) -> Iterator[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        yield from client.list_jobs(status=status)
        time.sleep(0.02)


# -- another user's memory ------------------------------------------------------------------------


def as_user(uid: int, work: Any) -> int:
    """Run work() in a forked child as uid (a real second user); its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            code = work()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="a second user needs root to create (CI is root)")
def test_another_users_memory_is_never_reachable(daemon: RunningDaemon) -> None:
    shm_socket = protocol.socket_path_for(daemon.socket_path)
    mine = Raw(daemon)
    size = 1 << 20
    fd = memfd(size)
    with mmap.mmap(fd, size) as secret:
        secret[:4] = b"mine"
        assert "memory" in mine.ask({"op": "attach"}, [fd])
        daemon_fds = list(Path(f"/proc/{daemon.proc.pid}/fd").iterdir())
        shm_socket.chmod(0o666)  # let the other user in; the group rule is not under test
        for folder in (daemon.home, daemon.home.parent):  # mkdtemp made them 0700
            folder.chmod(0o755)

        def other_user() -> int:
            for path in daemon_fds:  # the daemon's descriptors: not through /proc
                try:
                    os.open(path, os.O_RDONLY)
                    return 10
                except PermissionError:
                    pass
                except OSError:
                    pass
            theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            theirs.connect(str(shm_socket))
            own = memfd(4096)
            protocol.send(theirs, {"op": "attach"}, [own])
            if "memory" not in protocol.receive(theirs):
                return 11
            # regions name the connection's own memory only: past its end is refused, and
            # there is no way to name another connection's memory at all
            protocol.send(theirs, submit({"a": region(4096, [4]), "b": region(0, [4])}))
            answer = protocol.receive(theirs)
            return 0 if answer.get("error", {}).get("code") == "region_outside_memory" else 12

        assert as_user(65534, other_user) == 0
        secret_view = secret[:4]
    mine.close()
    os.close(fd)
    assert secret_view == b"mine"


def test_a_queued_job_on_client_memory_is_interrupted_by_a_restart(daemon_factory: Any) -> None:
    daemon = daemon_factory(config={"scheduling": {"max_concurrent_tasks": 1}})
    with daemon.client() as client:
        blocker = client.submit("sleep", {"ms": 5000})
        connection = Raw(daemon)
        connection.attach()
        protocol.send(connection.sock, submit({"a": region(0, [4]), "b": region(0, [4])}))
        queued = next(j for j in _poll_jobs(client, "queued"))
        assert queued["memory"] == {"handover": "shared", "bytes": 32}
    time.sleep(0.1)  # the store writes behind within a few ms
    daemon.stop(signal.SIGKILL)
    connection.close()
    again = daemon.restart()
    try:
        with again.client() as client:
            job = client.get(queued["id"])
            assert job["status"] == "interrupted", job
            assert "client's memory" in job["error"]["message"]
            assert client.get(blocker["id"])["status"] in ("interrupted", "queued", "running")
    finally:
        again.stop()


def test_an_unknown_op_and_a_broken_frame_are_answered_in_the_error_shape(raw: Raw) -> None:
    assert raw.ask({"op": "steal"})["error"]["code"] == "invalid_request"
    odd_id = raw.ask({"op": "attach", "id": [1]})  # an id must be a number or a string
    assert odd_id["error"]["code"] == "invalid_request" and "id" not in odd_id
    fd = memfd(4096)
    answer = raw.ask({"op": "steal"}, [fd])  # a descriptor no step takes is closed, not kept
    os.close(fd)
    assert answer["error"]["code"] == "invalid_request"
    raw.sock.sendall(len(b"[1]").to_bytes(4, "big") + b"[1]")
    answer = protocol.receive(raw.sock)
    assert answer["error"]["message"] == "a message must be a JSON object"
    assert raw.sock.recv(1) == b""  # then it hung up


# -- last, each on a daemon of its own: it stops the module's shared one (one in-process daemon
# runs at a time), and these change what another test would read


def test_without_the_shm_socket_compute_falls_back_to_http(
    inprocess_daemon: InProcessDaemon,
) -> None:
    protocol.socket_path_for(inprocess_daemon.socket_path).unlink()  # as over another host's socket
    with inprocess_daemon.client() as client:
        a = np.arange(10, dtype=np.float32)
        out = client.compute("vector_add", a=a, b=a)
        np.testing.assert_array_equal(out["c"], 2 * a)
        assert out.job["memory"] is None and not client._shared().local


def test_the_shm_socket_is_bound_like_the_daemons(inprocess_daemon: InProcessDaemon) -> None:
    shm_socket = protocol.socket_path_for(inprocess_daemon.socket_path)
    assert stat.S_ISSOCK(shm_socket.stat().st_mode)
    assert stat.S_IMODE(shm_socket.stat().st_mode) == 0o660
    inprocess_daemon.stop()
    assert not shm_socket.exists()
