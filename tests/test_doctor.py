"""`taogpuctl api ping` and `taogpuctl doctor` as users run them: subprocesses against real
daemons (tests/conftest.py), whose API channel points at a real HTTP server on 127.0.0.1
(taogpud/testing/fake_provider.py). Never the internet.

Exit codes (DESIGN §11): api ping 0 ok, 1 the channel failed, 3 no daemon; doctor 0, or 1 when
any check failed — an unreachable daemon included (the report still comes).
"""

from __future__ import annotations

import functools
import json
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taogpud.backends.cuda.backend import probe_cuda
from taogpud.client import ApiError
from taogpud.doctor import ORDER
from taogpud.testing import RunningDaemon, taogpuctl
from taogpud.testing.fake_provider import FakeProvider, fake_provider

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("doctor")

KEY = f"sk-taogpud-doctor-{secrets.token_hex(12)}"
STATUSES = {"pass", "warn", "fail", "skip"}
# cuda configured, allowed to fall back: on this GPU-less host it starts on CPU workers
CUDA_FALLBACK_SETTINGS = {"gpu": {"backend": "cuda", "allowFallbackToCpu": True}}
CUDA_CONFIG = {"runtime": {"device_type": "gpu"}, "backend": {"cuda": {"enabled": True}}}

Factory = Callable[..., RunningDaemon]


ctl = functools.partial(taogpuctl, timeout_s=120.0)  # doctor pings the channel


def channel_daemon(
    factory: Factory,
    provider: FakeProvider,
    settings: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    key: str | None = KEY,
    env: dict[str, str] | None = None,
) -> RunningDaemon:
    """A daemon whose channel is the fake provider, holding `key` (None: no key at all)."""
    url = provider.base_url
    settings = {**(settings or {}), "provider": {"baseUrl": url, "maxRetries": 0}}
    config = {**(config or {}), "api": {"base_url": url}}
    return factory(settings, config, env={"TAOTOKEN_API_KEY": key or "", **(env or {})})


def assert_no_key(daemon: RunningDaemon, *results: subprocess.CompletedProcess[str]) -> None:
    """The key is in no CLI output and in none of the daemon's stdout or stderr."""
    for result in results:
        assert KEY not in result.stdout and KEY not in result.stderr
    assert KEY not in daemon.stdout_text()
    assert KEY not in daemon.stderr()


def checks_of(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {check["name"]: check for check in report["checks"]}


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with fake_provider(KEY) as server:
        yield server


# --- api ping ---------------------------------------------------------------------------------


def test_api_ping_through_the_daemon(daemon_factory: Factory, provider: FakeProvider) -> None:
    """The daemon pings with its key (the shell has none): exit 0, ok, latency, model per role."""
    daemon = channel_daemon(daemon_factory, provider)
    result = ctl("api", "ping", "--json", socket_path=daemon.socket_path)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["ok"] is True and answer["status"] == "ok"
    assert answer["model"] == "claude-sonnet" and answer["latency_ms"] > 0
    assert answer["attempts"] == 1 and answer["key_source"] == "env"
    assert provider.seen[0].auth_matches
    assert provider.seen[0].body["messages"] == [{"role": "user", "content": "ping"}]
    reasoning = ctl("api", "ping", "--model", "reasoning", socket_path=daemon.socket_path)
    assert reasoning.returncode == 0
    assert reasoning.stdout.startswith("✓ api ping ok: claude-opus answered in")
    assert provider.seen[1].body["model"] == "claude-opus"
    events = daemon.events("channel.ping")
    assert [event["status"] for event in events] == ["ok", "ok"]
    assert_no_key(daemon, result, reasoning)


def test_api_ping_rejected_key_exits_1(daemon_factory: Factory) -> None:
    """A provider refusing and echoing the key: exit 1, rejected_key, the echo redacted."""
    with fake_provider("not-the-daemons-key") as server:
        server.require_auth = True
        daemon = channel_daemon(daemon_factory, server)
        result = ctl("api", "ping", "--json", socket_path=daemon.socket_path)
    assert result.returncode == 1
    answer = json.loads(result.stdout)
    assert answer["status"] == "rejected_key" and answer["http_status"] == 401
    assert "<redacted>" in answer["detail"]
    human = ctl("api", "ping", socket_path=daemon.socket_path)
    assert human.returncode == 1 and human.stdout.startswith("✗ api ping ")
    assert_no_key(daemon, result, human)


def test_api_ping_without_a_key_lists_the_sources(daemon_factory: Factory) -> None:
    """A daemon with no key: no_key naming credential, env var and apiKey, and how to give it
    one as it was started (here in a terminal: the env var); nothing sent; exit 1."""
    with fake_provider(KEY) as server:
        server.require_auth = True
        daemon = channel_daemon(daemon_factory, server, key=None)
        result = ctl("api", "ping", "--json", socket_path=daemon.socket_path)
        assert not server.seen
    assert result.returncode == 1
    answer = json.loads(result.stdout)
    assert answer["status"] == "no_key" and answer["key_source"] == "none"
    detail = answer["detail"]
    assert "taotoken_api_key" in detail and "TAOTOKEN_API_KEY (set but empty" in detail
    assert str(daemon.settings_path) in detail
    assert "export TAOTOKEN_API_KEY=" in answer["hint"]


def test_api_ping_classifies_a_dead_channel(
    daemon_factory: Factory, provider: FakeProvider
) -> None:
    """The provider stops: the daemon answers refused (exit 1), not an error of its own."""
    daemon = channel_daemon(daemon_factory, provider)
    provider.stop()
    result = ctl("api", "ping", "--json", socket_path=daemon.socket_path)
    assert result.returncode == 1
    assert json.loads(result.stdout)["status"] == "refused"


def test_api_ping_usage_and_unreachable(tmp_path: Path, module_daemon: RunningDaemon) -> None:
    """No daemon → exit 3; an unknown --model → exit 2; the route answers invalid_request."""
    gone = ctl("api", "ping", socket_path=tmp_path / "nothing.sock")
    assert gone.returncode == 3 and gone.stderr.startswith("taogpuctl: no daemon socket")
    bad = ctl("api", "ping", "--model", "fastest", socket_path=module_daemon.socket_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    with module_daemon.client() as client, pytest.raises(ApiError) as raised:
        client.channel_ping("fastest")
    assert raised.value.code == "invalid_request" and raised.value.http_status in (400, 422)
    assert "query.model" in raised.value.message


# --- doctor -----------------------------------------------------------------------------------


def test_doctor_on_a_cpu_daemon_is_complete(
    daemon_factory: Factory, provider: FakeProvider
) -> None:
    """CPU daemon: every check once, in order, §11 shape, no fails (exit 0), backend=cpu."""
    daemon = channel_daemon(daemon_factory, provider)
    result = ctl("doctor", "--json", socket_path=daemon.socket_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert [check["name"] for check in report["checks"]] == list(ORDER)
    for check in report["checks"]:
        assert set(check) == {"name", "status", "detail", "hint"}
        assert check["status"] in STATUSES and check["detail"]
        assert "the check itself failed" not in check["detail"]
    checks = checks_of(report)
    assert checks["probe_job"]["status"] == "pass"
    assert "device=cpu:0 backend=cpu" in checks["probe_job"]["detail"]
    assert "device=cpu:1 backend=cpu" in checks["probe_job"]["detail"]
    assert checks["api_channel"]["status"] == "pass"
    assert checks["recent_backends"]["status"] == "pass"
    assert checks["cuda_driver"]["status"] == "skip"  # cpu configured, no driver needed
    assert checks["config_files"]["status"] == "pass"
    assert report["daemon"]["backend"] == "cpu" and report["daemon"]["key_source"] == "env"
    human = ctl("doctor", "--no-ping", "--no-probe", socket_path=daemon.socket_path)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0].startswith("✓ daemon ")
    assert any(line.startswith("- api_channel ") and "--no-ping" in line for line in lines)
    assert lines[-1].startswith("doctor: 0 failed")
    assert_no_key(daemon, result, human)


def test_doctor_on_cuda_with_fallback_fails_loudly(
    daemon_factory: Factory, provider: FakeProvider
) -> None:
    """cuda + allowFallbackToCpu on a GPU-less host: probe fails (fallback=true), exit 1."""
    daemon = channel_daemon(daemon_factory, provider, CUDA_FALLBACK_SETTINGS, CUDA_CONFIG)
    result = ctl("doctor", "--json", socket_path=daemon.socket_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["daemon"]["fallback"] is True
    checks = checks_of(report)
    probe = checks["probe_job"]
    assert probe["status"] == "fail"
    assert "backend=cpu fallback=true" in probe["detail"]
    assert "cuda is configured but the probes ran on the CPU fallback" in probe["detail"]
    assert checks["cuda_driver"]["status"] == "fail"
    assert checks["recent_backends"]["status"] == "warn"  # fallback allowed: loud, not fatal
    assert checks["cuda_arch"]["status"] == "skip" and checks["gpu_memory"]["status"] == "skip"
    human = ctl("doctor", "--no-ping", socket_path=daemon.socket_path)
    assert human.returncode == 1 and "Traceback" not in human.stderr
    assert any(line.startswith("✗ probe_job ") for line in human.stdout.splitlines())


def test_doctor_key_from_a_credential_and_a_shell_that_does_not_need_it(
    daemon_factory: Factory, provider: FakeProvider, tmp_path: Path
) -> None:
    """Key from the systemd credential: api_key passes; the shell's copy is said unused."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "taotoken_api_key").write_text(KEY + "\n")
    daemon = channel_daemon(
        daemon_factory, provider, key=None, env={"CREDENTIALS_DIRECTORY": str(credentials)}
    )
    shell = {"TAOTOKEN_API_KEY": "the-shells-own-copy"}
    result = ctl("doctor", "--json", socket_path=daemon.socket_path, env=shell)
    assert result.returncode == 0, result.stdout
    checks = checks_of(json.loads(result.stdout))
    assert checks["api_key"]["status"] == "pass" and "credential" in checks["api_key"]["detail"]
    assert checks["shell_env"]["status"] == "pass"
    assert "nothing uses it there" in checks["shell_env"]["detail"]
    assert checks["api_channel"]["status"] == "pass" and provider.seen[0].auth_matches
    assert_no_key(daemon, result)


def test_doctor_key_only_in_the_shell_is_the_guides_pitfall(
    daemon_factory: Factory, provider: FakeProvider
) -> None:
    """The shell exports the key, the service has none: api_key, shell_env and the ping fail."""
    provider.require_auth = True
    daemon = channel_daemon(daemon_factory, provider, key=None)
    result = ctl("doctor", "--json", socket_path=daemon.socket_path, env={"TAOTOKEN_API_KEY": KEY})
    assert result.returncode == 1
    checks = checks_of(json.loads(result.stdout))
    assert checks["api_key"]["status"] == "fail"
    # a daemon started from a shell (these tests'): the env var, not a unit's credential
    assert "export TAOTOKEN_API_KEY=" in checks["api_key"]["hint"], checks["api_key"]
    assert "LoadCredential" not in checks["api_key"]["hint"]
    assert checks["shell_env"]["status"] == "fail"
    assert "does not inherit" in checks["shell_env"]["detail"]
    assert checks["api_channel"]["status"] == "fail"
    assert checks["api_channel"]["detail"].startswith("no_key:")
    assert KEY not in daemon.stdout_text()


@pytest.mark.process
def test_doctor_without_a_daemon_still_reports(tmp_path: Path) -> None:
    """No daemon: exit 1, the full list, daemon fails, offline checks run, no traceback."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"gpu": {"backend": "cpu"}}))
    config = tmp_path / "config.toml"
    config.write_text('[runtime]\ndevice_type = "cpu"\n[backend.cuda]\nenabled = false\n')
    args = ("doctor", "--json", "--settings", str(settings), "--config", str(config))
    result = ctl(*args, socket_path=tmp_path / "none.sock")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["daemon"] is None
    assert [check["name"] for check in report["checks"]] == list(ORDER)
    checks = checks_of(report)
    assert checks["daemon"]["status"] == "fail" and "no daemon socket" in checks["daemon"]["detail"]
    for name in ("api_channel", "probe_job", "recent_backends", "api_key"):
        assert checks[name]["status"] == "skip"
    assert checks["config_files"]["status"] == "pass"
    assert checks["config_pair"]["status"] == "pass"
    assert checks["cuda_driver"]["status"] in {"skip", "pass", "warn"}  # cpu: never a fail
    human = ctl(
        "doctor",
        "--settings",
        str(settings),
        "--config",
        str(config),
        socket_path=tmp_path / "none.sock",
    )
    assert human.returncode == 1 and human.stdout.splitlines()[0].startswith("✗ daemon ")


def test_doctor_route_through_the_client(module_daemon: RunningDaemon) -> None:
    """GET /v1/doctor without ping or probe: a DoctorView with the daemon-side checks only."""
    with module_daemon.client() as client:
        report = client.doctor(ping=False, probe=False)
    names = [check["name"] for check in report["checks"]]
    assert names == [n for n in ORDER if n not in {"daemon", "relay", "shell_env", "config_files"}]
    checks = checks_of(report)
    assert checks["api_channel"]["status"] == "skip" and checks["probe_job"]["status"] == "skip"
    assert report["daemon"]["pid"] == module_daemon.proc.pid


GPU_PROBLEM = probe_cuda([0])


@pytest.mark.gpu
@pytest.mark.skipif(GPU_PROBLEM is not None, reason=f"needs a GPU: {str(GPU_PROBLEM)[:100]}")
def test_doctor_on_a_gpu_daemon_sees_the_probe_on_the_gpu(daemon_factory: Factory) -> None:
    """GPU host, cuda config: the probe says device=gpu:0 backend=cuda and the arch check passes."""
    settings = {"gpu": {"backend": "cuda"}}
    config = {
        "runtime": {"device_type": "gpu"},
        "backend": {"cuda": {"enabled": True, "cuda_arch": "auto"}},
        "memory": {"pool_size_mb": 64},
    }
    daemon = daemon_factory(settings, config)
    result = ctl("doctor", "--no-ping", "--json", socket_path=daemon.socket_path)
    checks = checks_of(json.loads(result.stdout))
    assert checks["probe_job"]["status"] in {"pass", "warn"}, checks["probe_job"]
    assert "device=gpu:0 backend=cuda" in checks["probe_job"]["detail"]
    assert checks["cuda_arch"]["status"] == "pass"
    assert checks["cuda_driver"]["status"] != "fail", checks["cuda_driver"]
