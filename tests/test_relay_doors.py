"""The relay's door, beyond the battery every door passes (tests/test_doors.py): refused
requests make summaries, not a line each, and show nobody their paths or User-Agents; a
hang-up mid-body is one info line; `Expect: 100-continue` is the relay's to answer; two
Host headers are refused. Against taogpud/testing/fake_provider.py and a raw upstream that hangs up.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import start_relay, token_of

from taogpud.testing import RunningDaemon, wait_until
from taogpud.testing.fake_provider import FakeProvider

FLOOD = 300
MARK = "doors-flood-marker"


# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("relay_doors")


@pytest.fixture
def provider(shared_provider: FakeProvider) -> FakeProvider:
    """The tests here that take `relayd` read only their own answers and trace lines: one
    relay and provider for them all; the flood, whose summary lines come up to 10 s later,
    and tests that need settings of their own start a relay."""
    return shared_provider


@pytest.fixture
def relayd(shared_relayd: RunningDaemon) -> RunningDaemon:
    return shared_relayd


def test_a_flood_of_unauthenticated_requests_is_summarised_not_traced(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """300 requests without a token (and preflights among them): all 401, but the log has at
    most two summary lines for them (counted), and no line names their path or User-Agent."""
    relayd = start_relay(daemon_factory, provider.base_url)
    _, base = token_of(relayd)
    headers = {"user-agent": f"{MARK}-agent"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        statuses = {
            client.request("OPTIONS" if i % 10 == 0 else "POST", f"/v1/{MARK}/{i}").status_code
            for i in range(FLOOD)
        }
    assert statuses == {401}
    wait_until(lambda: relayd.events("relay.refused"), "the first summary line")
    summaries = relayd.events("relay.refused")
    assert 1 <= len(summaries) <= 2
    assert {(line["code"], line["uid"]) for line in summaries} == {("relay_token_required", None)}
    assert relayd.events("relay.request") == []  # nothing per request for those without a uid
    assert MARK not in relayd.stdout_text()


def test_a_client_that_hangs_up_mid_body_is_one_info_line(relayd: RunningDaemon) -> None:
    """The body stops halfway and the client closes: one info line, no traceback."""
    token, base = token_of(relayd)
    host_port = base.split("//")[1]
    host, _, port = host_port.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\nx-api-key: %s\r\n"
            b'content-length: 1000\r\n\r\n{"model": ' % (host_port.encode(), token.encode())
        )
    relayd.wait_for_event(lambda e: e.get("event") == "relay.client_gone")
    assert relayd.events("relay.client_gone")[0]["level"] == "info"
    assert "Traceback" not in relayd.stdout_text() + relayd.stderr()


@contextlib.contextmanager
def upstream_that_hangs_up() -> Iterator[str]:
    """A provider that promises 1000 bytes, sends 20 and closes: its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b'content-length: 1000\r\n\r\n{"id": "partial", '
                    )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/api"
    finally:
        listener.close()


def test_an_upstream_that_hangs_up_mid_body_is_one_info_line(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """The provider's answer stops short of its Content-Length: the client's answer is cut
    (it sees an error, not a short body taken for whole); one info line, no traceback."""
    with upstream_that_hangs_up() as base_url:
        daemon = start_relay(daemon_factory, base_url)
        token, base = token_of(daemon)
        with pytest.raises(httpx.HTTPError), httpx.Client(base_url=base, timeout=30) as client:
            client.post("/v1/chat/completions", json={}, headers={"x-api-key": token}).read()
        daemon.wait_for_event(lambda e: e.get("event") == "relay.upstream_gone")
    assert daemon.events("relay.upstream_gone")[0]["level"] == "info"
    assert "Traceback" not in daemon.stdout_text() + daemon.stderr()


def test_expect_100_continue_is_answered_by_the_relay(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """The client hears 100 Continue from the relay; the provider never sees `Expect`."""
    token, base = token_of(relayd)
    host_port = base.split("//")[1]
    host, _, port = host_port.rpartition(":")
    body = b'{"model": "m", "messages": []}'
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\nx-api-key: %s\r\n"
            b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n"
            % (host_port.encode(), token.encode(), len(body))
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert [seen.path for seen in provider.seen] == ["/api/v1/chat/completions"]
    assert "expect" not in provider.seen[0].headers


def test_two_host_headers_are_refused(relayd: RunningDaemon, provider: FakeProvider) -> None:
    """Two Host headers (which did a proxy in front read?): 400 duplicate_host, nothing sent."""
    token, base = token_of(relayd)
    host_port = base.split("//")[1]
    host, _, port = host_port.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"GET /v1/models HTTP/1.1\r\nhost: evil.example\r\nhost: %s\r\nx-api-key: %s\r\n\r\n"
            % (host_port.encode(), token.encode())
        )
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b'"code":"duplicate_host"' in answer
    assert provider.seen == []


def _door(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with httpx.Client(transport=transport, base_url="http://taogpud", timeout=30) as client:
        doors = client.get("/v1/status").json()["doors"]
    return {door["name"]: door for door in doors}[name]


def test_websocket_sessions_give_their_place_back_and_outlive_the_body_clock(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """Sessions over TCP, one after another, more than the budget without a uid: each is
    served (an upgraded connection gives its place back when it ends, and once its token is
    read it counts against its uid, not that budget); one held past body_timeout_s still
    relays (a session is not a slow body); afterwards the door has nothing open."""
    from websockets.sync.client import connect

    tight = {
        "TAOGPUD_CONFIG__SERVER__MAX_CONNECTIONS_WITHOUT_UID": "2",
        "TAOGPUD_CONFIG__SERVER__BODY_TIMEOUT_S": "0.5",  # no request here has a body
    }
    daemon = start_relay(daemon_factory, provider.base_url, env=tight)
    token, base = token_of(daemon)
    url = base.replace("http://", "ws://") + "/v1/responses"
    create = json.dumps({"type": "response.create", "model": "default", "input": "x"})
    for session in range(5):
        headers = {"authorization": f"Bearer {token}"}
        with connect(url, additional_headers=headers, open_timeout=30) as ws:
            if session == 0:
                time.sleep(1)  # past body_timeout_s: the session must still be there
            ws.send(create)
            events = [json.loads(ws.recv(timeout=30))]
            while events[-1]["type"] != "response.completed":
                events.append(json.loads(ws.recv(timeout=30)))
    wait_until(lambda: _door(daemon, "relay")["open"] == 0, "the relay door's places back")
    assert _door(daemon, "relay")["refused"] == 0
