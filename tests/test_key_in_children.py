"""The key stays in the daemon: no child of it (workers, multiprocessing's resource tracker,
anything else) has the API key in /proc/<pid>/environ."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from test_channel import ping, settings_for
from test_ray_executor import RAY_CONFIG, _end_leftovers, _pids_naming, needs_ray, ray_env

from taogpud.provider.channel import Scrubber
from taogpud.testing import start_daemon
from taogpud.testing.fake_provider import Reply, fake_provider

KEY = "sk-tgd-children-0123456789abcdef"
OTHER_KEY = "sk-tgd-named-env-fedcba9876543210"


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from the parent links in /proc/<pid>/stat."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def environ_of(pid: int) -> bytes:
    """The environment `pid` started with; empty once it is gone (a child may end meanwhile)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_no_child_of_the_daemon_inherits_the_key(daemon_factory: Callable[..., Any]) -> None:
    """Both variables (TAOTOKEN_API_KEY and the one api.api_key_env names) are in the
    daemon's environment and in none of its children's, after a job ran and a worker was
    replaced; the daemon still has its key (key_source env)."""
    daemon = daemon_factory(
        config={"api": {"api_key_env": "TGD_TEST_KEY"}},
        env={"TAOTOKEN_API_KEY": KEY, "TGD_TEST_KEY": OTHER_KEY},
    )
    with daemon.client() as client:
        assert client.run("vector_add", {"size": 1000})["status"] == "succeeded"
        assert client.info()["key_source"] == "env"
        started = {worker["pid"] for worker in client.status()["workers"]}
    first = min(started)
    os.kill(first, signal.SIGKILL)  # its replacement is spawned later, by the supervisor
    daemon.wait_for_event(lambda e: e.get("event") == "worker.warm" and e.get("pid") not in started)
    own = environ_of(daemon.proc.pid)
    assert KEY.encode() in own and OTHER_KEY.encode() in own  # the check can see a key
    children = descendants(daemon.proc.pid)
    assert len(children) >= 3  # two workers and the resource tracker, at least
    leaking = [pid for pid in children if KEY.encode() in environ_of(pid)]
    leaking += [pid for pid in children if OTHER_KEY.encode() in environ_of(pid)]
    assert leaking == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in leaking]


@pytest.mark.parametrize(
    "echoed",
    [
        f"Incorrect API key provided: {KEY[:6]}{'*' * 20}{KEY[-4:]}.",
        f"key {KEY[0]}****{KEY[-1]} is not valid",
        f"bad key {KEY[:3]}...{KEY[-3:]}",
        "Authorization: Basic " + base64.b64encode(b"user:" + KEY.encode()).decode(),
        "token " + base64.urlsafe_b64encode(KEY.encode()).decode(),
    ],
)
def test_what_the_provider_echoes_is_scrubbed_of_masked_and_base64_keys(echoed: str) -> None:
    """A refusal that echoes the key masked (first and last characters around asterisks or
    dots) or base64-encoded shows <redacted> there, in every field of the ping's result."""
    with fake_provider(KEY) as server:
        server.script = [Reply(401, {"error": {"message": echoed, "type": "auth_error"}})]
        result = ping(settings_for(server.base_url, KEY))
    shown = result.model_dump_json()
    assert result.status == "rejected_key" and "<redacted>" in result.detail
    for form in (KEY, KEY[:6] + "*", base64.b64encode(KEY.encode()).decode()[:12]):
        assert form not in shown
    assert echoed.split(maxsplit=1)[0] in shown  # the rest of what it said is kept


def test_a_text_that_only_looks_masked_is_left_alone() -> None:
    """Asterisks or dots around other characters than the key's own start and end stay."""
    scrub = Scrubber(SecretStr(KEY))
    for text in ("rate a ***** b", "sk-other****abcd", "version 1.2...3", "wait..."):
        assert scrub(text) == text


@pytest.mark.slow
@needs_ray
def test_no_process_of_a_local_ray_inherits_the_key() -> None:
    """executor ray, address local: the daemon's Ray (raylet, GCS, the actors: children of the
    daemon, some re-parented) has no key in any environment."""
    home = Path(tempfile.mkdtemp(prefix="tgd-ray-", dir="/tmp"))
    ray_root = home / "r"
    ray_root.mkdir()
    env = {**ray_env(ray_root), "TAOTOKEN_API_KEY": KEY}
    daemon = start_daemon(home / "d", None, RAY_CONFIG, env)
    try:
        with daemon.client() as client:
            assert client.run("vector_add", {"size": 1000})["status"] == "succeeded"
        pids = set(descendants(daemon.proc.pid)) | set(_pids_naming(str(ray_root)))
        assert len(pids) >= 3
        assert KEY.encode() in environ_of(daemon.proc.pid)
        assert [pid for pid in sorted(pids) if KEY.encode() in environ_of(pid)] == []
    finally:
        daemon.stop(signal.SIGTERM, timeout_s=30)
        daemon.stop(signal.SIGKILL)
        _end_leftovers(str(ray_root))
        shutil.rmtree(home, ignore_errors=True)
