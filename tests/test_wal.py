"""The job store's WAL is copied into the database by a thread (taogpud.wal), never inside
one of the store's commits: a checkpoint waits for fsyncs, and the store commits on the
daemon's event loop."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from taogpud import wal
from taogpud.jobs import JobRecord, JobState, Peer
from taogpud.store import JobStore
from taogpud.testing import wait_until

JOBS = 3000  # ~7,000 pages of WAL: past the 1,000 at which SQLite would checkpoint in a commit


def commit_jobs(store: JobStore, count: int) -> None:
    for number in range(count):
        job = JobRecord(id=f"{number:017x}", task="noop", params={}, peer=Peer(uid=0))
        job.status, job.result = JobState.succeeded, {"n": number}
        store.add(job)
        store.flush()  # one commit each, as a waited tiny job's answer makes


def test_no_commit_copies_the_wal_into_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the thread held back, thousands of commits leave the database file as it was:
    every page went to the WAL. (SQLite's own checkpoint, in a commit, would have grown it.)"""
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY_S", 3600.0)
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY_COMMITS", 10**9)
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    try:
        size_at_start = path.stat().st_size
        commit_jobs(store, JOBS)
        assert path.stat().st_size == size_at_start
        assert Path(f"{path}-wal").stat().st_size > 1000 * 4096
    finally:
        store.close()


def test_the_thread_copies_the_wal_and_the_store_reads_whole_beside_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread checkpoints while commits go on; a second connection (the sqlite3 shell)
    reads every record while the store is open; closed and opened again, all are there."""
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY_S", 0.05)
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    try:
        size_at_start = path.stat().st_size
        commit_jobs(store, JOBS)
        wait_until(lambda: path.stat().st_size > size_at_start, "a checkpoint by the thread")
        assert store._wal is not None and store._wal.checkpoints >= 1
        shell = sqlite3.connect(path)
        try:
            assert shell.execute("SELECT count(*) FROM jobs").fetchone()[0] == JOBS
        finally:
            shell.close()
    finally:
        store.close()
    assert not Path(f"{path}-wal").exists()  # the last connection copied the rest
    again = JobStore(path)
    try:
        assert again._db is not None
        assert again._db.execute("SELECT count(*) FROM jobs").fetchone()[0] == JOBS
    finally:
        again.close()
