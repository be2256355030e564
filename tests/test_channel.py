"""The API channel against a real HTTP server on 127.0.0.1 (taogpud/testing/fake_provider.py).

Never the internet: every URL here is loopback, a closed loopback port, or a name under
`.invalid` (RFC 6761: it never resolves). The key is random per run and is compared only
inside the server; the tests assert it is absent from every result, log event and repr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from taogpud import config
from taogpud.provider.channel import (
    Backoff,
    Channel,
    ChannelSettings,
    ModelRole,
    PingResult,
    Scrubber,
    endpoint,
    key_advice,
    key_sources_tried,
    public_url,
)
from taogpud.testing.fake_provider import (
    OK,
    FakeProvider,
    Reply,
    closed_port,
    completion,
    fake_provider,
)

KEY = f"sk-taogpud-test-{secrets.token_hex(12)}"
FAST = Backoff(base_s=0.01, cap_s=0.05)
MODELS = {"default": "claude-sonnet", "coding": "claude-coder", "reasoning": "claude-opus"}


def settings_for(
    base_url: str,
    key: str | None = KEY,
    *,
    retries: int = 0,
    timeout_s: float = 5.0,
    tried: tuple[str, ...] = (),
) -> ChannelSettings:
    return ChannelSettings(
        base_url=base_url,
        api_key=None if key is None else SecretStr(key),
        key_source="none" if key is None else "env",
        timeout_s=timeout_s,
        max_retries=retries,
        models=MODELS,
        key_sources_tried=tried,
    )


def ping(
    settings: ChannelSettings, role: ModelRole = "default", deadline_s: float | None = None
) -> PingResult:
    async def go() -> PingResult:
        async with Channel(settings, backoff=FAST, trust_env=False) as channel:
            return await channel.ping(role, deadline_s=deadline_s)

    return asyncio.run(go())


def channel_repr(settings: ChannelSettings) -> str:
    async def go() -> str:
        async with Channel(settings, trust_env=False) as channel:
            return repr(channel)

    return asyncio.run(go())


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with fake_provider(KEY) as server:
        yield server


def assert_no_key(*texts: Any) -> None:
    for text in texts:
        assert KEY not in str(text)


# --- answers --------------------------------------------------------------------------


def test_ok_answer_is_the_guides_request_with_the_key(provider: FakeProvider) -> None:
    """200 → ok with latency and model; the server got the guide's request and Bearer key."""
    result = ping(settings_for(provider.base_url))
    assert result.ok and result.status == "ok"
    assert result.attempts == 1 and result.http_status == 200
    assert result.latency_ms is not None and result.latency_ms > 0
    assert result.model == "claude-sonnet" and result.answered_model == "claude-sonnet"
    assert result.url == f"{provider.base_url}/v1/chat/completions"
    (seen,) = provider.seen
    assert seen.path == "/api/v1/chat/completions"
    assert seen.auth_matches
    assert seen.body == {
        "model": "claude-sonnet",
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 16,
    }
    assert_no_key(result.model_dump_json())


@pytest.mark.parametrize(
    ("role", "model"), [("coding", "claude-coder"), ("reasoning", "claude-opus")]
)
def test_role_picks_the_model(provider: FakeProvider, role: ModelRole, model: str) -> None:
    """--model coding|reasoning sends models.<role>."""
    result = ping(settings_for(provider.base_url), role)
    assert result.ok and result.model == model and result.role == role
    assert provider.seen[0].body["model"] == model


@pytest.mark.parametrize("status", [401, 403])
def test_refused_key_is_rejected_key_and_not_retried(provider: FakeProvider, status: int) -> None:
    """401/403 with a key → rejected_key, one attempt, the server's echo of the key redacted."""
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}"}}
    provider.default = Reply(status, echo)
    result = ping(settings_for(provider.base_url, retries=3))
    assert not result.ok and result.status == "rejected_key"
    assert result.attempts == 1 and result.http_status == status
    assert "Incorrect API key provided: <redacted>" in result.detail
    assert_no_key(result.model_dump_json())


def test_wrong_key_echoed_by_the_server_never_shows() -> None:
    """A server echoing the whole Authorization header: rejected_key, <redacted> in its place."""
    with fake_provider("another-key-entirely") as server:
        server.require_auth = True
        result = ping(settings_for(server.base_url))
    assert result.status == "rejected_key"
    assert "<redacted>" in result.detail
    assert_no_key(result.model_dump_json())


def test_no_key_lists_the_sources_tried(tmp_path: Path) -> None:
    """No key: nothing sent as Authorization; the 401 is no_key naming the three sources."""
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps({"gpu": {"backend": "cpu"}}))
    config_file = tmp_path / "config.toml"
    config_file.write_text('[runtime]\ndevice_type = "cpu"\n[backend.cuda]\nenabled = false\n')
    snapshot = config.load(settings_file, config_file, environ={})
    tried = key_sources_tried(snapshot, {})
    with fake_provider(KEY) as server:
        server.require_auth = True
        result = ping(settings_for(server.base_url, key=None, tried=tried))
        assert not server.seen  # nothing sent without a key
    assert result.status == "no_key" and result.key_source == "none"
    assert "taotoken_api_key" in result.detail and "$CREDENTIALS_DIRECTORY" in result.detail
    assert "TAOTOKEN_API_KEY (not set in the daemon's environment)" in result.detail
    assert f"provider.apiKey in {settings_file}" in result.detail
    assert "TAOTOKEN_API_KEY=" in result.hint  # here the tests' shell: no systemd


def test_credential_directory_is_named_when_set(tmp_path: Path) -> None:
    """With $CREDENTIALS_DIRECTORY set, the path looked at is named."""
    snapshot = config.load(None, None, environ={"XDG_CONFIG_HOME": str(tmp_path)})
    tried = key_sources_tried(snapshot, {"CREDENTIALS_DIRECTORY": "/run/credentials/x"})
    assert tried[0].startswith("the systemd credential /run/credentials/x/taotoken_api_key")
    assert "the embedded defaults" in tried[2]


def test_no_key_is_said_and_nothing_is_sent(provider: FakeProvider) -> None:
    """No key: the ping says so (no_key, not ok) and sends nothing, even to a server that
    would answer without one (it said "ok", hiding that the daemon holds no key); the advice
    names the way for a local server that needs none."""
    result = ping(settings_for(provider.base_url, key=None))
    assert not result.ok and result.status == "no_key" and result.attempts == 0
    assert "the daemon has no API key" in result.detail
    assert not provider.seen
    assert '"none"' in result.hint  # a keyless local server: any text as provider.apiKey


def test_the_missing_key_advice_fits_how_the_daemon_was_started() -> None:
    """Under systemd (INVOCATION_ID, or a credentials folder) the advice is the credential;
    started in a terminal, the env var, exported in the shell that starts taogpud (it said
    LoadCredential= to someone who had typed `taogpud`)."""
    under_systemd = key_advice({"INVOCATION_ID": "5d1c"}, "TAOTOKEN_API_KEY")
    assert "LoadCredential=taotoken_api_key" in under_systemd
    in_a_terminal = key_advice({"TERM": "xterm"}, "TAOTOKEN_API_KEY")
    assert "export TAOTOKEN_API_KEY=" in in_a_terminal and "restart taogpud" in in_a_terminal
    assert "LoadCredential" not in in_a_terminal


# --- retries --------------------------------------------------------------------------


def test_429_honours_retry_after_then_ok(provider: FakeProvider) -> None:
    """429 with Retry-After: 1, then ok → ok on attempt 2, after waiting at least 1 s."""
    provider.script = [Reply(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"}), OK]
    result = ping(settings_for(provider.base_url, retries=3))
    assert result.ok and result.attempts == 2
    assert result.elapsed_ms >= 1000
    assert len(provider.seen) == 2


def test_429_asking_too_long_ends_the_ping(provider: FakeProvider) -> None:
    """A Retry-After beyond a minute is not waited out: http_error saying so."""
    provider.default = Reply(429, {"error": {"message": "quota"}}, {"Retry-After": "3600"})
    result = ping(settings_for(provider.base_url, retries=3))
    assert result.status == "http_error" and result.http_status == 429
    assert result.attempts == 1 and "retry after 3600 s" in result.detail


def test_500_then_ok(provider: FakeProvider) -> None:
    """500 then ok → ok, two attempts."""
    provider.script = [Reply(500, b"internal error"), OK]
    result = ping(settings_for(provider.base_url, retries=2))
    assert result.ok and result.attempts == 2


def test_500_forever_is_http_error_after_max_retries(provider: FakeProvider) -> None:
    """500 every time → http_error after maxRetries + 1 attempts."""
    provider.default = Reply(500, {"error": {"message": "boom"}})
    result = ping(settings_for(provider.base_url, retries=2))
    assert result.status == "http_error" and result.http_status == 500
    assert result.attempts == 3 and len(provider.seen) == 3
    assert "after 3 attempts" in result.detail and "boom" in result.detail


def test_read_timeout_is_timeout_after_retries(provider: FakeProvider) -> None:
    """A server that answers after 2 s, a 0.3 s deadline, 1 retry → timeout, 2 attempts (the
    answer would have been a 200: the timeout is the deadline's, no wall-clock bound needed)."""
    provider.default = Reply(delay_s=2.0)
    result = ping(settings_for(provider.base_url, retries=1, timeout_s=0.3))
    assert result.status == "timeout" and result.attempts == 2
    assert "within 0.3 s" in result.detail


def test_deadline_caps_the_whole_ping(provider: FakeProvider) -> None:
    """deadline_s bounds retries too: 5 retries of 0.3 s each stop at a 0.5 s deadline."""
    provider.default = Reply(delay_s=2.0)
    result = ping(settings_for(provider.base_url, retries=5, timeout_s=0.3), deadline_s=0.5)
    assert result.status == "timeout" and result.attempts <= 2


# --- the network and the URL --------------------------------------------------------------


def test_closed_port_is_refused_after_retries() -> None:
    """Nothing listening → refused, retried maxRetries times."""
    result = ping(settings_for(f"http://127.0.0.1:{closed_port()}/api", retries=2))
    assert result.status == "refused" and result.attempts == 3
    assert "refused" in result.detail and result.hint


def test_unresolvable_name_is_dns() -> None:
    """A name under .invalid → dns, naming the host."""
    result = ping(settings_for("http://taogpud-test.invalid/api", retries=1))
    assert result.status == "dns"
    assert "taogpud-test.invalid does not resolve" in result.detail
    assert result.attempts <= 2


def test_the_proxy_variables_apply(provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """http_proxy is honoured, no_proxy too: the proxy gets the absolute URL of a provider no
    DNS knows and its answer is the ping's; a host no_proxy names is reached directly."""
    proxy = f"http://127.0.0.1:{provider.port}"
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    async def go(base_url: str) -> PingResult:
        async with Channel(settings_for(base_url), backoff=FAST) as channel:
            return await channel.ping()

    result = asyncio.run(go("http://provider.invalid/api"))
    assert result.ok and provider.seen[-1].path == "http://provider.invalid/api/v1/chat/completions"
    monkeypatch.setenv("no_proxy", "provider.invalid")
    result = asyncio.run(go("http://provider.invalid/api"))
    assert result.status == "dns" and len(provider.seen) == 1


def test_utm_params_are_refused_before_sending(provider: FakeProvider) -> None:
    """A base URL with utm_* → utm_params, nothing sent, the parameter named."""
    result = ping(settings_for(f"{provider.base_url}?utm_source=guide&x=1"))
    assert result.status == "utm_params" and result.attempts == 0
    assert "utm_source" in result.detail and "utm_source" in result.hint
    assert "utm_source" not in result.url
    assert provider.seen == []


@contextlib.contextmanager
def raw_server(answer: bytes) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that reads each request, writes `answer` (maybe nothing) and
    hangs up: what no HTTP server does. Yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join()
        listener.close()


@pytest.mark.parametrize("answer", [b"", b"NOT HTTP AT ALL\r\n\r\n"], ids=["hang-up", "not-http"])
def test_no_proper_answer_is_network_and_retried(answer: bytes) -> None:
    """A server that hangs up without answering, or answers something that is not HTTP:
    network, retried, saying so (the second was an unretried http_error once the ping left
    httpx)."""
    with raw_server(answer) as port:
        result = ping(settings_for(f"http://127.0.0.1:{port}/api", retries=1))
    assert result.status == "network" and result.attempts == 2
    assert "closed the connection without a proper answer" in result.detail
    assert_no_key(result.model_dump_json())


def test_tls_failure_is_network_and_not_retried(provider: FakeProvider) -> None:
    """https:// to a server that speaks plain HTTP: the TLS handshake fails, network, one
    attempt (a certificate does not get better by retrying), nothing reaches the server."""
    result = ping(settings_for(f"https://127.0.0.1:{provider.port}/api", retries=2))
    assert result.status == "network" and result.attempts == 1
    assert result.detail.startswith("TLS with 127.0.0.1") and "SSL_CERT_FILE" in result.hint
    assert provider.seen == []


def test_not_http_is_bad_url() -> None:
    """A base URL that is not http(s) → bad_url, nothing sent."""
    result = ping(settings_for("ftp://127.0.0.1/api"))
    assert result.status == "bad_url" and result.attempts == 0


def test_404_page_is_bad_url_and_a_doubled_v1_is_pointed_out(provider: FakeProvider) -> None:
    """A 404 that is not an API error object → bad_url; a base ending in /v1 gets that hint."""
    provider.default = Reply(404, b"<html>Not Found</html>")
    result = ping(settings_for(provider.base_url + "/v1"))
    assert result.status == "bad_url" and result.http_status == 404
    assert provider.seen[0].path == "/api/v1/v1/chat/completions"
    assert "drop the /v1" in result.hint


def test_redirect_is_bad_url_naming_where_to(provider: FakeProvider) -> None:
    """A 301 is not followed: bad_url, naming the target without its query."""
    provider.default = Reply(301, b"", {"Location": "https://example.invalid/api/v1?utm_x=1"})
    result = ping(settings_for(provider.base_url))
    assert result.status == "bad_url" and "https://example.invalid/api/v1" in result.detail
    assert "utm_x" not in result.detail


def test_404_from_the_api_is_http_error(provider: FakeProvider) -> None:
    """A 404 with an API error object (an unknown model) → http_error, the message shown."""
    provider.default = Reply(404, {"error": {"message": "model claude-sonnet does not exist"}})
    result = ping(settings_for(provider.base_url))
    assert result.status == "http_error" and "does not exist" in result.detail


@pytest.mark.parametrize(
    "body",
    [b"<html><body>a web page</body></html>", {"id": "x", "object": "list", "data": []}, b"[1,2]"],
)
def test_not_a_completion_is_bad_answer(provider: FakeProvider, body: Any) -> None:
    """200 with a non-JSON page, JSON without choices, or a JSON list → bad_answer."""
    provider.default = Reply(200, body)
    result = ping(settings_for(provider.base_url, retries=2))
    assert result.status == "bad_answer" and result.attempts == 1
    assert result.hint


def test_answered_model_is_reported(provider: FakeProvider) -> None:
    """The model the answer names is reported beside the one asked for."""
    provider.default = Reply(200, completion(model="claude-sonnet-4-5-20250929"))
    result = ping(settings_for(provider.base_url))
    assert result.ok and result.answered_model == "claude-sonnet-4-5-20250929"


# --- the key never shows --------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["\n", " x", "é"], ids=["newline", "space", "non-ascii"])
def test_key_no_header_can_carry_is_not_sent(provider: FakeProvider, suffix: str) -> None:
    """A key with a newline, space or non-ASCII char is not sent (h11 would echo it)."""
    bad_key = KEY + suffix
    result = ping(settings_for(provider.base_url, key=bad_key))
    assert result.status == "rejected_key" and result.attempts == 0
    assert provider.seen == []
    assert_no_key(result.model_dump_json())


def test_the_key_never_appears_in_results_logs_or_reprs(provider: FakeProvider) -> None:
    """Across ok, 401, 500, garbage, refused, timeout: no result, log event or repr has the key."""
    echo = f"auth was Bearer {KEY}".encode()
    provider.script = [OK, Reply(401, echo), Reply(500, echo), Reply(200, echo)]
    results: list[PingResult] = []
    settings = settings_for(provider.base_url)
    with capture_logs() as events:
        results += [ping(settings) for _ in range(4)]
        results.append(ping(settings_for(f"http://127.0.0.1:{closed_port()}/api")))
        provider.default = Reply(delay_s=1.0)
        results.append(ping(settings_for(provider.base_url, timeout_s=0.2)))
    statuses = [result.status for result in results]
    assert statuses == ["ok", "rejected_key", "http_error", "bad_answer", "refused", "timeout"]
    assert events and any(event["event"] == "channel.ping" for event in events)
    assert_no_key(*events, *[r.model_dump_json() for r in results], *results)
    assert_no_key(settings, repr(settings), channel_repr(settings))


def test_scrubber_catches_escaped_forms() -> None:
    """The key as a repr or a byte repr would escape it (h11, UnicodeEncodeError) is caught."""
    key = "sk-abc\ndef-é-123"
    scrub = Scrubber(SecretStr(key))
    for text in (key, repr(key), repr(key.encode())):
        scrubbed = scrub(f"header: {text}!")
        assert "<redacted>" in scrubbed and "abc" not in scrubbed and "123" not in scrubbed


# --- small pieces ------------------------------------------------------------------------------


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    """Retry n waits between half and all of min(cap, base·2ⁿ⁻¹)."""
    backoff, rng = Backoff(base_s=0.5, cap_s=4.0), random.Random(7)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        delays = [backoff.delay_s(retry, rng) for _ in range(50)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert len(set(delays)) > 1


def test_urls_shown_carry_no_credentials_or_query() -> None:
    """The endpoint keeps the base's path; what is shown drops user info and query."""
    assert endpoint("https://taotoken.net/api/") == "https://taotoken.net/api/v1/chat/completions"
    shown = public_url(f"https://user:{KEY}@example.invalid:8443/api?token={KEY}")
    assert shown == "https://example.invalid:8443/api"
