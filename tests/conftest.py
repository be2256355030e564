"""Real daemons for tests, reached through their real socket: a `taogpud` process per test
(`daemon`, `daemon_factory`), or the same daemon in a thread of the test's process for API and
scheduling behaviour (`inprocess_daemon`, `inprocess_factory`).

Thin fixtures over taogpud.testing, where the daemons, their client and the config writers
live (bench/ and scripts/ use them too); tests import those from there. Socket paths live in
a short directory under /tmp because sun_path holds 108 bytes and pytest's tmp_path is often
longer.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from taogpud.testing import (
    Ctl,
    InProcessDaemon,
    RunningDaemon,
    key_leaks,
    new_home,
    remove_home,
    running,
    start_daemon,
    start_in_process,
)
from taogpud.testing.fake_provider import FakeProvider, fake_provider


@contextlib.contextmanager
def checked_home() -> Iterator[Path]:
    """A short folder for daemons (sun_path); afterwards no log in it may hold a given API key."""
    home = new_home()
    yield home
    leaks = key_leaks(home)
    remove_home(home)
    assert leaks == [], f"an API key was written to {leaks}"


@contextlib.contextmanager
def factory_in(daemon_home: Path) -> Iterator[Callable[..., RunningDaemon]]:
    """Start daemons under `daemon_home` with setting/config overrides merged over the CPU
    pair; stops them all."""
    started: list[RunningDaemon] = []

    def factory(
        settings: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        files: tuple[Path, Path] | None = None,
    ) -> RunningDaemon:
        home = daemon_home / f"d{len(started)}"
        daemon = start_daemon(home, settings, config, env, wait_ready, files)
        started.append(daemon)
        return daemon

    yield factory
    for daemon in started:
        daemon.stop(signal.SIGTERM, timeout_s=15)


@pytest.fixture
def daemon_home() -> Iterator[Path]:
    """A short folder for daemons (sun_path); afterwards no log in it may hold a given API key."""
    with checked_home() as home:
        yield home


@pytest.fixture
def daemon_factory(daemon_home: Path) -> Iterator[Callable[..., RunningDaemon]]:
    """Start daemons with setting/config overrides merged over the CPU pair; stops them all."""
    with factory_in(daemon_home) as factory:
        yield factory


@pytest.fixture(scope="module")
def module_daemon_factory() -> Iterator[Callable[..., RunningDaemon]]:
    """`daemon_factory` for daemons that the tests of a module share (each with settings of
    its own): stopped after the module's last test, their logs then checked for keys."""
    with checked_home() as home, factory_in(home) as factory:
        yield factory


@pytest.fixture(scope="module")
def module_daemon() -> Iterator[RunningDaemon]:
    """One daemon process for those tests of a module that change nothing another test of it
    reads: refusals, reads, jobs and arrays of their own by id (never counts, the queue or
    events not filtered by job). A test that needs the daemon as it started takes `daemon`."""
    with running() as started:
        yield started


@pytest.fixture
def daemon(daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    """A ready daemon on the CPU backend: 2 devices, 2 slots each, the seed's caps."""
    return daemon_factory()


class SharedInProcess:
    """The in-process daemon a module's tests share (`module_inprocess_daemon`), started at
    the first test that takes it. One in-process daemon runs at a time, so a test that starts
    its own (`inprocess_factory`) stops the shared one first; the next sharer starts another."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.daemon: InProcessDaemon | None = None
        self.config: dict[str, Any] | None = None  # the running one's overrides
        self.started = 0  # each start gets a state directory of its own

    def get(self, config: dict[str, Any] | None = None) -> InProcessDaemon:
        """The shared daemon, with these config overrides over the CPU pair (a module's
        sharers give the same: a call with others stops it and starts one with those)."""
        if self.daemon is not None and config != self.config:
            self.stop()
        if self.daemon is None:
            self.daemon = start_in_process(self.home / f"m{self.started}", None, config)
            self.config = config
            self.started += 1
        return self.daemon

    def stop(self) -> None:
        daemon, self.daemon = self.daemon, None
        if daemon is not None:
            daemon.stop(timeout_s=15)


@pytest.fixture(scope="module")
def shared_inprocess() -> Iterator[SharedInProcess]:
    """The module's SharedInProcess: stopped, and its home gone, when the module's tests end."""
    shared = SharedInProcess(new_home())
    try:
        yield shared
        shared.stop()
    finally:
        remove_home(shared.home)


@pytest.fixture
def module_inprocess_daemon(shared_inprocess: SharedInProcess) -> InProcessDaemon:
    """`module_daemon`'s in-process twin, for the same tests: those that change nothing
    another test of the module reads (refusals, reads, jobs and arrays of their own by id).
    While it runs (until the module's end), the process's logging is the daemon's."""
    return shared_inprocess.get()


@pytest.fixture
def inprocess_factory(
    daemon_home: Path, shared_inprocess: SharedInProcess
) -> Iterator[Callable[..., InProcessDaemon]]:
    """`daemon_factory`'s twin for API and scheduling behaviour: the same daemon on the same
    files, in a thread of the test's process (taogpud.testing.InProcessDaemon), one at a
    time (the module's shared one is stopped first); each is stopped afterwards, and a stop
    that left anything behind fails the test."""
    started: list[InProcessDaemon] = []

    def factory(
        settings: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        wait_ready: bool = True,
    ) -> InProcessDaemon:
        shared_inprocess.stop()
        daemon = start_in_process(daemon_home / f"i{len(started)}", settings, config, wait_ready)
        started.append(daemon)
        return daemon

    yield factory
    for daemon in started:
        daemon.stop(timeout_s=15)


@pytest.fixture
def inprocess_daemon(inprocess_factory: Callable[..., InProcessDaemon]) -> InProcessDaemon:
    """`daemon`'s twin in the test's process: the CPU backend, 2 devices, 2 slots each."""
    return inprocess_factory()


# `make test-quick` leaves out the tests that start a daemon process: a test is marked
# `process` here when its fixtures start one (a daemon's home alone counts, unless the test's
# daemon is the in-process one), so a new test lands in the right tier with no marker of its
# own. A test that starts one (or another long program: a nested pytest, the demo,
# `python -m bench.…`) in its body says so itself with @pytest.mark.process.
PROCESS_FIXTURES = {"daemon", "daemon_factory", "module_daemon", "module_daemon_factory"}
INPROCESS_FIXTURES = {"inprocess_daemon", "inprocess_factory", "module_inprocess_daemon"}


def starts_a_process(fixtures: set[str]) -> bool:
    in_process = bool(fixtures & INPROCESS_FIXTURES)
    return bool(fixtures & PROCESS_FIXTURES) or ("daemon_home" in fixtures and not in_process)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if starts_a_process(set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.process)


HOST_STATE_DIR = Path("/var/lib/taogpud")  # a root daemon's default: the booted containers
# overlay the host's /var, so a test that left a file there would break the systemd tier


@pytest.fixture(autouse=True, scope="session")
def _host_state_dir_untouched() -> Iterator[None]:
    """No test may start a daemon on the host's default state directory (pass --state-dir)."""
    existed = HOST_STATE_DIR.exists()
    yield
    if not existed and HOST_STATE_DIR.exists() and os.geteuid() == 0:
        lock = HOST_STATE_DIR / "taogpud.lock"  # names the daemon's pid and socket
        holder = lock.read_text() if lock.exists() else "no lock file"
        shutil.rmtree(HOST_STATE_DIR, ignore_errors=True)  # leave the host as it was, then say
        pytest.fail(f"a daemon used {HOST_STATE_DIR} ({holder}): start daemons with --state-dir")


@pytest.fixture(scope="session")
def pocl_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The POCL_CACHE_DIR of every OpenCL daemon of a session (test_opencl, test_shm_opencl,
    in one xdist group): a kernel is built cold once, then read from here."""
    return tmp_path_factory.mktemp("pocl-cache")


def fill(folder: Path) -> Path:
    """A file that takes every free byte of `folder`'s file system (until ENOSPC)."""
    filler = folder / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size_mb: int) -> Iterator[Path]:
    """A small tmpfs mounted at `folder`, for a real ENOSPC (CI runs as root; skipped with the
    reason where mounting is not allowed)."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def ctl(daemon: RunningDaemon) -> Ctl:
    """taogpuctl aimed at the test's daemon."""
    return daemon.ctl


@pytest.fixture
def inprocess_ctl(inprocess_daemon: InProcessDaemon) -> Ctl:
    """taogpuctl aimed at the test's in-process daemon (taogpuctl itself is a process)."""
    return inprocess_daemon.ctl


@pytest.fixture
def module_inprocess_ctl(module_inprocess_daemon: InProcessDaemon) -> Ctl:
    """taogpuctl aimed at the module's shared in-process daemon."""
    return module_inprocess_daemon.ctl


# --- the relay: a daemon whose relay forwards to a fake provider on 127.0.0.1 -----------------

# Random per run, never a real key. Import these as `from conftest import …` (the module pytest
# loaded): `tests.conftest` would be a second module drawing a second key.
RELAY_KEY = "sk-relay-" + secrets.token_hex(16)
MODELS = {"default": "claude-sonnet-4", "coding": "claude-coder-9", "reasoning": "claude-opus-4"}


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    """The fake provider, answering only RELAY_KEY (a 401 otherwise, as the real ones)."""
    with fake_provider(RELAY_KEY) as server:
        server.require_auth = True
        yield server


@pytest.fixture(scope="module")
def relay_provider_settings() -> dict[str, Any]:
    """The relay daemon's provider settings over start_relay's: a module overrides this
    fixture to change them for all its tests."""
    return {}


@pytest.fixture
def relayd(
    daemon_factory: Callable[..., RunningDaemon],
    provider: FakeProvider,
    relay_provider_settings: dict[str, Any],
) -> RunningDaemon:
    """A daemon holding RELAY_KEY whose relay listens on 127.0.0.1 and forwards to `provider`."""
    return start_relay(daemon_factory, provider.base_url, provider=relay_provider_settings)


# A module whose relay tests change nothing another of them reads shares one relay daemon and
# one provider: `provider, relayd = relay_shared_by_the_module()` at its top overrides both.


def relay_shared_by_the_module() -> tuple[Any, Any]:
    """`provider` and `relayd` fixtures that hand each test the module's one provider and relay
    (`shared_provider`, `shared_relayd`): assigned to those names in a module, they override
    the fixtures of a provider and relay a test."""

    @pytest.fixture(name="provider")
    def module_provider_as_new(shared_provider: FakeProvider) -> FakeProvider:
        return shared_provider

    @pytest.fixture(name="relayd")
    def module_relayd_as_new(shared_relayd: RunningDaemon) -> RunningDaemon:
        return shared_relayd

    return module_provider_as_new, module_relayd_as_new


@pytest.fixture(scope="module")
def module_provider() -> Iterator[FakeProvider]:
    """The fake provider of a module's shared relay (tests take it as `shared_provider`)."""
    with fake_provider(RELAY_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def module_relayd(
    module_daemon_factory: Callable[..., RunningDaemon],
    module_provider: FakeProvider,
    relay_provider_settings: dict[str, Any],
) -> RunningDaemon:
    """`relayd` once for a module (tests take it as `shared_relayd`)."""
    base_url = module_provider.base_url
    return start_relay(module_daemon_factory, base_url, provider=relay_provider_settings)


@pytest.fixture
def shared_provider(module_provider: FakeProvider) -> FakeProvider:
    """The module's provider as `provider` starts: nothing scripted or seen, keys checked."""
    module_provider.reset()
    module_provider.require_auth = True
    return module_provider


@pytest.fixture
def shared_relayd(module_relayd: RunningDaemon, shared_provider: FakeProvider) -> RunningDaemon:
    """The module's relay as a test finds a new one: holding no relay token (the caller's
    revoked), its trace begun now, its provider reset. What it counts goes on (`relay
    status`, /metrics, the summaries of refusals, which say the first of a kind at once and
    then one line per 10 s): a test that reads those starts a relay of its own."""
    assert unix_get(module_relayd, "DELETE", "/v1/relay/token").status_code == 200
    return module_relayd.trace_from_now()


def start_relay(
    factory: Callable[..., RunningDaemon],
    base_url: str,
    relay: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> RunningDaemon:
    settings = {
        "provider": {"baseUrl": base_url, "maxRetries": 2, **(provider or {})},
        "models": MODELS,
    }
    config = {
        "api": {"base_url": base_url},
        "relay": {"enabled": True, "listen": "127.0.0.1:0", **(relay or {})},
    }
    return factory(settings, config, env={"TAOTOKEN_API_KEY": RELAY_KEY, **(env or {})})


def unix_get(daemon: RunningDaemon, method: str, path: str) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with httpx.Client(transport=transport, base_url="http://taogpud") as client:
        return client.request(method, path)


def token_of(daemon: RunningDaemon) -> tuple[str, str]:
    """(token, http://127.0.0.1:PORT) as `taogpuctl relay token` gets them."""
    answer = unix_get(daemon, "POST", "/v1/relay/token").json()
    return answer["token"], f"http://{answer['listen']}"
