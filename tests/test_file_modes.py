"""Files are private whatever the umask: a daemon started by hand under umask 022 keeps its
state directory 0700 and the store, its WAL and the kept outputs 0600."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taogpud import wire
from taogpud.arrayfiles import images


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The umask a person's shell usually has, inherited by the daemon the test starts."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def umask_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError(f"no Umask line for pid {pid}")


def test_state_is_private_under_umask_022(
    umask_022: None, daemon_factory: Callable[..., Any]
) -> None:
    """State dir 0700; jobs.sqlite3, its -wal and -shm 0600; a kept output's folders 0700 and file
    0600; the daemon and its workers run with umask 077, so whatever they make is private."""
    daemon = daemon_factory()
    with daemon.client() as client:
        job = client.run("vector_add", {"size": 1000}, keep_outputs=True)
        workers = [w["pid"] for w in client.status()["workers"]]
    assert job["status"] == "succeeded"
    state = daemon.state_dir
    assert mode(state) == 0o700
    for name in ("jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm"):
        assert mode(state / name) == 0o600, name
    output = state / "outputs" / job["id"] / "c.npy"
    assert (mode(output.parent.parent), mode(output.parent), mode(output)) == (0o700, 0o700, 0o600)
    for pid in (daemon.proc.pid, *workers):
        assert umask_of(pid) == 0o077, pid
    with daemon.client() as client:
        uploaded = client.upload_array(wire.npy_header((2,), "<f4") + bytes(8))
    image = next(images.SHM_DIR.glob(f"{images.PREFIX}{images.namespace_of(state)}.*.npy"))
    assert uploaded["nbytes"] == 8 and mode(image) == 0o600


def test_a_wider_state_dir_is_narrowed_at_start(
    umask_022: None, daemon_factory: Callable[..., Any], daemon_home: Path
) -> None:
    """A state dir an older daemon (or a person) made 0755 is 0700 once the daemon runs."""
    state = daemon_home / "d0" / "state"
    state.mkdir(parents=True)
    state.chmod(0o755)
    daemon_factory()
    assert mode(state) == 0o700
