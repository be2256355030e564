"""Header bytes above 0x7F pass the relay as the same bytes, both ways (issue 34): the client
sends raw header bytes (http.client), the fake provider (a real server on 127.0.0.1) records
what it got and answers headers of its own with such bytes. A value that is not UTF-8, which
the relay cannot forward unchanged, is a 400 in the one error shape, and nothing is forwarded.
"""

from __future__ import annotations

import http.client
import json

import pytest
from conftest import relay_shared_by_the_module

from taogpud.testing import RunningDaemon
from taogpud.testing.fake_provider import FakeProvider, Reply

UTF8 = "naïve ✓ 東京".encode()
LATIN1 = "café".encode("latin-1")  # 0xE9 alone: not UTF-8


# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("relay_headers")


# The tests here read only their own answers: one relay and provider for them all.
provider, relayd = relay_shared_by_the_module()


@pytest.fixture
def listen(relayd: RunningDaemon) -> dict[str, str]:
    """The relay's answer to `relay token`: its TCP address and the caller's token."""
    with relayd.client() as client:
        answer: dict[str, str] = client.relay_token()
    return answer


def send(
    listen: dict[str, str], headers: dict[str, bytes]
) -> tuple[http.client.HTTPResponse, bytes]:
    host, _, port = listen["listen"].rpartition(":")
    conn = http.client.HTTPConnection(host, int(port))
    conn.putrequest("GET", "/v1/models", skip_host=True)
    conn.putheader("Host", listen["listen"])
    conn.putheader("Authorization", f"Bearer {listen['token']}")
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer, body


def raw(value: str) -> bytes:
    """A header value as its bytes (http.server and http.client decode them as latin-1)."""
    return value.encode("latin-1")


def test_utf8_header_bytes_reach_the_provider_as_sent(
    provider: FakeProvider, listen: dict[str, str]
) -> None:
    answer, _ = send(listen, {"X-Title": UTF8, "User-Agent": b"tool/1 " + UTF8})
    assert answer.status == 200
    seen = provider.seen[-1].headers
    assert raw(seen["x-title"]) == UTF8
    assert raw(seen["user-agent"]) == b"tool/1 " + UTF8


def test_the_providers_header_bytes_reach_the_client_as_sent(
    provider: FakeProvider, listen: dict[str, str]
) -> None:
    """UTF-8 and lone latin-1 bytes alike: the answer's headers are not re-encoded."""
    provider.default = Reply(headers={"X-Utf8": UTF8.decode("latin-1"), "X-Latin": "café"})
    answer, _ = send(listen, {})
    assert raw(answer.headers["x-utf8"]) == UTF8
    assert raw(answer.headers["x-latin"]) == LATIN1


def test_a_header_that_is_not_utf8_is_refused_and_not_forwarded(
    provider: FakeProvider, listen: dict[str, str]
) -> None:
    answer, body = send(listen, {"X-Title": LATIN1})
    assert answer.status == 400
    error = json.loads(body)
    assert set(error) == {"code", "message", "hint"} and "x-title" in error["message"]
    assert answer.headers["x-taogpud-error"] == error["code"] == "header_not_utf8"
    assert provider.seen == []
