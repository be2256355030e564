"""The daemon's state (taogpud/daemon/state.py): frozen services built in dependency order,
a small mutable status whose phase is an enum, and a reloader that acts only when ready.

Real parts: a real job store (SQLite), array store, local pool (with no workers: nothing is
spawned) and scheduler; the config pair is written and loaded as the daemon would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from taogpud import config
from taogpud.arrayfiles.store import ArrayStore
from taogpud.daemon.reload import Reloader
from taogpud.daemon.state import DaemonState, DaemonStatus, Limits, Phase
from taogpud.doors import Doors
from taogpud.host.systemd import Notifier
from taogpud.jobs.policy import Policy
from taogpud.jobs.scheduler import Scheduler
from taogpud.jobs.store import JobStore
from taogpud.pool.executor import create_pool
from taogpud.testing import CPU_CONFIG, CPU_SETTINGS, to_toml
from taogpud.wire import ReloadView


@pytest.fixture
def state(tmp_path: Path) -> Iterator[DaemonState]:
    """A DaemonState built as daemon/compose.py builds it: pool before scheduler."""
    settings, config_file = tmp_path / "settings.json", tmp_path / "config.toml"
    settings.write_text(json.dumps(CPU_SETTINGS))
    config_file.write_text(to_toml(CPU_CONFIG))
    snapshot = config.load(settings, config_file, environ={})
    store = JobStore(tmp_path / "jobs.sqlite3")
    arrays = ArrayStore(1 << 20, store, "state-test")
    pool = create_pool(snapshot, [])
    scheduler = Scheduler(Policy.from_snapshot(snapshot), store, arrays, pool, tmp_path / "out")
    status = DaemonStatus(snapshot, "cpu", None)
    reloader = Reloader(status, (pool, scheduler, arrays), Notifier(), settings, config_file)
    doors = Doors(lambda: snapshot.config.server, 1024)
    yield DaemonState(status, store, arrays, pool, scheduler, reloader.reload, doors, Limits())
    store.close()


def test_services_are_frozen_and_the_status_is_not(state: DaemonState) -> None:
    """No service is assigned after start; the phase and generation change in the status."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.scheduler = state.scheduler  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.status = state.status  # type: ignore[misc]
    state.status.phase = Phase.ready
    state.status.generation += 1
    assert (state.status.phase, state.status.generation) == (Phase.ready, 2)


def test_the_scheduler_holds_the_pool_it_was_built_over(state: DaemonState) -> None:
    """The pool is built first and given to the scheduler: the same object, from the start."""
    assert state.scheduler.pool is state.pool


def test_a_new_status_starts_in_the_starting_phase(state: DaemonState) -> None:
    """Every daemon starts `starting`, generation 1, with no failed reload."""
    assert state.status.phase is Phase.starting
    assert state.status.generation == 1
    assert state.status.last_reload == ReloadView(ok=True)


@pytest.mark.parametrize(
    ("phase", "start"),
    [
        (Phase.starting, "cpu: workers 0/0 warm"),
        (Phase.ready, "cpu: workers 0/0 warm"),
        (Phase.draining, "draining, cpu:"),
        (Phase.stopping, "stopping, cpu:"),
    ],
)
def test_status_line_names_a_stopping_phase(state: DaemonState, phase: Phase, start: str) -> None:
    """STATUS= begins with the phase while the daemon drains or stops."""
    state.status.phase = phase
    assert state.status_line().startswith(start)


def test_phases_are_the_words_health_reports() -> None:
    """/v1/health and /v1/status report the phase's value; clients compare these words."""
    assert [p.value for p in Phase] == ["starting", "ready", "draining", "stopping"]


@pytest.mark.parametrize("phase", [Phase.starting, Phase.draining, Phase.stopping])
def test_a_reload_asked_before_ready_or_while_stopping_is_dropped(
    state: DaemonState, phase: Phase, tmp_path: Path
) -> None:
    """SIGHUP or a save seen while the daemon is not ready changes nothing and says why."""
    state.status.phase = phase
    reloader = Reloader(
        state.status, (state.pool, state.scheduler, state.arrays), Notifier(), None, None
    )
    with capture_logs() as events:
        reloader.request("SIGHUP")  # outside an event loop: it would raise if it scheduled
    assert [e["event"] for e in events] == ["config.reload_ignored"]
    assert events[0]["phase"] == phase.value
    assert state.status.generation == 1
