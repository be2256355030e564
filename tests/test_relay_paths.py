"""Relay paths stay under provider.baseUrl (issue 34): a dot segment, plain or
percent-encoded, and an encoded slash or backslash are a 400 in the one error shape, on both
ways in, before anything is forwarded: the fake provider (a real server on 127.0.0.1) sees
none of them. Requests go as raw HTTP (http.client): httpx would resolve `..` itself.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Callable

import pytest
from conftest import relay_shared_by_the_module

from taogpud.testing import RunningDaemon
from taogpud.testing.fake_provider import FakeProvider

OUTSIDE = [
    "/v1/../admin",
    "/v1/..",
    "/v1/./models",
    "/v1/%2e%2e/admin",
    "/v1/%2E%2E/admin",
    "/v1/%2E./admin",
    "/v1/.%2e/admin",
    "/v1/%2e/models",
    "/v1/%252e%252e/admin",  # `..` after two decodings
    "/v1/..;x/admin",
    "/v1/models/a%2fb",
    "/v1/models/a%2F..%2Fb",
    "/v1/models/a%5cb",
    "/v1/models/a%255Cb",
]
UNDER = ["/v1/models", "/v1/models/a%20b", "/v1/models/a..b", "/v1/files/..."]


# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("relay_paths")


# The tests here read only their own answers: one relay and provider for them all.
provider, relayd = relay_shared_by_the_module()


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("taogpud")
        self._socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._socket_path)


def raw_post(
    conn: http.client.HTTPConnection, path: str, headers: dict[str, str]
) -> tuple[int, str, dict[str, str]]:
    with contextlib.closing(conn):
        conn.request("POST", path, body=b"{}", headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read().decode(), dict(answer.getheaders())


@pytest.fixture
def ways_in(relayd: RunningDaemon) -> list[Callable[[str], tuple[int, str, dict[str, str]]]]:
    """A request on the TCP listener (with a relay token) and on /relay of the Unix socket."""
    answer = json.loads(raw_post(UnixConnection(str(relayd.socket_path)), "/v1/relay/token", {})[1])
    host, _, port = answer["listen"].rpartition(":")
    tcp_headers = {"Host": answer["listen"], "Authorization": f"Bearer {answer['token']}"}

    def over_tcp(path: str) -> tuple[int, str, dict[str, str]]:
        return raw_post(http.client.HTTPConnection(host, int(port)), path, tcp_headers)

    def over_unix(path: str) -> tuple[int, str, dict[str, str]]:
        return raw_post(UnixConnection(str(relayd.socket_path)), "/relay" + path, {})

    return [over_tcp, over_unix]


def test_paths_that_leave_the_base_are_refused_and_not_forwarded(
    provider: FakeProvider, ways_in: list[Callable[[str], tuple[int, str, dict[str, str]]]]
) -> None:
    for send in ways_in:
        for path in OUTSIDE:
            status, text, headers = send(path)
            assert status == 400, (send.__name__, path, text)
            body = json.loads(text)
            assert set(body) == {"code", "message", "hint"}, text
            assert body["code"] == "path_outside_base" == headers["x-taogpud-error"]
            assert "baseUrl" in body["message"] and "%2F" in body["hint"]
    assert provider.seen == []


def test_paths_under_the_base_are_forwarded(
    provider: FakeProvider, ways_in: list[Callable[[str], tuple[int, str, dict[str, str]]]]
) -> None:
    """Dots inside a segment and escapes that are not slashes go upstream as sent."""
    for send in ways_in:
        for path in UNDER:
            status, text, _ = send(path)
            assert status == 200, (send.__name__, path, text)
    assert [seen.path for seen in provider.seen] == ["/api" + path for path in UNDER] * 2


def test_a_websocket_upgrade_outside_the_base_is_refused(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """The same rule for a WebSocket upgrade (the Responses API's WebSocket mode)."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import unix_connect

    for path in ("/v1/%2e%2e/responses", "/v1/responses%2f..%2fadmin"):
        url = "ws://taogpud/relay" + path
        with pytest.raises(InvalidStatus) as refused, unix_connect(str(relayd.socket_path), url):
            pass
        answer = refused.value.response
        assert answer.status_code == 400
        assert json.loads(answer.body)["code"] == "path_outside_base"
    assert provider.seen == []
