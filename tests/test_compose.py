"""The composition step (taogpud/daemon/compose.py): every service built once and handed to
what uses it, nothing kept in a module global, so two daemons composed in one process (the
in-process harness does this) never see each other's services.

Real parts: the config pair written and loaded as the daemon would, a real job store, array
store, pool (not started: nothing is spawned), relay and app; the app answers over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from taogpud import config, wire
from taogpud.daemon.compose import Options, Services, compose
from taogpud.host.systemd import Notifier
from taogpud.relay.usage import Tokens, UseKey
from taogpud.testing import CPU_CONFIG, CPU_SETTINGS, to_toml


def _compose(home: Path) -> Services:
    settings, config_file = home / "settings.json", home / "config.toml"
    home.mkdir()
    settings.write_text(json.dumps(CPU_SETTINGS))
    config_file.write_text(to_toml(CPU_CONFIG))
    snapshot = config.load(settings, config_file, environ={})
    options = Options(settings, config_file, home / "taogpud.sock", home / "state")
    return compose(snapshot, options, Notifier())


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Services, Services]]:
    environ = dict(os.environ)  # compose sets the workers' kernel caches in the environment
    first, second = _compose(tmp_path / "a"), _compose(tmp_path / "b")
    yield first, second
    for services in (first, second):
        services.state.store.close()
    os.environ.clear()
    os.environ.update(environ)


async def _scrape(services: Services) -> str:
    transport = httpx.ASGITransport(app=services.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://taogpud") as client:
        answer = await client.get(wire.METRICS.path)
    assert answer.status_code == 200, answer.text
    return answer.text


def test_each_daemon_scrapes_its_own_relay(two: tuple[Services, Services]) -> None:
    """The relay's counters reach the metrics of the daemon that built the relay, and only
    those. (The relay's collector was a module global, replaced by the last app built: the
    first daemon scraped the second one's relay.)"""
    first, second = two
    first.relay.use.record(UseKey(1000, "model-of-a", 200), Tokens(3, 4, True))
    scraped = [asyncio.run(_scrape(services)) for services in (first, second)]
    assert 'model="model-of-a"' in scraped[0]
    assert "model-of-a" not in scraped[1]
    assert all("taogpud_jobs_running" in text for text in scraped)


def test_the_services_are_handed_to_what_uses_them(two: tuple[Services, Services]) -> None:
    """The reloader writes the status the state holds, the `.shm` server submits to the
    state's scheduler, and nothing is shared between two compositions."""
    first, second = two
    assert first.reloader.status is first.state.status
    assert first.reloader.scheduler is first.state.scheduler
    assert first.shm is not None and first.shm.scheduler is first.state.scheduler
    assert first.relay.snapshot() is first.state.status.snapshot
    assert first.relay.tokens.path == first.state.store.path.parent / "relay-tokens.json"
    assert first.state.scheduler is not second.state.scheduler
    assert first.relay is not second.relay
