"""The key never leaves through the relay (issue 34), whatever the provider sends back.

The fake provider (taogpud/testing/fake_provider.py, a real server on 127.0.0.1) repeats the
credentials it got in success bodies, in SSE streams (each echoing event split in two chunks
in the middle of the key) and in response headers of every status. The official SDKs read
the answers; the bytes are checked as they came off the socket. The byte scrubber itself is
checked at every split point of a stream.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import RELAY_KEY as KEY
from conftest import relay_shared_by_the_module, token_of
from pydantic import SecretStr

from taogpud.provider.channel import Scrubber
from taogpud.relay.scrub import MARK, KeyBytes
from taogpud.testing import RunningDaemon
from taogpud.testing.fake_provider import (
    FakeProvider,
    Reply,
    anthropic_message,
    completion,
)

BLANK = MARK.decode() + "*" * (len(KEY) - len(MARK))  # the key's place, as many bytes as it had


@pytest.fixture(scope="module")
def relay_provider_settings() -> dict[str, Any]:
    """No retries: each error status reaches the client from the provider's first answer."""
    return {"maxRetries": 0}


# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("relay_key")


# The tests here read only their own answers: one relay and provider for them all.
provider, relayd = relay_shared_by_the_module()


@pytest.fixture
def tcp(relayd: RunningDaemon) -> tuple[str, str]:
    """(relay token, http://127.0.0.1:PORT)."""
    return token_of(relayd)


def openai_event(content: str) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + json.dumps({**chunk, "choices": [choice]}).encode() + b"\n\n"


def anthropic_events(text: str) -> tuple[bytes, ...]:
    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

    message = anthropic_message("m") | {"content": [], "stop_reason": None}
    delta = {"index": 0, "delta": {"type": "text_delta", "text": text}}
    return (
        event("message_start", {"message": message}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        event("content_block_delta", delta),
        event("content_block_stop", {"index": 0}),
        event(
            "message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}
        ),
        event("message_stop", {}),
    )


def assert_no_key(*texts: Any) -> None:
    for text in texts:
        shown = text.decode("latin-1") if isinstance(text, bytes) else str(text)
        assert KEY not in shown
        assert KEY[:16] not in shown  # nor the key's first half, alone (a split piece)


# ---- through the relay -------------------------------------------------------------------


def test_a_success_body_echoing_the_key_is_scrubbed_and_keeps_its_length(
    provider: FakeProvider, tcp: tuple[str, str]
) -> None:
    """openai's SDK: the key in a 200's body becomes `<redacted>***` as long as it was, so the
    Content-Length the provider sent still holds; in the echo headers it is gone too."""
    token, base = tcp
    provider.default = Reply(body=completion(content="got @AUTH@"), echo=True)
    client = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)
    with client:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=[])
    answer = raw.parse()
    assert answer.choices[0].message.content == f"got Bearer {BLANK}"
    assert int(raw.headers["content-length"]) == len(raw.http_response.content)
    assert raw.headers["x-echo-authorization"] == f"Bearer {BLANK}"
    assert_no_key(raw.http_response.content, raw.headers.raw)


def test_an_anthropic_answer_echoing_x_api_key_is_scrubbed(
    provider: FakeProvider, tcp: tuple[str, str]
) -> None:
    """anthropic's SDK: the key as x-api-key, echoed in a message and in a header."""
    token, base = tcp
    message = anthropic_message("m") | {"content": [{"type": "text", "text": "@XKEY@"}]}
    provider.default = Reply(body=message, echo=True)
    with anthropic.Anthropic(base_url=base, api_key=token, max_retries=0) as client:
        raw = client.messages.with_raw_response.create(model="m", max_tokens=8, messages=[])
    assert raw.parse().content[0].text == BLANK  # type: ignore[union-attr]
    assert raw.headers["x-echo-api-key"] == BLANK
    assert_no_key(raw.http_response.content, raw.headers.raw)


def test_a_stream_with_the_key_split_across_chunks_is_scrubbed(
    provider: FakeProvider, tcp: tuple[str, str]
) -> None:
    """The echoing event comes in two chunks split inside the key: openai's SDK reads the
    scrubbed text whole, and no piece off the socket holds the key or its first half."""
    token, base = tcp
    events = (openai_event("a "), openai_event("@AUTH@"), openai_event(" b"), b"data: [DONE]\n\n")
    provider.default = Reply(events=events, echo=True)
    client = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)
    with client:
        stream = client.chat.completions.create(model="m", messages=[], stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == f"a Bearer {BLANK} b"
    headers = {"authorization": f"Bearer {token}"}
    with httpx.stream("POST", base + "/v1/chat/completions", json={}, headers=headers) as answer:
        pieces = list(answer.iter_raw())
    assert_no_key(*pieces, b"".join(pieces), answer.headers.raw)
    assert f"Bearer {BLANK}".encode() in b"".join(pieces)


def test_an_anthropic_stream_with_the_key_split_is_scrubbed(
    provider: FakeProvider, tcp: tuple[str, str]
) -> None:
    token, base = tcp
    provider.default = Reply(events=anthropic_events("key=@XKEY@."), echo=True)
    with (
        anthropic.Anthropic(base_url=base, api_key=token, max_retries=0) as client,
        client.messages.stream(model="m", max_tokens=8, messages=[]) as stream,
    ):
        text = "".join(stream.text_stream)
    assert text == f"key={BLANK}."


@pytest.mark.parametrize("status", [200, 204, 302, 404, 429, 503])
def test_response_headers_of_every_status_are_scrubbed(
    provider: FakeProvider, tcp: tuple[str, str], status: int
) -> None:
    """The echo headers (and a Location holding the key) of a success, an empty answer, a
    redirect and errors reach the client scrubbed; the body of each too."""
    token, base = tcp
    body = b"" if status == 204 else b'{"echo": "@AUTH@ @XKEY@"}'
    provider.default = Reply(status, body, {"Retry-After": "0"}, echo=True)
    answer = httpx.get(base + "/v1/models", headers={"x-api-key": token})
    assert answer.status_code == status
    assert answer.headers["x-echo-authorization"] == f"Bearer {BLANK}"  # openai's family
    assert_no_key(answer.headers.raw, answer.content)


# ---- the scrubber at every split point -----------------------------------------------------


@pytest.fixture(scope="module")
def key_bytes() -> KeyBytes:
    return KeyBytes(Scrubber(SecretStr(KEY)).forms)


def body_with_key() -> bytes:
    basic = base64.b64encode(f"user:{KEY}".encode()).decode()
    return f'data: {{"a": "Bearer {KEY}", "b": "{KEY}{KEY}", "c": "Basic {basic}"}}\n\n'.encode()


def scrubbed(key_bytes: KeyBytes, pieces: list[bytes]) -> list[bytes]:
    scrub = key_bytes.stream()
    return [*(scrub.feed(piece) for piece in pieces), scrub.end()]


def test_a_key_split_at_any_point_never_goes_out(key_bytes: KeyBytes) -> None:
    """Two and three pieces, cut at every pair of points: the joined output is the whole body
    scrubbed, byte for byte as long, and no piece holds the key or a base64 form of it."""
    body = body_with_key()
    whole = key_bytes.whole(body)
    assert KEY.encode() not in whole and len(whole) == len(body)
    for cut in range(len(body) + 1):
        out = scrubbed(key_bytes, [body[:cut], body[cut:]])
        assert b"".join(out) == whole
    for first in range(0, len(body), 7):
        for second in range(first, len(body) + 1, 5):
            out = scrubbed(key_bytes, [body[:first], body[first:second], body[second:]])
            assert b"".join(out) == whole, (first, second)
    for form in Scrubber(SecretStr(KEY)).forms:
        assert form.encode() not in whole


def test_only_what_may_start_the_key_is_held_back(key_bytes: KeyBytes) -> None:
    """An event ending in a newline goes out whole at once; a piece ending on the key's first
    bytes holds only those; a stream ending on eight or more of them does not send them."""
    scrub = key_bytes.stream()
    event = b'data: {"text": "sk"}\n\n'
    assert scrub.feed(event) == event
    assert scrub.feed(b"data: s") == b"data: "
    assert scrub.feed(b"x\n\n") == b"sx\n\n"
    assert scrub.feed(b"tail " + KEY[:12].encode()) == b"tail "
    assert scrub.end() == b"<redacted>**"
    assert scrub.feed(b"sk-") == b"" and scrub.end() == b"sk-"


def test_one_byte_pieces(key_bytes: KeyBytes) -> None:
    """A body that arrives a byte at a time is scrubbed the same, and never more than the
    longest form less one byte is held back at once."""
    body = body_with_key()
    out = scrubbed(key_bytes, [body[i : i + 1] for i in range(len(body))])
    assert b"".join(out) == key_bytes.whole(body)
    sent = 0
    for fed, piece in enumerate(out[:-1], start=1):
        sent += len(piece)
        assert fed - sent < key_bytes.longest
    assert out[0] == b"d"
