"""The Python client: its transport over a Unix socket, its errors, and the daemon's API.

Transport cases the daemon cannot produce on demand (a non-JSON error body, a kept-alive
connection closed under the client) run against a small real HTTP/1.1 server on a Unix socket.
"""

from __future__ import annotations

import http.server
import os
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taogpud.client import FINISHED_STATES, ApiError, Client, DaemonUnreachable
from taogpud.jobs import JobState

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


def test_error_body_becomes_api_error(stub_server: Callable[[Reply], _StubServer]) -> None:
    """A {code, message, hint} body becomes ApiError with those fields and the HTTP status."""
    body = b'{"code": "job_not_found", "message": "no job x", "hint": "taogpuctl list"}'
    server = stub_server((404, "application/json", body))
    with Client(server.server_address) as client, pytest.raises(ApiError) as caught:
        client.get("x")
    error = caught.value
    assert (error.code, error.message, error.hint, error.http_status) == (
        "job_not_found",
        "no job x",
        "taogpuctl list",
        404,
    )


def test_non_json_error_body_still_a_clear_api_error(
    stub_server: Callable[[Reply], _StubServer],
) -> None:
    """A plain-text 502 becomes ApiError code http_502 whose message quotes the body."""
    server = stub_server((502, "text/plain", b"upstream exploded"))
    with Client(server.server_address) as client, pytest.raises(ApiError) as caught:
        client.info()
    assert caught.value.code == "http_502"
    assert caught.value.http_status == 502
    assert "upstream exploded" in caught.value.message


def test_non_json_success_body_is_a_bad_response(
    stub_server: Callable[[Reply], _StubServer],
) -> None:
    """A 200 that is not JSON is ApiError bad_response, not a decoding traceback."""
    server = stub_server((200, "text/html", b"<html>hello</html>"))
    with Client(server.server_address) as client, pytest.raises(ApiError) as caught:
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


def test_finished_states_match_job_states() -> None:
    """The client's finished set mirrors JobState.finished exactly."""
    assert {state.value for state in JobState if state.finished} == FINISHED_STATES
