"""The daemon as a process: start-up, traces, bad input, faults, shutdown, the key."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from taogpud import wire
from taogpud.client import ApiError
from taogpud.testing import (
    DaemonHandle,
    InProcessDaemon,
    RunningDaemon,
    daemon_command,
    start_daemon,
)

EXAMPLES = Path(__file__).parent.parent / "packaging" / "examples"
SECRET = "tk-test-" + "9f3c1a7e5b2d4c6e8a0b"  # built at runtime: no key sits in a fixture file


def raw_request(
    daemon: DaemonHandle,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One request over the socket without the client's checks, for malformed input."""
    conn = http.client.HTTPConnection("localhost")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(str(daemon.socket_path))
    conn.request(method, path, body=body, headers=headers or {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data) if data else None


def assert_error_shape(body: Any, code: str) -> None:
    assert set(body) == {"code", "message", "hint"}
    assert body["code"] == code
    assert body["message"]


# -- start-up ------------------------------------------------------------------------------


def test_seed_files_switched_to_cpu_run_vector_add(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """The setup guide's own two files (switched to cpu) load unchanged and run vector_add."""
    daemon = daemon_factory(
        files=(EXAMPLES / "cpu" / "settings.json", EXAMPLES / "cpu" / "config.toml")
    )
    with daemon.client() as client:
        job = client.run("vector_add", {"size": 1_000_000})
    assert job["status"] == "succeeded"
    assert (job["backend"], job["device"], job["fallback"]) == ("cpu", "cpu:0", False)
    assert daemon.stop() == 0


def test_cuda_without_a_gpu_refuses_to_start(daemon_factory: Callable[..., RunningDaemon]) -> None:
    """backend cuda on a host with no NVIDIA driver exits 6 (NOTCONFIGURED: the unit's
    RestartPreventExitStatus=, never retried) with one line: why, and what to do."""
    assert not Path("/proc/driver/nvidia/version").exists(), "this host has a driver"
    daemon = daemon_factory(
        settings={"gpu": {"backend": "cuda"}},
        config={"runtime": {"device_type": "gpu"}, "backend": {"cuda": {"enabled": True}}},
        wait_ready=False,
    )
    assert daemon.proc.wait(60) == 6
    lines = daemon.stderr().strip().splitlines()
    assert len(lines) == 1
    assert "CUDA cannot start" in lines[0]
    assert "allowFallbackToCpu" in lines[0]
    assert not daemon.socket_path.exists()


def test_fallback_to_cpu_is_loud(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """With allowFallbackToCpu, jobs run on cpu; every trace says fallback=true and why."""
    daemon = inprocess_factory(
        settings={"gpu": {"backend": "cuda", "allowFallbackToCpu": True}},
        config={"runtime": {"device_type": "gpu"}, "backend": {"cuda": {"enabled": True}}},
    )
    with daemon.client() as client:
        job = client.run("probe")
        status = client.status()
    assert (job["backend"], job["fallback"]) == ("cpu", True)
    assert job["fallback_reason"]
    assert status["fallback"] is True and status["backend"] == "cpu"
    traced = daemon.events("job.succeeded")[-1]
    assert traced["level"] == "warning"
    assert traced["fallback"] is True and traced["fallback_reason"] == job["fallback_reason"]
    assert daemon.events("backend.fallback")


def test_broken_config_exits_2_with_one_line(daemon_home: Path) -> None:
    """An unknown key in config.toml stops start-up with exit 2 and one line naming file and key."""
    home = daemon_home / "bad"
    home.mkdir()
    (home / "config.toml").write_text("[scheduling]\nmax_concurent_tasks = 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "taogpud", "--config", str(home / "config.toml"),
         "--socket", str(home / "s.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "config.toml" in lines[0] and "max_concurent_tasks" in lines[0]
    assert "max_concurrent_tasks" in lines[0]  # the did-you-mean


def test_a_start_up_config_error_shows_every_problem(daemon_home: Path) -> None:
    """Two mistakes in config.toml: the one line on stderr names both (it said the first and
    "(and 1 more)", so a fix took a restart per mistake)."""
    home = daemon_home / "two"
    home.mkdir()
    (home / "config.toml").write_text(
        "[scheduling]\nmax_concurent_tasks = 3\n[runtime]\nthread_nun = 2\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "taogpud", "--config", str(home / "config.toml"),
         "--socket", str(home / "s.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "max_concurent_tasks" in lines[0] and "thread_nun" in lines[0]
    assert "more)" not in lines[0]


def test_socket_is_0660_and_openapi_is_served(module_daemon: RunningDaemon) -> None:
    """The socket is rw for owner and group only; GET /v1/openapi.json lists the job routes."""
    assert module_daemon.socket_path.stat().st_mode & 0o777 == 0o660
    status, document = raw_request(module_daemon, "GET", "/v1/openapi.json")
    assert status == 200
    assert "/v1/jobs" in document["paths"] and "/v1/jobs/{job_id}/cancel" in document["paths"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_over_the_unix_socket(module_daemon: RunningDaemon) -> None:
    """`curl --unix-socket` submits a job and reads the answer."""
    result = subprocess.run(
        ["curl", "-sS", "--unix-socket", str(module_daemon.socket_path),
         "-H", "content-type: application/json",
         "-d", '{"task": "vector_add", "params": {"size": 1000}}', "http://taogpud/v1/jobs?wait_s=10"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    job = json.loads(result.stdout)
    assert job["status"] == "succeeded" and job["backend"] == "cpu"


# -- traces --------------------------------------------------------------------------------


def test_every_state_change_is_traced_with_where_it_ran(inprocess_daemon: InProcessDaemon) -> None:
    """queued, running, succeeded: one JSON line each, with where it ran, timings and uid."""
    with inprocess_daemon.client() as client:
        job = client.run("vector_add", {"size": 1000})
    mine = [e for e in inprocess_daemon.events() if e.get("job_id") == job["id"]]
    assert [e["event"] for e in mine] == ["job.queued", "job.running", "job.succeeded"]
    queued, running, done = mine
    # Sent to its worker before it was noted down (Orders.send): each line still says
    # what was true at its own state change.
    assert queued["status"] == "queued" and queued["device"] is None
    assert running["status"] == "running" and running["device"] == job["device"]
    assert (
        done["backend"] == "cpu" and done["device"] == job["device"] and done["fallback"] is False
    )
    assert done["queue_ms"] >= 0 and done["run_ms"] > 0
    assert done["uid"] == os.getuid()
    assert {"h2d_ms", "kernel_ms", "d2h_ms"} <= set(done)  # enable_profiling defaults to true


def test_request_lines_are_debug_by_default(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """At the default level (info) an answered request writes no api.request line (they
    outnumbered the job lines in the journal, 1,654 in one journey); a refused one (4xx) is
    still said, at info; at level debug every request is."""
    quiet = inprocess_factory()
    with quiet.client() as client:
        client.status()
        with pytest.raises(ApiError):
            client.get("ffffffffffffffff0")
    lines = quiet.events("api.request")
    assert [(e["path"], e["status"], e["level"]) for e in lines] == [
        ("/v1/jobs/ffffffffffffffff0", 404, "info")
    ]
    quiet.stop()  # logging is the process's: one in-process daemon at a time
    verbose = inprocess_factory(settings={"logging": {"level": "debug"}})
    with verbose.client() as client:
        client.status()
    assert [e["level"] for e in verbose.events("api.request") if e["path"] == "/v1/status"] == [
        "debug"
    ]


def test_request_trace_follows_the_setting(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """requestTrace=true logs one line per API request (at level debug); false logs none."""
    on = inprocess_factory(settings={"logging": {"level": "debug"}})
    with on.client() as client:
        client.status()
    on.stop()  # logging is the process's: one in-process daemon at a time
    off = inprocess_factory(settings={"logging": {"requestTrace": False, "level": "debug"}})
    with off.client() as client:
        client.status()
    assert any(e["path"] == "/v1/status" for e in on.events("api.request"))
    assert off.events("api.request") == []


def test_debug_lines_follow_the_level(inprocess_factory: Callable[..., InProcessDaemon]) -> None:
    """logging.level=error drops info lines, job traces included, but keeps errors."""
    daemon = inprocess_factory(settings={"logging": {"level": "error"}})
    with daemon.client() as client:
        client.run("noop")
    assert daemon.events("job.succeeded") == []


# -- bad input -----------------------------------------------------------------------------


def test_malformed_json_is_a_clear_error(module_daemon: RunningDaemon) -> None:
    """A body that is not JSON gets 4xx {code, message, hint} saying so."""
    status, body = raw_request(module_daemon, "POST", "/v1/jobs", b'{"task": "noop",')
    assert status in (400, 422)
    assert_error_shape(body, "invalid_request")
    assert "JSON" in body["message"]


def test_wrong_content_type_and_missing_fields(module_daemon: RunningDaemon) -> None:
    """A body without `task` names the missing field."""
    status, body = raw_request(module_daemon, "POST", "/v1/jobs", b'{"params": {}}')
    assert status == 422
    assert_error_shape(body, "invalid_request")
    assert "task" in body["message"]


@pytest.mark.parametrize(
    ("query", "headers", "status", "words"),
    [
        ("?wait_s=61", None, 400, "wait_s"),
        ("?wait_s=soon", None, 400, "wait_s"),
        ("?wait_s=1&wait_s=2&x=1", None, 201, ""),
        ("", {"content-type": "text/plain"}, 400, "application/json"),
    ],
)
def test_submits_with_a_bad_query_or_type_get_the_route_errors(
    module_daemon: RunningDaemon,
    query: str,
    headers: dict[str, str] | None,
    status: int,
    words: str,
) -> None:
    """A bad query or content type on POST /v1/jobs gets the route's usual errors."""
    body = b'{"task": "noop"}'
    answered, answer = raw_request(module_daemon, "POST", f"/v1/jobs{query}", body, headers)
    assert answered == status, answer
    if status >= 400:
        assert_error_shape(answer, "invalid_request")
        assert words in answer["message"]
    else:
        assert answer["task"] == "noop"


def test_submits_are_traced_like_other_requests(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """A submit that succeeds and one refused by the scheduler each log one api.request (at
    level debug, where answered requests are said too)."""
    daemon = inprocess_factory(settings={"logging": {"level": "debug"}})
    with daemon.client() as client:
        job = client.submit("noop", wait_s=10)
        with pytest.raises(ApiError):
            client.submit("no_such_task")
    assert job["status"] == "succeeded"
    # The line follows the answer (its duration includes sending it), so wait for the last.
    daemon.wait_for_event(lambda e: e.get("event") == "api.request" and e.get("status") == 404)
    submits = [e for e in daemon.events("api.request") if e["path"] == "/v1/jobs"]
    assert [(e["method"], e["status"]) for e in submits] == [("POST", 201), ("POST", 404)]
    assert all(e["duration_ms"] >= 0 and e["uid"] == os.getuid() for e in submits)


def test_unknown_task_suggests_the_close_one(module_daemon: RunningDaemon) -> None:
    """`vectr_add` is unknown_task (404) with a did-you-mean."""
    with module_daemon.client() as client, pytest.raises(ApiError) as refused:
        client.submit("vectr_add")
    assert (refused.value.http_status, refused.value.code) == (404, "unknown_task")
    assert "vector_add" in refused.value.message + refused.value.hint


def test_params_of_the_wrong_type_name_the_field(module_daemon: RunningDaemon) -> None:
    """size="big" is invalid_params (422) naming `size`."""
    with module_daemon.client() as client, pytest.raises(ApiError) as refused:
        client.submit("vector_add", {"size": "big"})
    assert (refused.value.http_status, refused.value.code) == (422, "invalid_params")
    assert "size" in refused.value.message


def test_absurd_size_is_refused_with_the_numbers(inprocess_daemon: InProcessDaemon) -> None:
    """size=10**13 is too_large (413) with the job's need and the device cap, and is not queued."""
    with inprocess_daemon.client() as client:
        with pytest.raises(ApiError) as refused:
            client.submit("vector_add", {"size": 10_000_000_000_000})
        assert client.status()["queued"] == 0
    assert (refused.value.http_status, refused.value.code) == (413, "too_large")
    assert "GiB" in refused.value.message and "memoryFraction" in refused.value.hint


def test_missing_input_array(module_daemon: RunningDaemon) -> None:
    """An input id nobody uploaded is missing_input (404) with how to upload."""
    with module_daemon.client() as client, pytest.raises(ApiError) as refused:
        client.submit("vector_add", inputs={"a": "a0000000000000000"})
    assert (refused.value.http_status, refused.value.code) == (404, "missing_input")
    assert "upload" in refused.value.hint


def test_body_far_too_large(module_daemon: RunningDaemon) -> None:
    """A 2 MiB JSON body is refused with 413 body_too_large before it is parsed."""
    big = json.dumps({"task": "noop", "params": {"x": "y" * (2 << 20)}}).encode()
    status, body = raw_request(module_daemon, "POST", "/v1/jobs", big)
    assert status == 413
    assert_error_shape(body, "body_too_large")


def test_not_an_npy_upload(module_daemon: RunningDaemon) -> None:
    """Uploading bytes that are not .npy is invalid_request saying what a .npy starts with."""
    status, body = raw_request(
        module_daemon, "POST", "/v1/arrays", b"hello", {"content-type": "application/octet-stream"}
    )
    assert status == 400
    assert_error_shape(body, "invalid_request")
    assert ".npy" in body["message"]


def test_unknown_route_and_job(module_daemon: RunningDaemon) -> None:
    """An unknown path and an unknown job id both answer the one error shape."""
    status, body = raw_request(module_daemon, "GET", "/v1/nope")
    assert status == 404
    assert_error_shape(body, "not_found")
    status, body = raw_request(module_daemon, "GET", "/v1/jobs/doesnotexist")
    assert status == 404
    assert_error_shape(body, "job_not_found")


def test_client_hanging_up_while_waiting_loses_nothing(inprocess_daemon: InProcessDaemon) -> None:
    """A client that disconnects mid-wait does not stop its job or the daemon."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(inprocess_daemon.socket_path))
    body = b'{"task": "sleep", "params": {"ms": 300}}'
    sock.sendall(
        b"POST /v1/jobs?wait_s=30 HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    inprocess_daemon.wait_for_event(lambda e: e.get("event") == "job.running")
    sock.close()
    done = inprocess_daemon.wait_for_event(lambda e: e.get("event") == "job.succeeded")
    assert done["task"] == "sleep"
    with inprocess_daemon.client() as client:
        assert client.run("noop")["status"] == "succeeded"


# -- data ----------------------------------------------------------------------------------


def test_inputs_and_outputs_round_trip(module_daemon: RunningDaemon) -> None:
    """Uploaded a and b go in, and the kept output c downloads as exactly a + b."""
    rng = np.random.default_rng(7)
    a, b = rng.random(10_000, dtype=np.float32), rng.random(10_000, dtype=np.float32)
    with module_daemon.client() as client:
        ids = {name: client.upload_array(array)["id"] for name, array in (("a", a), ("b", b))}
        job = client.run("vector_add", inputs=ids, keep_outputs=True)
        raw = client.download_output(job["id"], "c")
    import io

    c = np.load(io.BytesIO(raw))
    np.testing.assert_array_equal(c, a + b)
    assert job["outputs"][0]["name"] == "c" and job["outputs"][0]["shape"] == [10_000]


# -- faults and shutdown -------------------------------------------------------------------


def test_killed_worker_fails_its_job_and_is_replaced(inprocess_daemon: InProcessDaemon) -> None:
    """kill -9 of a worker mid-job: that job fails worker_crashed, a new worker takes over."""
    with inprocess_daemon.client() as client:
        job = client.submit("sleep", {"ms": 30_000}, device=0)
        running = inprocess_daemon.wait_running(job["id"])
        os.kill(running["worker_pid"], signal.SIGKILL)
        failed = client.wait(job["id"], timeout_s=30)
        inprocess_daemon.wait_for_event(
            lambda e: e.get("event") == "worker.warm" and e["pid"] != running["worker_pid"]
        )
        after = client.run("noop", device=0)
        workers = client.status()["workers"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "worker_crashed"
    assert "signal 9" in failed["error"]["message"]
    assert after["status"] == "succeeded" and after["worker_pid"] != running["worker_pid"]
    assert workers[0]["restarts"] == 1


def test_the_key_never_appears(daemon_home: Path) -> None:
    """The API key from the environment shows in no log line and no API response."""
    daemon = start_daemon(daemon_home / "key", None, None, env={"TAOTOKEN_API_KEY": SECRET})
    try:
        with daemon.client() as client:
            answers = [client.info(), client.config(), client.status(), client.run("probe")]
            assert client.info()["key_source"] == "env"
    finally:
        daemon.stop()
    assert SECRET not in json.dumps(answers)
    assert SECRET not in daemon.log_path.read_text() + daemon.stderr()


def test_second_daemon_on_the_same_socket_refuses(module_daemon: RunningDaemon) -> None:
    """A second taogpud on a live socket exits 75 (may pass later) saying another one serves
    there."""
    result = subprocess.run(  # its own state dir: never the host's /var/lib/taogpud
        daemon_command(module_daemon.home, state_name="other-state"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 75
    assert "already serving" in result.stderr
    with module_daemon.client() as client:
        assert client.health()["ok"]


def test_uploads_keep_shape_and_dtype(module_daemon: RunningDaemon) -> None:
    """0-d, empty, 2-D, bool and strided complex arrays upload with their shape and dtype."""
    arrays = [
        np.array(5.0),
        np.zeros(0, dtype=np.int16),
        np.ones((3, 4)),
        np.array([True, False]),
        np.arange(6, dtype=np.complex64)[::2],
    ]
    with module_daemon.client() as client:
        views = [client.upload_array(array) for array in arrays]
    assert [v["shape"] for v in views] == [list(a.shape) for a in arrays]
    assert [v["dtype"] for v in views] == [a.dtype.str for a in arrays]
    assert [v["nbytes"] for v in views] == [a.nbytes for a in arrays]


def _responses(sock: socket.socket, count: int) -> list[tuple[int, Any]]:
    """`count` HTTP/1.1 responses with Content-Length bodies, read off one connection."""
    data, answers = b"", []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode()
            length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
            if len(data) >= head_end + 4 + length:
                body = data[head_end + 4 : head_end + 4 + length]
                answers.append((int(head.split(" ")[1]), json.loads(body)))
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the daemon hung up after {len(answers)} answers"
        data += chunk
    return answers


def test_an_upload_in_pieces_then_a_pipelined_request_on_the_same_connection(
    inprocess_daemon: InProcessDaemon,
) -> None:
    """An upload streamed from the request in pieces: every byte lands, none of the
    request behind it is taken, and the connection serves on."""
    array = np.arange(3 * 2**20, dtype=np.float32)  # 12 MiB: many reads
    image = wire.npy_header(array.shape, "<f4") + array.tobytes()
    head = (
        "POST /v1/arrays HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
        f"content-length: {len(image)}\r\n\r\n"
    ).encode()
    behind = b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(inprocess_daemon.socket_path))
        sock.sendall(head + image[:1000])  # the handler starts with part of the body
        time.sleep(0.2)
        sock.sendall(image[1000 : 5 * 2**20])
        time.sleep(0.2)
        sock.sendall(image[5 * 2**20 :] + behind)  # the body's end and a request in one send
        (upload_status, uploaded), (health_status, health) = _responses(sock, 2)
    assert (upload_status, uploaded["shape"], uploaded["dtype"]) == (201, [3 * 2**20], "<f4")
    assert health_status == 200 and health["ok"] is True
    with inprocess_daemon.client() as client:
        job = client.run("reduce_sum", inputs={"x": uploaded["id"]})
    assert job["status"] == "succeeded", job
    assert job["result"]["size"] == array.size
    assert job["result"]["sum"] == float(array.sum())  # the same reduction over the same bytes


def test_an_upload_longer_than_its_header_says_is_refused_and_the_connection_serves_on(
    inprocess_daemon: InProcessDaemon,
) -> None:
    """Content-Length frames the body: 1 MiB more than the .npy header announces is read to
    its end (not taken for the next request), refused, and the next request is answered."""
    image = wire.npy_header((2**20,), "<f4") + bytes(4 * 2**20)
    padded = image + bytes(2**20)
    head = (
        "POST /v1/arrays HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
        f"content-length: {len(padded)}\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(inprocess_daemon.socket_path))
        sock.sendall(head + padded + b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n")
        (refused_status, refused), (health_status, _) = _responses(sock, 2)
    assert refused_status == 400 and "header says" in refused["message"]
    assert health_status == 200


# -- the job route on one connection --------------------------------------------------------


def _submit_bytes(body: bytes, query: str = "?wait_s=30") -> bytes:
    return (
        f"POST /v1/jobs{query} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_pipelined_submits_are_answered_in_order_on_one_connection(
    inprocess_daemon: InProcessDaemon,
) -> None:
    """Three requests in one send (a waiting submit, one without wait_s, a health check):
    three answers, in the order asked, and the connection serves on."""
    slow = _submit_bytes(b'{"task": "sleep", "params": {"ms": 200}}')
    quick = _submit_bytes(b'{"task": "noop"}', query="")
    health = b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(inprocess_daemon.socket_path))
        sock.sendall(slow + quick + health)
        (s1, first), (s2, second), (s3, third) = _responses(sock, 3)
        sock.sendall(quick)
        ((s4, fourth),) = _responses(sock, 1)
    assert (s1, first["task"], first["status"]) == (201, "sleep", "succeeded")
    assert (s2, second["task"]) == (201, "noop")  # answered once the first one was
    assert (s3, third["ok"]) == (200, True)
    assert (s4, fourth["task"]) == (201, "noop")


def test_a_submit_over_64_kib_runs(module_daemon: RunningDaemon) -> None:
    """A submit whose body passes uvicorn's 64 KiB read-ahead (JSON whitespace) runs."""
    body = b'{"task": "noop"' + b" " * 70_000 + b"}"
    status, job = raw_request(module_daemon, "POST", "/v1/jobs?wait_s=10", body)
    assert (status, job["status"]) == (201, "succeeded")


# -- SIGTERM: one scenario that three tests read ---------------------------------------------


class Drained(NamedTuple):
    """Four jobs running (the cap is 4) and four queued, one of them by a submit still
    waiting on it, at SIGTERM; then a restart, until the queued ones ended."""

    daemon: RunningDaemon  # the run that drained (stopped): its trace
    exit_code: int
    socket_left: bool  # whether its socket file was there once it had exited
    running: list[str]  # the four 1.5 s jobs
    queued: list[str]  # three submitted without waiting
    waiter: tuple[int, dict[str, Any]]  # the waiting submit's answer: status, job
    waiter_closed: bytes  # what came on its connection after the answer
    after_restart: list[dict[str, Any]]  # the queued jobs, waited for after the restart
    first_after_restart: dict[str, Any]  # the first running job, read after the restart


@pytest.fixture(scope="module")
def drained(module_daemon_factory: Callable[..., RunningDaemon]) -> Drained:
    """The scenario (1.5 s jobs: what happens between their start and SIGTERM takes far less)."""
    daemon = module_daemon_factory(config={"scheduling": {"max_concurrent_tasks": 4}})
    with daemon.client() as client:
        running = [client.submit("sleep", {"ms": 1500})["id"] for _ in range(4)]
        daemon.wait_running(running[-1])
        queued = [client.submit("noop")["id"] for _ in range(3)]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(daemon.socket_path))
        sock.sendall(_submit_bytes(b'{"task": "noop"}'))
        daemon.wait_for_event(
            lambda e: (
                e.get("event") == "job.queued" and e["task"] == "noop" and e["job_id"] not in queued
            )
        )
        daemon.proc.send_signal(signal.SIGTERM)
        ((status, job),) = _responses(sock, 1)
        closed = sock.recv(100)  # the daemon is stopping
    exit_code = daemon.proc.wait(30)
    socket_left = daemon.socket_path.exists()
    again = daemon.restart()
    try:
        with again.client() as client:
            after = [dict(client.wait(job_id, timeout_s=30)) for job_id in queued]
            first = dict(client.get(running[0]))
    finally:
        again.stop()
    waiter = (status, job)
    return Drained(daemon, exit_code, socket_left, running, queued, waiter, closed, after, first)


def last_states(daemon: RunningDaemon, prefix: str = "") -> dict[str, str]:
    """Each job's last event in the daemon's trace (of those whose name starts `prefix`)."""
    return {
        e["job_id"]: e["event"]
        for e in daemon.events()
        if e.get("event", "").startswith(prefix) and e.get("job_id")
    }


@pytest.mark.xdist_group("drained")  # one worker, so the scenario runs once
def test_sigterm_lets_running_jobs_finish(drained: Drained) -> None:
    """SIGTERM: the 4 running jobs finish, the daemon exits 0 and removes its socket."""
    states = last_states(drained.daemon, "job.")
    assert drained.exit_code == 0
    assert [states[job_id] for job_id in drained.running] == ["job.succeeded"] * 4
    assert drained.daemon.events("daemon.stopped")
    assert not drained.socket_left


@pytest.mark.xdist_group("drained")
def test_jobs_queued_at_sigterm_run_after_the_restart(drained: Drained) -> None:
    """SIGTERM lets the running jobs finish; the queued ones stay queued and run after a
    restart."""
    states = last_states(drained.daemon)
    assert drained.exit_code == 0
    assert [states[j] for j in drained.running] == ["job.succeeded"] * 4
    assert [states[j] for j in drained.queued] == ["job.queued"] * 3
    assert [job["status"] for job in drained.after_restart] == ["succeeded"] * 3
    assert drained.first_after_restart["status"] == "succeeded"  # finished jobs stay readable


@pytest.mark.xdist_group("drained")
def test_a_submit_waiting_at_sigterm_is_answered_with_its_job_as_it_is(drained: Drained) -> None:
    """SIGTERM while a client waits on a queued job: the running ones finish, then the
    waiter gets its job, still queued (it runs after a restart), not a dropped connection."""
    status, job = drained.waiter
    assert (status, job["status"]) == (201, "queued")
    assert drained.waiter_closed == b""  # then closed: the daemon is stopping
    assert drained.exit_code == 0
    states = last_states(drained.daemon)
    assert [states[j] for j in drained.running] == ["job.succeeded"] * 4
