"""The relay as each AI tool uses it (issue 38): the recipes `taogpuctl relay env --tool X`
prints, followed as printed, and the headers and paths those tools send, passed through.

The clients are the official openai and anthropic SDKs, set up from nothing but what
`relay env` printed; the provider is taogpud/testing/fake_provider.py on 127.0.0.1.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import MODELS, relay_shared_by_the_module, start_relay, token_of, unix_get
from prometheus_client.parser import text_string_to_metric_families
from test_relay import _CLIENTS, anthropic_tcp, assert_no_key, kept, relay_lines

from taogpud.testing import RunningDaemon, wait_until
from taogpud.testing.fake_provider import (
    FakeProvider,
    Reply,
    anthropic_message,
    openai_stream,
    responses_stream,
)


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


# Its tests run on one worker (--dist loadgroup), so that its shared relay starts once.
pytestmark = pytest.mark.xdist_group("relay_tools")


# The tests here that take `relayd` read only their own answers and trace lines: one relay and
# provider for them all; a test that needs settings of its own starts a relay.
provider, relayd = relay_shared_by_the_module()


def ctl(daemon: RunningDaemon, home: Path, *args: str) -> Any:
    """taogpuctl against `daemon`, as a user whose config (and relay token) lives in `home`."""
    env = {"XDG_CONFIG_HOME": str(home / "config"), "HOME": str(home)}
    return daemon.ctl(*args, env=env, timeout_s=60)


def env_of(lines: str) -> dict[str, str]:
    """The `export NAME=VALUE` lines of a recipe."""
    exports = [line.removeprefix("export ") for line in lines.splitlines()]
    return dict(line.split("=", 1) for line in exports if "=" in line and line[0] != "#")


# ---- the TCP listener takes the token from either header -----------------------------------


def test_claude_code_with_anthropic_api_key_also_set(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """Claude Code with ANTHROPIC_AUTH_TOKEN (the relay token) and a stray ANTHROPIC_API_KEY
    sends both x-api-key and Authorization: the valid relay token wins, whichever it is in."""
    token, base = token_of(relayd)
    provider.default = Reply(body=anthropic_message("claude-opus-4"))
    client = kept(
        anthropic.Anthropic(
            base_url=base,
            api_key="sk-ant-users-own",
            default_headers={"authorization": f"Bearer {token}"},
            max_retries=0,
        )
    )
    message = client.messages.create(
        model="reasoning", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].text == "pong"  # type: ignore[union-attr]
    assert provider.seen[-1].x_api_key_matches and not provider.seen[-1].has_auth
    swapped = {"x-api-key": token, "authorization": "Bearer sk-ant-users-own"}
    assert httpx.get(base + "/v1/models", headers=swapped).status_code == 200


# ---- pass-through: every path, every header, the key where the family expects it ----------


def test_anthropic_style_requests_get_x_api_key_on_every_path(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """The anthropic SDK's models.list() and count_tokens carry anthropic-version: upstream they
    get x-api-key (Anthropic refuses a Bearer key), not only /v1/messages does."""
    client = anthropic_tcp(relayd)
    listed = {"data": [{"id": "claude-x", "type": "model"}], "has_more": False}
    provider.default = Reply(body=listed)
    assert [model.id for model in client.models.list()] == ["claude-x"]
    seen = provider.seen[-1]
    assert seen.path.startswith("/api/v1/models") and seen.x_api_key_matches
    assert not seen.has_auth
    provider.default = Reply(body={"input_tokens": 12})
    counted = client.messages.count_tokens(
        model="coding", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens == 12
    seen = provider.seen[-1]
    assert seen.path == "/api/v1/messages/count_tokens" and seen.x_api_key_matches
    assert seen.body["model"] == MODELS["coding"]


def test_provider_headers_and_paths_pass_unchanged(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """anthropic-beta, anthropic-version, OpenAI-Beta, Idempotency-Key and any x- header reach
    the provider as sent; /v1/responses/compact passes like any path, query and all."""
    token, base = token_of(relayd)
    sent = {
        "anthropic-beta": "context-1m-2025-08-07,interleaved-thinking-2025-05-14",
        "anthropic-version": "2023-06-01",
        "openai-beta": "responses=experimental",
        "idempotency-key": "idem-123",
        "x-stainless-retry-count": "0",
        "authorization": f"Bearer {token}",
    }
    response = httpx.post(
        base + "/v1/responses/compact?beta=true", headers=sent, json={"model": "default"}
    )
    assert response.status_code == 200
    seen = provider.seen[-1]
    assert seen.path == "/api/v1/responses/compact?beta=true"
    for name in ("anthropic-beta", "anthropic-version", "openai-beta", "idempotency-key"):
        assert seen.headers[name] == sent[name]
    assert seen.headers["x-stainless-retry-count"] == "0"
    assert seen.x_api_key_matches and not seen.has_auth  # anthropic-version: that family's
    assert token not in json.dumps(seen.headers)
    assert seen.body == {"model": MODELS["default"]}  # the alias: the one rewrite


# ---- the recipes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_codex_recipe_is_a_custom_provider_that_works(
    relayd: RunningDaemon, provider: FakeProvider, tmp_path: Path
) -> None:
    """`relay env --tool codex` prints Codex's config.toml provider (wire_api = "responses",
    env_key naming a variable) and the export of that variable; no OPENAI_BASE_URL."""
    out = ctl(relayd, tmp_path, "relay", "env", "--tool", "codex")
    assert out.returncode == 0, out.stderr
    toml_part, _, shell_part = out.stdout.partition("# and in the shell")
    config = tomllib.loads(toml_part)
    name = config["model_provider"]
    block = config["model_providers"][name]
    assert block["wire_api"] == "responses" and config["model"] in MODELS
    assert "OPENAI_BASE_URL" not in out.stdout
    exported = env_of(shell_part)
    token = exported[block["env_key"]]
    client = kept(openai.OpenAI(base_url=block["base_url"], api_key=token, max_retries=0))
    provider.default = Reply(body={"id": "resp_1", "object": "response", "output": []})
    client.responses.create(model=config["model"], input="hi")
    seen = provider.seen[-1]
    assert seen.path == "/api/v1/responses" and seen.auth_matches
    assert seen.body["model"] == MODELS[config["model"]]


@pytest.mark.slow
def test_codex_write_merges_into_its_config_with_a_backup(
    relayd: RunningDaemon, tmp_path: Path
) -> None:
    """--write merges the provider into $CODEX_HOME/config.toml, keeps the user's other keys
    and comments, leaves config.toml.bak, and prints only the export."""
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    before = '# mine\napproval_policy = "never"\n\n[mcp_servers.x]\ncommand = "y"\n'
    (codex_home / "config.toml").write_text(before)
    env = {
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "HOME": str(tmp_path),
        "CODEX_HOME": str(codex_home),
    }
    out = relayd.ctl("relay", "env", "--tool", "codex", "--write", env=env, timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert (codex_home / "config.toml.bak").read_text() == before
    written = (codex_home / "config.toml").read_text()
    assert "# mine" in written
    config = tomllib.loads(written)
    assert config["approval_policy"] == "never" and config["mcp_servers"]["x"]["command"] == "y"
    block = config["model_providers"][config["model_provider"]]
    assert list(env_of(out.stdout)) == [block["env_key"]]
    assert env_of(out.stdout)[block["env_key"]] not in written  # the token stays out of it
    again = relayd.ctl("relay", "env", "--tool", "codex", "--write", env=env, timeout_s=60)
    assert again.returncode == 0 and tomllib.loads((codex_home / "config.toml").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tool", "api"),
    [("openclaw", "openai-completions"), ("openclaw-anthropic", "anthropic-messages")],
)
def test_openclaw_recipe_lists_the_aliases_as_models(
    relayd: RunningDaemon, provider: FakeProvider, tmp_path: Path, tool: str, api: str
) -> None:
    """OpenClaw refuses a custom provider without `models`: the entry lists settings.json's
    aliases, and its baseUrl and apiKey work with that API's SDK."""
    out = ctl(relayd, tmp_path, "relay", "env", "--tool", tool)
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout.split("\n", 1)[1])
    entry = document["models"]["providers"]["taogpud"]
    assert entry["api"] == api
    assert [model["id"] for model in entry["models"]] == list(MODELS)
    for model in entry["models"]:
        assert model["input"] == ["text"] and model["contextWindow"] > model["maxTokens"] > 0
    if api == "anthropic-messages":
        provider.default = Reply(body=anthropic_message("m"))
        client = kept(anthropic.Anthropic(base_url=entry["baseUrl"], api_key=entry["apiKey"]))
        client.messages.create(model="coding", max_tokens=8, messages=[])
        assert provider.seen[-1].x_api_key_matches
    else:
        sdk = kept(openai.OpenAI(base_url=entry["baseUrl"], api_key=entry["apiKey"]))
        sdk.chat.completions.create(model="coding", messages=[])
        assert provider.seen[-1].auth_matches
    assert provider.seen[-1].body["model"] == MODELS["coding"]


@pytest.mark.slow
def test_openclaw_write_merges_into_openclaw_json(relayd: RunningDaemon, tmp_path: Path) -> None:
    """--write merges the provider into ~/.openclaw/openclaw.json beside what is there."""
    config = tmp_path / ".openclaw" / "openclaw.json"
    config.parent.mkdir()
    before = {"agents": {"defaults": {"workspace": "w"}}, "models": {"providers": {"x": {}}}}
    config.write_text(json.dumps(before))
    out = ctl(relayd, tmp_path, "relay", "env", "--tool", "openclaw", "--write")
    assert out.returncode == 0, out.stderr
    after = json.loads(config.read_text())
    assert after["agents"] == before["agents"] and "x" in after["models"]["providers"]
    assert after["models"]["providers"]["taogpud"]["api"] == "openai-completions"
    assert json.loads(config.with_name("openclaw.json.bak").read_text()) == before
    assert config.stat().st_mode & 0o777 == 0o600  # it holds the token


@pytest.mark.slow
def test_generic_and_sdk_recipes_work_as_printed(
    relayd: RunningDaemon, provider: FakeProvider, tmp_path: Path
) -> None:
    """openai, anthropic, claude-code and the generic OpenAI-compatible recipe: each client
    made from nothing but the printed variables completes a request."""
    generic = env_of(ctl(relayd, tmp_path, "relay", "env", "--tool", "generic").stdout)
    assert generic["OPENAI_API_BASE"] == generic["OPENAI_BASE_URL"]
    kept(openai.OpenAI(base_url=generic["OPENAI_API_BASE"], api_key=generic["OPENAI_API_KEY"]))
    sdk = env_of(ctl(relayd, tmp_path, "relay", "env", "--tool", "openai").stdout)
    client = kept(openai.OpenAI(base_url=sdk["OPENAI_BASE_URL"], api_key=sdk["OPENAI_API_KEY"]))
    client.chat.completions.create(model="default", messages=[])
    assert provider.seen[-1].auth_matches
    claude = env_of(ctl(relayd, tmp_path, "relay", "env", "--tool", "claude-code").stdout)
    provider.default = Reply(body=anthropic_message("m"))
    cc = kept(
        anthropic.Anthropic(
            base_url=claude["ANTHROPIC_BASE_URL"], auth_token=claude["ANTHROPIC_AUTH_TOKEN"]
        )
    )
    cc.messages.create(model="default", max_tokens=8, messages=[])
    assert provider.seen[-1].x_api_key_matches
    tokens = {generic["OPENAI_API_KEY"], sdk["OPENAI_API_KEY"], claude["ANTHROPIC_AUTH_TOKEN"]}
    assert len(tokens) == 1


# ---- the token: never revoked behind the user's back, one file per daemon ------------------


@pytest.mark.slow
def test_relay_env_never_revokes_a_working_token(relayd: RunningDaemon, tmp_path: Path) -> None:
    """A token fetched under one HOME keeps working when `relay env` runs under another one
    that has no copy of it: env says how to get one instead of replacing it silently."""
    first = ctl(relayd, tmp_path / "a", "relay", "env", "--tool", "openai")
    assert first.returncode == 0, first.stderr
    token = env_of(first.stdout)["OPENAI_API_KEY"]
    base = env_of(first.stdout)["OPENAI_BASE_URL"]
    elsewhere = ctl(relayd, tmp_path / "b", "relay", "env", "--tool", "openai")
    assert elsewhere.returncode != 0
    assert "relay token" in elsewhere.stderr and "tgr_" not in elsewhere.stdout
    answer = httpx.get(base + "/models", headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    again = ctl(relayd, tmp_path / "a", "relay", "env", "--tool", "openai")
    assert env_of(again.stdout)["OPENAI_API_KEY"] == token


@pytest.mark.slow
def test_the_token_file_is_per_daemon(
    relayd: RunningDaemon, daemon_factory: Any, provider: FakeProvider, tmp_path: Path
) -> None:
    """Two daemons, one user: each daemon's token is kept apart, and env prints its own."""
    one = relayd
    two = start_relay(daemon_factory, provider.base_url)
    tokens = []
    for daemon in (one, two):
        out = ctl(daemon, tmp_path, "relay", "token", "--json")
        assert out.returncode == 0, out.stderr
        tokens.append(Path(json.loads(out.stdout)["path"]))
    assert tokens[0] != tokens[1] and tokens[0].exists() and tokens[1].exists()
    for daemon, path in zip((one, two), tokens, strict=True):
        printed = env_of(ctl(daemon, tmp_path, "relay", "env", "--tool", "openai").stdout)
        assert printed["OPENAI_API_KEY"] == path.read_text().strip()
        models = printed["OPENAI_BASE_URL"] + "/models"
        auth = {"authorization": f"Bearer {printed['OPENAI_API_KEY']}"}
        assert httpx.get(models, headers=auth).status_code == 200
    assert_no_key(*(path.read_text() for path in tokens))


# ---- usage in every shape, and the trace that tells the truth -------------------------------


def test_a_streamed_responses_turn_is_counted_and_limited(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """Codex's every call: a Responses stream whose usage is in response.completed (here
    100 KB long, past any line buffer of a few KiB). The trace, status and tokens_per_day see it."""
    daemon = start_relay(daemon_factory, provider.base_url, {"limits": {"tokens_per_day": 5}})
    provider.default = Reply(events=responses_stream("claude-coder-9", words=3, pad=100_000))
    token, base = token_of(daemon)
    client = kept(openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0))
    with client.responses.stream(model="coding", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text.startswith("w0 w1 w2 x")
    line = relay_lines(daemon)[-1]
    assert line["tokens"] == {"input": 11, "output": 3, "total": 14} and line["stream"]
    with pytest.raises(openai.RateLimitError, match="tokens_per_day=5"):
        client.responses.create(model="coding", input="again")
    with daemon.client() as control:
        status = control.relay_status()
    served = [row for row in status["use"] if row["status"] == 200]
    assert served[0]["input_tokens"] == 11 and served[0]["output_tokens"] == 3


def test_hung_up_only_when_the_client_left_before_the_end(
    relayd: RunningDaemon, provider: FakeProvider
) -> None:
    """A client that closes as soon as it has the stream's last event (data: [DONE]), before
    the provider's chunked end arrives, received it whole: hung_up false, its tokens counted."""
    provider.default = Reply(events=openai_stream("m", words=1), end_delay_s=0.5)
    token, base = token_of(relayd)
    with httpx.Client() as client:
        request = client.build_request(
            "POST",
            base + "/v1/chat/completions",
            json={"model": "default", "stream": True, "messages": []},
            headers={"authorization": f"Bearer {token}"},
        )
        response = client.send(request, stream=True)
        received = b""
        for piece in response.iter_raw():
            received += piece
            if b"data: [DONE]" in received:
                break
        response.close()
    line = relay_lines(relayd)[-1]
    assert line["hung_up"] is False and line["status"] == 200
    assert line["tokens"] == {"input": 5, "output": 1, "total": 6}


def refused_count(metrics: str) -> float:
    """taogpud_relay_requests_total of the 401s without a uid in a /metrics page (0 if none)."""
    counts = [
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "taogpud_relay_requests_total"
        and sample.labels == {"model": "-", "status": "401", "uid": ""}
    ]
    return sum(counts)


def test_no_none_label_in_the_metrics(relayd: RunningDaemon) -> None:
    """A refused TCP request has no uid: its metrics carry uid="", never uid="None"."""
    _, base = token_of(relayd)

    def metrics() -> str:
        return unix_get(relayd, "GET", "/metrics").text

    before = refused_count(metrics())  # the relay is shared: earlier tests' refusals
    assert httpx.get(base + "/v1/models").status_code == 401
    wait_until(lambda: refused_count(metrics()) > before, "the refusal counted in /metrics")
    page = metrics()
    assert "taogpud_relay_requests_total" in page and 'uid="None"' not in page
    assert 'status="401",uid=""' in page and refused_count(page) == before + 1


NAMED = [
    ("codex_cli_rs/0.171.0 (Debian 12; x86_64) xterm", "", "codex"),
    ("claude-cli/2.1.197 (external, cli)", "", "claude-code"),
    ("OpenAI/JS 5.23.0", "OpenClaw", "openclaw"),
    ("Anthropic/JS 0.69.0", "OpenClaw", "openclaw"),
    ("OpenAI/JS 5.23.0", "", "openai-sdk"),
    ("Anthropic/Python 0.69.0", "", "anthropic-sdk"),
    ("OpenAI/Python 2.8.0", "Aider", "aider"),
    ("Continue/1.2.3", "", "continue"),
    ("llm/0.36 (+https://llm.datasette.io/)", "", "llm"),
]


def test_the_trace_names_the_tool(relayd: RunningDaemon, provider: FakeProvider) -> None:
    """The trace's `tool` from User-Agent and X-Title (which OpenClaw's recipe sets: its own
    User-Agent is its SDK's): the agents by name, then the SDKs."""
    transport = httpx.HTTPTransport(uds=str(relayd.socket_path))
    with httpx.Client(transport=transport, base_url="http://taogpud") as client:
        for user_agent, title, _ in NAMED:
            headers = {"user-agent": user_agent} | ({"x-title": title} if title else {})
            assert client.get("/relay/v1/models", headers=headers).status_code == 200
    lines = relay_lines(relayd, len(NAMED))
    assert [line["tool"] for line in lines] == [tool for _, _, tool in NAMED]


# ---- the Responses API over WebSocket -------------------------------------------------------


# the openai SDK calls websockets' connect() outside a `with` (its own affair, not the relay's)
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager")
def test_responses_over_websocket_on_tcp(relayd: RunningDaemon, provider: FakeProvider) -> None:
    """The openai SDK's responses.connect() through the TCP listener: the upgrade is let in by
    the relay token, the provider's socket opened with the key, two turns relayed frame by
    frame (aliases resolved), their usage counted; one trace line for the session."""
    token, base = token_of(relayd)
    client = kept(openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0))
    texts = []
    with client.responses.connect() as connection:
        for _ in range(2):
            connection.response.create(model="coding", input="hi")
            for event in connection:
                if event.type == "response.completed":
                    texts.append(event.response.output_text)
                    break
    assert texts == ["w0 w1 w2 ", "w0 w1 w2 "]
    handshake = next(seen for seen in provider.seen if seen.method == "GET")
    assert handshake.path == "/api/v1/responses" and handshake.auth_matches
    assert token not in json.dumps(handshake.headers)
    turns = [seen for seen in provider.seen if seen.method == "WS"]
    assert [turn.body["model"] for turn in turns] == [MODELS["coding"]] * 2
    line = relay_lines(relayd)[-1]
    assert line["method"] == "WEBSOCKET" and line["status"] == 101 and line["tool"] == "openai-sdk"
    assert line["tokens"] == {"input": 22, "output": 6, "total": 28}
    assert line["session"]["messages_in"] == 2 and line["session"]["turns"] == 2
    assert line["alias"] == "coding" and line["hung_up"] is False


def test_websocket_over_the_unix_socket(relayd: RunningDaemon, provider: FakeProvider) -> None:
    """/relay/v1/responses upgrades on the daemon's socket too (the caller: SO_PEERCRED)."""
    from websockets.sync.client import unix_connect

    with unix_connect(str(relayd.socket_path), "ws://taogpud/relay/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "default", "input": "x"}))
        events = [json.loads(ws.recv(timeout=30))]
        while events[-1]["type"] != "response.completed":
            events.append(json.loads(ws.recv(timeout=30)))
    assert events[-1]["response"]["model"] == MODELS["default"]
    line = relay_lines(relayd)[-1]
    assert line["via"] == "unix" and line["uid"] is not None and line["status"] == 101
    assert line["tokens"] == {"input": 11, "output": 3, "total": 14}


def test_websocket_refusals_are_http_errors_in_the_one_shape(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """No token: 401; a provider without WebSocket: 426 upstream_no_websocket at once, so the
    client falls back to HTTP (never uvicorn's plain 500); the member's refusal traced, the
    tokenless one counted."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    relayd = start_relay(daemon_factory, provider.base_url)  # its refusals' summary: this test's
    token, base = token_of(relayd)
    url = base.replace("http://", "ws://") + "/v1/responses"
    with pytest.raises(InvalidStatus) as no_token, connect(url, open_timeout=30):
        pass
    assert no_token.value.response.status_code == 401
    assert json.loads(no_token.value.response.body)["code"] == "relay_token_required"
    provider.ws_refuse = 404
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"authorization": f"Bearer {token}"}, open_timeout=30)
    answer = refused.value.response
    assert (
        answer.status_code == 426 and answer.headers["x-taogpud-error"] == "upstream_no_websocket"
    )
    assert set(json.loads(answer.body)) == {"code", "message", "hint"}
    assert_no_key(answer.body)
    assert relay_lines(relayd)[-1]["status"] == 426  # the member's session, traced
    refused = relayd.events("relay.refused")  # no uid: counted, never traced (issue 34)
    assert [(line["code"], line["count"]) for line in refused] == [("relay_token_required", 1)]


def test_websocket_sessions_are_limited(
    daemon_factory: Callable[..., RunningDaemon], provider: FakeProvider
) -> None:
    """A session holds one concurrent slot; the day's token budget, spent by its turns, closes
    it with 1008 at the next message, and a new session is refused with 429."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import unix_connect

    limits = {"tokens_per_day": 20, "concurrent": 1}
    daemon = start_relay(daemon_factory, provider.base_url, {"limits": limits})
    url = "ws://taogpud/relay/v1/responses"
    create = json.dumps({"type": "response.create", "model": "default", "input": "x"})
    with unix_connect(str(daemon.socket_path), url) as ws:
        busy = unix_get(daemon, "GET", "/relay/v1/models")
        assert busy.status_code == 429 and "concurrent=1" in busy.json()["message"]
        for _ in range(2):  # 14 tokens a turn: the second passes the budget
            ws.send(create)
            while json.loads(ws.recv(timeout=30))["type"] != "response.completed":
                pass
        ws.send(create)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "tokens_per_day=20" in closed.value.rcvd.reason
    with pytest.raises(InvalidStatus) as refused, unix_connect(str(daemon.socket_path), url):
        pass
    assert refused.value.response.status_code == 429


@pytest.mark.slow
def test_relay_env_takes_over_the_token_of_the_one_file_per_user(
    relayd: RunningDaemon, tmp_path: Path
) -> None:
    """A token saved by an older taogpuctl in $XDG_CONFIG_HOME/taogpud/relay-token (one file
    per user) is still the user's: env prints it, and keeps it in this daemon's file."""
    token, base = token_of(relayd)
    legacy = tmp_path / "config" / "taogpud" / "relay-token"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(token + "\n")
    out = ctl(relayd, tmp_path, "relay", "env", "--tool", "openai")
    assert out.returncode == 0, out.stderr
    assert env_of(out.stdout)["OPENAI_API_KEY"] == token
    (kept_file,) = legacy.parent.glob("relay-token@*")
    assert kept_file.read_text().strip() == token and kept_file.stat().st_mode & 0o777 == 0o600
    auth = {"authorization": f"Bearer {token}"}
    assert httpx.get(base + "/v1/models", headers=auth).status_code == 200
