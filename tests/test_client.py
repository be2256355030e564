"""The Python client: its transport over a Unix socket, its errors, and the daemon's API.

Transport cases the daemon cannot produce on demand (a kept-alive connection closed under the
client, a body past the large-body threshold) run against a small real HTTP/1.1 server on a
Unix socket; how the client reads answers the daemon does not give (a body that is not JSON)
through a MockTransport, with no socket at all (tests/test_client_transport.py: the seam).
"""

from __future__ import annotations

import http.server
import io
import os
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taogpud.client import ApiError, Client, DaemonUnreachable, is_finished
from taogpud.client.transport import MockTransport, Response
from taogpud.jobs.records import JobState

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("client")

Reply = tuple[int, str, bytes]  # status, content type, body


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory: a Unix socket path must fit in 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="tgc") as directory:
        yield Path(directory)


class _StubServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    reply: Reply = (200, "application/json", b"{}")
    close_after_reply = False  # drop the connection after each answer, keep-alive notwithstanding
    connections = 0


class _StubHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _StubServer

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        status, content_type, body = self.server.reply
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.server.close_after_reply

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the base class would print every request to stderr."""


@pytest.fixture
def stub_server(socket_dir: Path) -> Iterator[Callable[[Reply], _StubServer]]:
    """Start an HTTP/1.1 server on a Unix socket that gives one fixed answer."""
    servers: list[_StubServer] = []

    def start(reply: Reply) -> _StubServer:
        server = _StubServer(str(socket_dir / "stub.sock"), _StubHandler)
        server.reply = reply
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_missing_socket_is_unreachable_naming_socket_and_fix(socket_dir: Path) -> None:
    """No socket file: DaemonUnreachable names the path and how to start the daemon."""
    path = socket_dir / "absent.sock"
    with Client(path) as client, pytest.raises(DaemonUnreachable) as caught:
        client.health()
    assert str(path) in caught.value.message
    assert "systemctl start taogpud" in caught.value.hint


def test_refused_socket_is_unreachable(socket_dir: Path) -> None:
    """A stale socket file with nobody listening: DaemonUnreachable, 'nothing is listening'."""
    path = socket_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))  # bound, never listening: connect() is refused
        with Client(path) as client, pytest.raises(DaemonUnreachable) as caught:
            client.status()
    assert "nothing is listening" in caught.value.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens any socket; needs an unprivileged user")
def test_forbidden_socket_says_join_group(socket_dir: Path) -> None:
    """A socket we may not open: DaemonUnreachable tells us to join group taogpu."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(socket_dir / "closed.sock"))
        listening.listen()
        (socket_dir / "closed.sock").chmod(0o000)
        with Client(socket_dir / "closed.sock") as client, pytest.raises(DaemonUnreachable) as e:
            client.health()
    assert "taogpu" in e.value.hint


def test_default_socket_comes_from_environment(
    socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client() without a path uses TAOGPUD_SOCKET."""
    monkeypatch.setenv("TAOGPUD_SOCKET", str(socket_dir / "env.sock"))
    assert Client().socket_path == str(socket_dir / "env.sock")


def answering(status: int, body: bytes) -> Client:
    """A client whose every request is answered `status` with `body`, in this process."""
    return Client(transport=MockTransport(lambda request: Response(status, body)))


def test_error_body_becomes_api_error() -> None:
    """A {code, message, hint} body becomes ApiError with those fields and the HTTP status."""
    body = b'{"code": "job_not_found", "message": "no job x", "hint": "taogpuctl list"}'
    with answering(404, body) as client, pytest.raises(ApiError) as caught:
        client.get("x")
    error = caught.value
    assert (error.code, error.message, error.hint, error.http_status) == (
        "job_not_found",
        "no job x",
        "taogpuctl list",
        404,
    )


def test_non_json_error_body_still_a_clear_api_error() -> None:
    """A plain-text 502 becomes ApiError code http_502 whose message quotes the body."""
    with answering(502, b"upstream exploded") as client, pytest.raises(ApiError) as caught:
        client.info()
    assert caught.value.code == "http_502"
    assert caught.value.http_status == 502
    assert "upstream exploded" in caught.value.message


def test_non_json_success_body_is_a_bad_response() -> None:
    """A 200 that is not JSON is ApiError bad_response, not a decoding traceback."""
    with answering(200, b"<html>hello</html>") as client, pytest.raises(ApiError) as caught:
        client.status()
    assert caught.value.code == "bad_response"


def test_keep_alive_reused_for_sequential_requests(
    stub_server: Callable[[Reply], _StubServer],
) -> None:
    """Three requests from one Client share one connection."""
    server = stub_server((200, "application/json", b'{"ok": true}'))
    with Client(server.server_address) as client:
        for _ in range(3):
            assert client.health() == {"ok": True}
    assert server.connections == 1


def test_reconnects_once_when_daemon_closed_the_connection(
    stub_server: Callable[[Reply], _StubServer],
) -> None:
    """A kept-alive connection the server dropped is reopened and the request still answers."""
    server = stub_server((200, "application/json", b'{"ok": true}'))
    server.close_after_reply = True
    with Client(server.server_address) as client:
        assert client.health() == {"ok": True}
        assert client.health() == {"ok": True}
    assert server.connections == 2


def test_large_body_arrives_whole_and_the_connection_stays(
    stub_server: Callable[[Reply], _StubServer],
) -> None:
    """A 3 MiB answer (read in place, past client/http.py's large-body threshold) comes back
    byte for byte, and the next request reuses the connection."""
    payload = np.random.default_rng(7).bytes(3 * 2**20 + 13)
    server = stub_server((200, "application/octet-stream", payload))
    with Client(server.server_address) as client:
        assert bytes(client.download_output("j1", "c")) == payload
        assert bytes(client.download_output("j1", "c")) == payload
    assert server.connections == 1


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "HttpParserError"),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"ok"', "middle of a response"),
    ],
)
def test_an_answer_that_is_not_http_is_a_bad_response(
    socket_dir: Path, answer: bytes, words: str
) -> None:
    """Something that is not HTTP/1.1, or a response cut short, is ApiError bad_response
    naming the socket, never a parser traceback or a hang."""
    path = str(socket_dir / "odd.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def answer_once() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(answer)
        conn.close()

    threading.Thread(target=answer_once, daemon=True).start()
    with Client(path, timeout_s=10) as client, pytest.raises(ApiError) as caught:
        client.health()
    listener.close()
    assert caught.value.code == "bad_response"
    assert path in caught.value.message and words in caught.value.message


def test_the_client_finishes_a_job_where_the_daemon_does() -> None:
    """One list of states for both sides: a job is finished for the client exactly when its
    state is finished for the daemon (taogpud.wire, no mirror to keep in step)."""
    for state in JobState:
        assert is_finished({"status": state.value}) is state.finished, state


# --- against a real daemon: the module's one, each test reading its own jobs --------------


def test_run_returns_the_finished_record_with_where_it_ran(module_daemon: Any) -> None:
    """run() of a small vector_add answers succeeded, backend cpu, a cpu:N device, timings."""
    with module_daemon.client() as client:
        job = client.run("vector_add", {"size": 1000})
    assert (job["status"], job["backend"], job["error"]) == ("succeeded", "cpu", None)
    assert job["device"].startswith("cpu:")
    assert job["run_ms"] is not None


def test_uploaded_arrays_come_back_added(module_daemon: Any) -> None:
    """upload_array(ndarray), run with inputs and keep_outputs, download_output: c == a + b."""
    a = np.arange(500, dtype=np.float32)
    b = np.full(500, 0.5, dtype=np.float32)
    with module_daemon.client() as client:
        inputs = {"a": client.upload_array(a)["id"], "b": client.upload_array(b)["id"]}
        job = client.run("vector_add", inputs=inputs, keep_outputs=True)
        c = np.load(io.BytesIO(client.download_output(job["id"], "c")))
    np.testing.assert_array_equal(c, a + b)


def test_a_large_upload_arrives_whole(module_daemon: Any) -> None:
    """A 12 MiB upload, streamed from the request piece by piece (far past uvicorn's 64 KiB
    buffer), comes back byte for byte through a job."""
    a = np.random.default_rng(3).random(3 * 2**20, dtype=np.float32)
    with module_daemon.client() as client:
        inputs = {
            "a": client.upload_array(a)["id"],
            "b": client.upload_array(np.zeros_like(a))["id"],
        }
        job = client.run("vector_add", inputs=inputs, keep_outputs=True)
        c = np.load(io.BytesIO(client.download_output(job["id"], "c")))
    np.testing.assert_array_equal(c, a)


def test_wait_calls_on_update_until_finished(module_daemon: Any) -> None:
    """wait() on a 1.5 s sleep reports at least twice and returns the finished record."""
    updates: list[dict[str, Any]] = []
    with module_daemon.client() as client:
        job_id = client.submit("sleep", {"ms": 1500})["id"]
        job = client.wait(job_id, on_update=updates.append)
    assert job["status"] == "succeeded"
    assert len(updates) >= 2
    assert updates[-1]["status"] == "succeeded"


def test_wait_with_timeout_returns_the_unfinished_record(module_daemon: Any) -> None:
    """wait(timeout_s=0.2) on a long sleep returns it still running; cancel then ends it."""
    with module_daemon.client() as client:
        job_id = client.submit("sleep", {"ms": 60000})["id"]
        assert client.wait(job_id, timeout_s=0.2)["status"] in {"queued", "running"}
        client.cancel(job_id)
        assert client.wait(job_id, timeout_s=30)["status"] == "cancelled"


def test_unknown_job_and_task_are_api_errors(module_daemon: Any) -> None:
    """get() of an unknown id is job_not_found 404; submit() of an unknown task, unknown_task."""
    with module_daemon.client() as client:
        with pytest.raises(ApiError) as missing:
            client.get("0000000000000000")
        with pytest.raises(ApiError) as unknown:
            client.submit("no_such_task")
    assert (missing.value.code, missing.value.http_status) == ("job_not_found", 404)
    assert unknown.value.code == "unknown_task"
    assert "no_such_task" in unknown.value.message


def test_list_jobs_filters_by_status(module_daemon: Any) -> None:
    """list_jobs(status="succeeded") holds a finished noop and nothing in another state."""
    with module_daemon.client() as client:
        done = client.run("noop")
        listed = client.list_jobs(status="succeeded", limit=10)
        health = client.health()
    assert done["id"] in {job["id"] for job in listed}
    assert {job["status"] for job in listed} == {"succeeded"}
    assert health["ok"] is True


# --- stops its daemon: one of its own


def test_daemon_gone_under_a_kept_alive_client(daemon: Any) -> None:
    """After the daemon stops, the next call on an open Client is DaemonUnreachable, not EPIPE."""
    with daemon.client() as client:
        assert client.health()["ok"] is True
        daemon.stop()
        with pytest.raises(DaemonUnreachable) as caught:
            client.health()
    assert str(daemon.socket_path) in caught.value.message
