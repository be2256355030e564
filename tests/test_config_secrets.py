"""A config value holding the key, or shaped like one, is never shown (issue 34): typed into
the wrong field (provider.baseUrl, timeoutMs, models, api.api_key_env, a URL's userinfo), it
is in no config error, no `taogpuctl config status`, no /v1/config, no relay status, no trace
line and no log; and a config path that is a link to another file gets messages that quote
none of that file's content.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from taogpud import config
from taogpud.errors import ConfigError
from taogpud.testing import KEYS_GIVEN, RunningDaemon

TYPED = "sk-" + secrets.token_hex(20)  # the key, typed where it does not belong
USERINFO = "user:" + secrets.token_hex(6)  # a password in a URL: not key-shaped, still hidden
KEYS_GIVEN.add(TYPED)  # daemon_home's check: no log of these daemons may hold it


def load_error(tmp_path: Path, settings: dict[str, Any], toml: str = "") -> str:
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    (tmp_path / "config.toml").write_text(toml or "# the defaults\n")
    with pytest.raises(ConfigError) as caught:
        config.load(tmp_path / "settings.json", tmp_path / "config.toml", environ={})
    return str(caught.value) + json.dumps([p.as_dict() for p in caught.value.problems])


@pytest.mark.parametrize(
    "settings",
    [
        {"provider": {"baseUrl": TYPED}},
        {"provider": {"baseUrl": f"https://{TYPED}/api"}},
        {"provider": {"timeoutMs": TYPED}},
        {"provider": {"maxRetries": f"key {TYPED}"}},
        {"models": {"default": TYPED, "coding": [TYPED]}},
        {"gpu": {"backend": TYPED}},
        {"api": {"api_key_env": TYPED}},  # config.toml's
        {"api": {"api_key_env": f"TAOTOKEN_{TYPED}"}},
    ],
)
def test_the_key_typed_into_a_wrong_field_is_not_in_the_error(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    toml = ""
    if "api" in settings:
        toml = f'[api]\napi_key_env = "{settings.pop("api")["api_key_env"]}"\n'
    text = load_error(tmp_path, settings, toml)
    assert TYPED not in text and TYPED[3:20] not in text
    assert "<redacted>" in text or "not shown" in text


def test_a_url_userinfo_is_not_in_the_error(tmp_path: Path) -> None:
    """api.base_url and provider.baseUrl disagree: both URLs are named, their userinfo not."""
    url = f"https://{USERINFO}@127.0.0.1:9/api"
    text = load_error(tmp_path, {"provider": {"baseUrl": url}}, '[api]\nbase_url = "http://x/y"\n')
    assert "provider.baseUrl" in text and "127.0.0.1:9/api" in text
    assert USERINFO not in text


def test_a_url_with_userinfo_is_refused_without_showing_it(tmp_path: Path) -> None:
    """provider.baseUrl with user:password@: a config error naming the key and the fix, the
    userinfo not in it (a daemon that ran with it answered every relayed OpenAI request 500:
    aiohttp refuses a URL's credentials beside the Authorization the relay sets)."""
    url = f"https://{USERINFO}@127.0.0.1:9/api"
    text = load_error(tmp_path, {"provider": {"baseUrl": url}}, f'[api]\nbase_url = "{url}"\n')
    assert "provider.baseUrl" in text and "api.base_url" in text
    assert "carries credentials (user:password@)" in text
    assert "remove the user:password@ part" in text
    assert USERINFO not in text


def test_a_linked_config_file_is_not_quoted(tmp_path: Path) -> None:
    """config.toml a symlink to another (TOML-shaped) file: the errors say how many keys are
    wrong, and not one of that file's names or values; the same file as the config itself is
    quoted (the operator wrote it)."""
    other = tmp_path / "other.toml"
    other.write_text('db_password_hunter2 = "x"\n[relay]\nlisten = "hunter3-secret"\n')
    (tmp_path / "settings.json").write_text("{}")
    link = tmp_path / "config.toml"
    link.symlink_to(other)
    with pytest.raises(ConfigError) as caught:
        config.load(tmp_path / "settings.json", link, environ={})
    text = str(caught.value) + json.dumps([p.as_dict() for p in caught.value.problems])
    assert len(caught.value.problems) == 2
    assert "hunter2" not in text and "hunter3" not in text and "db_password" not in text
    with pytest.raises(ConfigError) as direct:
        config.load(tmp_path / "settings.json", other, environ={})
    assert "db_password_hunter2" in str(direct.value) + json.dumps(
        [p.as_dict() for p in direct.value.problems]
    )


# ---- a daemon that runs with them ----------------------------------------------------------


def test_a_running_daemon_shows_none_of_them(
    daemon_factory: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """The key as a model's name: the config is valid and runs; /v1/config, the relay's
    status, `config status` after a reload that changes them, the trace and the log
    (daemon_home's check) hold none of it. (A URL's userinfo is refused at load: below.)"""
    url = "http://127.0.0.1:9/api"
    settings = {"provider": {"baseUrl": url}, "models": {"default": TYPED}}
    daemon = daemon_factory(
        settings,
        {"api": {"base_url": url}, "relay": {"enabled": True}},
        env={"TAOGPUD_CONFIG__RELOAD__QUIET_S": "0.1", "TAOTOKEN_API_KEY": TYPED[::-1] + "k"},
    )
    with daemon.client() as client:
        shown = [client.config(), client.relay_status()]
        generation = client.config_status()["generation"]
        changed = json.loads(daemon.settings_path.read_text())
        changed["models"] = {"default": TYPED[::-1], "coding": TYPED}
        daemon.settings_path.write_text(json.dumps(changed))
        deadline = time.monotonic() + 30
        while client.config_status()["generation"] == generation and time.monotonic() < deadline:
            time.sleep(0.05)
        shown.append(client.config_status())
    assert shown[-1]["last_reload"]["changes"], shown[-1]
    status = daemon.ctl("config", "status")
    shown += [status.stdout, status.stderr, daemon.ctl("config", "status", "--json").stdout]
    shown.append(daemon.ctl("relay", "status", "--json").stdout)
    relayed = daemon.ctl("relay", "status")  # and a request through the relay: its trace line's
    shown.append(relayed.stdout)  # model is the alias's value, scrubbed by the log's scrubber
    with daemon.client() as client:
        client.relay_token()
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with httpx.Client(transport=transport, base_url="http://taogpud", timeout=60) as http:
        answer = http.post("/relay/v1/messages", json={"model": "coding"})
    assert answer.status_code == 502, answer.text  # 127.0.0.1:9 answers nothing
    line = daemon.wait_for_event(lambda e: e.get("event") == "relay.request")
    assert line["model"] == "<redacted>"
    shown += [answer.text, daemon.stdout_text()]
    text = json.dumps(shown, default=str)
    for secret in (TYPED, TYPED[::-1], USERINFO):
        assert secret not in text
    assert "<redacted>" in text and "models.default" in text
