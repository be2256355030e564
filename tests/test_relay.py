"""The relay (issue 21) with the real clients: the official openai and anthropic SDKs, over
the loopback TCP listener and over the daemon's Unix socket, against
taogpud/testing/fake_provider.py.

The key is random per run and compared only inside the fake provider; every test asserts it
reached neither the client nor (daemon_home's check) any log.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import RELAY_KEY as KEY
from conftest import relay_shared_by_the_module, start_relay, token_of, unix_get

from taogpud.testing import RunningDaemon, wait_until
from taogpud.testing.fake_provider import (
    FakeProvider,
    Reply,
    anthropic_message,
    anthropic_stream,
    closed_port,
    openai_stream,
)

_CLIENTS: list[openai.OpenAI | anthropic.Anthropic] = []


# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("relay")


# The tests here that take `relayd` read only their own answers and trace lines: one relay and
# provider for them all; a test that needs settings of its own starts a relay.
provider, relayd = relay_shared_by_the_module()


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Every SDK client a test made is closed after it (their pools hold sockets)."""
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def kept(client: Any) -> Any:
    _CLIENTS.append(client)
    return client


def openai_tcp(daemon: RunningDaemon, **kwargs: Any) -> openai.OpenAI:
    token, base = token_of(daemon)
    return kept(openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0, **kwargs))


def openai_unix(daemon: RunningDaemon) -> openai.OpenAI:
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    return kept(
        openai.OpenAI(
            base_url="http://taogpud/relay/v1",
            api_key="ignored-on-the-unix-socket",
            http_client=httpx.Client(transport=transport),
            max_retries=0,
        )
    )


def anthropic_tcp(daemon: RunningDaemon) -> anthropic.Anthropic:
    token, base = token_of(daemon)
    return kept(anthropic.Anthropic(base_url=base, api_key=token, max_retries=0))


def relay_lines(daemon: RunningDaemon, at_least: int = 1) -> list[dict[str, Any]]:
    """The relay.request lines, once there are `at_least` (written just after each answer)."""
    deadline = time.monotonic() + 10
    while len(lines := daemon.events("relay.request")) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return lines


def assert_no_key(*texts: Any) -> None:
    for text in texts:
        assert KEY not in str(text)


def test_the_shared_relay_comes_to_each_test_as_new(
    relayd: RunningDaemon, provider: FakeProvider, module_relayd: RunningDaemon
) -> None:
    """What the tests that share this module's relay rely on (conftest's shared_relayd): no
    relay token held, the provider as new, and a trace that leaves out the lines before."""
    assert unix_get(relayd, "GET", "/v1/relay/status").json()["has_token"] is False
    assert (provider.seen, provider.script, provider.default) == ([], [], Reply())
    openai_unix(relayd).models.list()
    (line,) = relay_lines(relayd)  # this test's one request
    assert line["path"] == "/v1/models" and provider.seen[-1].auth_matches
    assert relayd.trace_from_now().events("relay.request") == []
    assert module_relayd.events("relay.request")[-1] == line


def test_openai_sdk_over_tcp_resolves_alias_and_sets_the_key(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """A chat completion through the TCP listener: the alias becomes the model, the provider
    gets the daemon's key as Bearer, and never the client's token."""
    token, base = token_of(relayd)
    client = kept(openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0))
    answer = client.chat.completions.create(
        model="coding", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.model == "claude-coder-9"
    seen = provider.seen[-1]
    assert seen.path == "/api/v1/chat/completions" and seen.auth_matches
    assert seen.body["model"] == "claude-coder-9"
    assert token not in json.dumps(seen.headers)
    assert_no_key(answer.model_dump_json())
    line = relay_lines(relayd)[-1]
    assert line["alias"] == "coding" and line["model"] == "claude-coder-9"
    assert line["status"] == 200 and line["via"] == "tcp" and line["tool"] == "openai-sdk"
    assert line["tokens"] == {"input": 1, "output": 1, "total": 2}
    assert line["key_source"] == "env" and line["channel"] == f"127.0.0.1:{provider.port}"


def test_openai_sdk_streams_over_the_unix_socket(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """A stream through /relay on the Unix socket arrives whole, usage read from its end."""
    provider.default = Reply(events=openai_stream("claude-sonnet-4", words=4))
    client = openai_unix(relayd)
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "w0 w1 w2 w3 "
    assert provider.seen[-1].body["model"] == "claude-sonnet-4"
    line = relay_lines(relayd)[-1]
    assert line["via"] == "unix" and line["uid"] is not None and line["stream"] is True
    assert line["tokens"] == {"input": 5, "output": 4, "total": 9}


def test_anthropic_sdk_messages_get_x_api_key(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """/v1/messages goes out with x-api-key (the anthropic family), streaming and not."""
    client = anthropic_tcp(relayd)
    provider.default = Reply(body=anthropic_message("claude-opus-4"))
    message = client.messages.create(
        model="reasoning", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].text == "pong"  # type: ignore[union-attr]
    assert provider.seen[-1].x_api_key_matches and not provider.seen[-1].has_auth
    provider.default = Reply(events=anthropic_stream("claude-opus-4"))
    with client.messages.stream(
        model="reasoning", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
    assert text == "w0 w1 w2 "
    line = relay_lines(relayd)[-1]
    assert line["tool"] == "anthropic-sdk" and line["alias"] == "reasoning"
    assert line["tokens"] == {"input": 7, "output": 3, "total": 10}


def test_models_and_other_paths_pass_through(relayd: RunningDaemon, provider: FakeProvider) -> None:
    """GET /v1/models and a path the relay does not know are forwarded as they are."""
    provider.default = Reply(body={"object": "list", "data": [{"id": "m1", "object": "model"}]})
    assert [m.id for m in openai_tcp(relayd).models.list()] == ["m1"]
    response = unix_get(relayd, "GET", "/relay/v1/some/other?x=1")
    assert response.status_code == 200
    assert provider.seen[-1].path == "/api/v1/some/other?x=1" and provider.seen[-1].auth_matches


def test_a_percent_encoded_path_goes_upstream_as_sent(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """`%20` and `%3A` reach the provider escaped, on both ways in (ASGI's path is decoded);
    `%2F` in the query too (in the path it is refused: tests/test_relay_paths.py)."""
    token, base = token_of(relayd)
    assert unix_get(relayd, "GET", "/relay/v1/models/a%20b%3Ac?q=%2F").status_code == 200
    assert provider.seen[-1].path == "/api/v1/models/a%20b%3Ac?q=%2F"
    response = httpx.get(base + "/v1/files/x%3Ay", headers={"x-api-key": token})
    assert response.status_code == 200 and provider.seen[-1].path == "/api/v1/files/x%3Ay"


def test_without_a_key_the_relay_forwards_nothing_and_says_why(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """A daemon that holds no key (its env var empty) answers a relayed request itself: 503
    no_key saying so and how to give it one (in a terminal: the env var), and nothing goes
    upstream (it forwarded the request keyless and passed on the provider's 401)."""
    daemon = start_relay(daemon_factory, provider.base_url, env={"TAOTOKEN_API_KEY": ""})
    response = unix_get(daemon, "GET", "/relay/v1/models")
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["code"] == "no_key" and "the daemon has no API key" in body["message"]
    assert "TAOTOKEN_API_KEY" in body["hint"]
    assert not provider.seen


def test_relay_errors_are_the_one_shape_and_provider_errors_pass_as_they_are(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """The relay's own errors are {code, message, hint} with X-Taogpud-Error naming the code;
    a provider's error reaches the client byte for byte (the SDKs parse its shape)."""
    token, base = token_of(relayd)
    refused = [
        httpx.get(base + "/v1/models"),
        httpx.get(base + "/v1/models", headers={"x-api-key": token, "host": "evil.example"}),
    ]
    for response in refused:
        assert set(response.json()) == {"code", "message", "hint"}
        assert response.headers["x-taogpud-error"] == response.json()["code"]
    provider_error = {"error": {"message": "bad model", "type": "invalid_request_error"}}
    provider.default = Reply(400, provider_error)
    response = httpx.get(base + "/v1/models", headers={"x-api-key": token})
    assert response.status_code == 400 and response.content == json.dumps(provider_error).encode()
    assert "x-taogpud-error" not in response.headers


def test_the_proxy_variables_apply_upstream(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """http_proxy is honoured (as httpx's trust_env did): the proxy gets the absolute URL of
    a provider that no DNS knows, and its answer comes back."""
    proxy = f"http://127.0.0.1:{provider.port}"
    env = {"http_proxy": proxy, "HTTP_PROXY": proxy, "no_proxy": "", "NO_PROXY": ""}
    daemon = start_relay(daemon_factory, "http://provider.invalid/api", env=env)
    response = unix_get(daemon, "GET", "/relay/v1/models")
    assert response.status_code == 200
    assert provider.seen[-1].path == "http://provider.invalid/api/v1/models"
    assert provider.seen[-1].auth_matches


def test_tcp_without_a_valid_token_is_refused_and_not_forwarded(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """No token, a wrong one, the real key itself: 401 with a hint; nothing reaches upstream."""
    _, base = token_of(relayd)
    for key in ("", "tgr_not-a-real-token", KEY):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        response = httpx.get(base + "/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json()["code"] == "relay_token_required"
        assert "taogpuctl relay token" in response.json()["hint"]
    assert provider.seen == []
    with pytest.raises(openai.AuthenticationError):
        kept(openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0)).models.list()


def test_a_revoked_or_replaced_token_stops_working(relayd: RunningDaemon) -> None:
    """A new token replaces the old; a revoked one is refused."""
    old, base = token_of(relayd)
    new, _ = token_of(relayd)
    models = base + "/v1/models"
    assert httpx.get(models, headers={"authorization": f"Bearer {old}"}).status_code == 401
    assert httpx.get(models, headers={"x-api-key": new}).status_code == 200
    assert unix_get(relayd, "DELETE", "/v1/relay/token").json()["revoked"] is True
    assert httpx.get(models, headers={"x-api-key": new}).status_code == 401
    stored = (relayd.state_dir / "relay-tokens.json").read_text()
    assert new not in stored and old not in stored
    assert (relayd.state_dir / "relay-tokens.json").stat().st_mode & 0o777 == 0o600


def test_a_foreign_host_header_is_refused_and_no_cors(relayd: RunningDaemon) -> None:
    """DNS rebinding: a Host that is not the listener's own gets 421; no CORS header ever."""
    token, base = token_of(relayd)
    auth = {"authorization": f"Bearer {token}"}
    bad = httpx.get(base + "/v1/models", headers={**auth, "host": "evil.example:80"})
    assert bad.status_code == 421 and bad.json()["code"] == "wrong_host"
    good = httpx.get(base + "/v1/models", headers={**auth, "origin": "http://evil.example"})
    assert good.status_code == 200
    assert not [name for name in good.headers if name.lower().startswith("access-control")]


def test_a_key_the_provider_echoes_never_reaches_the_client(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """A 401 that repeats the credentials it got is forwarded with the key scrubbed."""
    provider.default = Reply(echo_auth=True)
    with pytest.raises(openai.AuthenticationError) as caught:
        openai_tcp(relayd).models.list()
    assert_no_key(caught.value, caught.value.response.text)
    assert "<redacted>" in caught.value.response.text


def test_429_and_5xx_are_retried_before_any_byte(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """maxRetries (2) covers a 429 with Retry-After and a 503; the third answer goes through."""
    provider.script = [Reply(429, {"error": "slow"}, {"Retry-After": "0"}), Reply(503, b"{}")]
    client = openai_tcp(relayd)
    client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    assert len(provider.seen) == 3
    assert relay_lines(relayd, 1)[-1]["attempts"] == 3
    provider.script = [Reply(500, {"error": {"message": "boom"}}, {"Retry-After": "0"})] * 3
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    last = relay_lines(relayd, 2)[-1]
    assert last["status"] == 500 and last["attempts"] == 3


def test_an_unreachable_provider_is_a_502_after_the_retries(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """Connect failures are retried, then answered in the one error shape."""
    daemon = start_relay(daemon_factory, f"http://127.0.0.1:{closed_port()}/api")
    response = unix_get(daemon, "GET", "/relay/v1/models")
    assert response.status_code == 502 and response.json()["code"] == "upstream_unreachable"
    assert relay_lines(daemon)[-1]["attempts"] == 3


def test_a_slow_provider_hits_the_deadline(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """timeoutMs bounds the wait for the answer's head: 504, not retried. The provider would
    answer 200 after 2 s, so the 504 is the deadline's; one attempt is traced (no wall-clock
    bound: that is the bench's, not a test's on a shared host)."""
    daemon = start_relay(daemon_factory, provider.base_url, provider={"timeoutMs": 300})
    provider.default = Reply(delay_s=2.0)
    response = unix_get(daemon, "GET", "/relay/v1/models")
    assert response.status_code == 504 and response.json()["code"] == "upstream_timeout"
    assert relay_lines(daemon)[-1]["attempts"] == 1


def test_a_client_hanging_up_mid_stream_cancels_upstream(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """The client reads two events and closes: the provider's stream is cut, not finished."""
    provider.default = Reply(events=openai_stream("m", words=200), event_delay_s=0.02)
    token, base = token_of(relayd)
    with httpx.Client() as client:
        request = client.build_request(
            "POST",
            base + "/v1/chat/completions",
            json={"model": "default", "stream": True, "messages": []},
            headers={"authorization": f"Bearer {token}"},
        )
        response = client.send(request, stream=True)
        pieces = response.iter_raw()
        next(pieces), next(pieces)
        response.close()
    wait_until(lambda: bool(provider.stream_ends), "the provider's stream to end", 5, 0.05)
    assert provider.stream_ends == ["client_gone"]
    line = relayd.wait_for_event(lambda e: e.get("event") == "relay.request" and e["hung_up"])
    assert line["status"] == 200


def test_an_upstream_breaking_mid_stream_ends_with_an_error_event(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """Both SDKs raise on the error event the relay ends a broken stream with."""
    provider.default = Reply(events=openai_stream("m", words=5), break_after=3)
    stream = openai_tcp(relayd).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError, match="stream broke"):
        list(stream)
    provider.default = Reply(events=anthropic_stream("m", words=5), break_after=3)
    with (
        pytest.raises(anthropic.APIStatusError, match="stream broke"),
        anthropic_tcp(relayd).messages.stream(
            model="default", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        ) as astream,
    ):
        list(astream.text_stream)
    assert relay_lines(relayd)[-1]["code"] == "upstream_broken"


def test_per_minute_limit_answers_429_naming_it(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """[relay.limits] per_minute = 2: the third request gets 429 with Retry-After."""
    daemon = start_relay(daemon_factory, provider.base_url, {"limits": {"per_minute": 2}})
    codes = [unix_get(daemon, "GET", "/relay/v1/models") for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert "per_minute=2" in codes[2].json()["message"]
    assert 1 <= int(codes[2].headers["retry-after"]) <= 60
    assert len(provider.seen) == 2


def test_tokens_per_day_and_concurrent_limits(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """tokens_per_day counts the usage the provider reported; concurrent caps in-flight ones."""
    limits = {"tokens_per_day": 2, "concurrent": 1}
    daemon = start_relay(daemon_factory, provider.base_url, {"limits": limits})
    client = openai_unix(daemon)
    client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.RateLimitError, match="tokens_per_day=2"):
        client.chat.completions.create(model="default", messages=[])
    status = unix_get(daemon, "GET", "/v1/relay/status").json()
    served = [row for row in status["use"] if row["status"] == 200]
    assert served == [
        {"uid": served[0]["uid"], "model": "claude-sonnet-4", "status": 200, "requests": 1}
        | {"input_tokens": 1, "output_tokens": 1}
    ]
    metrics = unix_get(daemon, "GET", "/metrics").text
    assert 'taogpud_relay_requests_total{model="claude-sonnet-4",status="200"' in metrics


def test_concurrent_limit(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """concurrent = 1: a second request while a stream is in flight gets 429."""
    daemon = start_relay(daemon_factory, provider.base_url, {"limits": {"concurrent": 1}})
    provider.default = Reply(events=openai_stream("m", words=20), event_delay_s=0.05)
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with (
        httpx.Client(transport=transport, base_url="http://t") as first,
        first.stream("POST", "/relay/v1/chat/completions", json={"stream": True}) as streaming,
    ):
        pieces = streaming.iter_raw()  # kept: a generator dropped closes the response
        next(pieces)
        second = unix_get(daemon, "GET", "/relay/v1/models")
    assert second.status_code == 429 and "concurrent=1" in second.json()["message"]


def test_relay_off_by_default(daemon: RunningDaemon) -> None:
    """Without [relay] enabled the pass-through answers 404 relay_disabled and binds no port."""
    response = unix_get(daemon, "GET", "/relay/v1/models")
    assert response.status_code == 404 and response.json()["code"] == "relay_disabled"
    assert unix_get(daemon, "GET", "/v1/relay/status").json()["listen"] is None


def test_listen_off_loopback_is_refused_at_load(tmp_path: Any) -> None:
    """[relay] listen = "0.0.0.0:8742" is a config error naming the key and the fix."""
    from taogpud import config
    from taogpud.errors import ConfigError

    path = tmp_path / "config.toml"
    path.write_text('[relay]\nlisten = "0.0.0.0:8742"\n')
    with pytest.raises(ConfigError) as caught:
        config.load(None, path, environ={})
    text = str(caught.value)
    assert "relay.listen" in text and "loopback" in text and "127.0.0.1:8742" in text


def test_tcp_listener_port_is_really_loopback(relayd: RunningDaemon) -> None:
    """The listener is bound to 127.0.0.1 only."""
    _, base = token_of(relayd)
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def ctl(daemon: RunningDaemon, home: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """taogpuctl against the daemon, its relay token kept under `home`."""
    return daemon.ctl(*args, env={"XDG_CONFIG_HOME": str(home)}, timeout_s=60)


SONNET = "claude-sonnet-4"  # what the alias `default` stands for


def sonnet_served(status: dict[str, Any]) -> int:
    """The requests for SONNET answered 200 that `relay status` counts, by anyone."""
    rows = status["use"]
    return sum(row["requests"] for row in rows if (row["model"], row["status"]) == (SONNET, 200))


@pytest.mark.slow
def test_taogpuctl_relay_token_env_status_and_doctor(
    relayd: RunningDaemon, provider: FakeProvider, tmp_path: Any
) -> None:
    """`relay token` keeps the token 0600; `relay env` prints lines an SDK works with;
    `relay status` shows the use; `doctor` passes the relay check end to end."""
    before = sonnet_served(unix_get(relayd, "GET", "/v1/relay/status").json())  # shared relay
    saved = ctl(relayd, tmp_path, "relay", "token")
    assert saved.returncode == 0, saved.stderr
    (path,) = (tmp_path / "taogpud").glob("relay-token@*")
    assert path.stat().st_mode & 0o777 == 0o600
    lines = ctl(relayd, tmp_path, "relay", "env", "--tool", "openai").stdout.splitlines()
    env = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert env["OPENAI_API_KEY"] == path.read_text().strip()
    client = kept(openai.OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"]))
    client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    claw = ctl(relayd, tmp_path, "relay", "env", "--tool", "openclaw").stdout
    entry = json.loads(claw.split("\n", 1)[1])["models"]["providers"]["taogpud"]
    assert entry["api"] == "openai-completions" and entry["apiKey"] == env["OPENAI_API_KEY"]
    status = json.loads(ctl(relayd, tmp_path, "relay", "status", "--json").stdout)
    assert status["enabled"] and sonnet_served(status) == before + 1
    doctor = json.loads(ctl(relayd, tmp_path, "doctor", "--json").stdout)
    relay_check = next(c for c in doctor["checks"] if c["name"] == "relay")
    assert relay_check["status"] == "pass", relay_check
    assert ctl(relayd, tmp_path, "relay", "token", "--revoke").returncode == 0
    assert not path.exists()
    assert_no_key(saved.stdout, saved.stderr, lines, claw, status, doctor)
