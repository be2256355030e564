"""The job store's WAL is copied into the database by a thread (taogpud.jobs.wal), never inside
one of the store's commits: a checkpoint waits for fsyncs, and the store commits on the
daemon's event loop."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from taogpud.jobs import wal
from taogpud.jobs.records import JobRecord, JobState, Peer
from taogpud.jobs.store import JobStore
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
    monkeypatch.setattr(wal, "MOST_COMMITS_UNCHECKED", 10**9)  # nor made to catch up
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


def test_a_lone_record_is_committed_by_its_one_statement(tmp_path: Path) -> None:
    """The store's connection is in autocommit: a flush of one record is its own transaction,
    seen by another connection at once (a statement left inside an open transaction, as
    under the sqlite3 module's implicit BEGIN without its COMMIT, would not be)."""
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    try:
        commit_jobs(store, 1)
        assert store._db is not None and not store._db.in_transaction
        shell = sqlite3.connect(path)
        try:
            assert shell.execute("SELECT id FROM jobs").fetchall() == [(f"{0:017x}",)]
        finally:
            shell.close()
    finally:
        store.close()


def test_a_batch_is_all_or_nothing_and_a_refused_one_stays_pending(tmp_path: Path) -> None:
    """Several records go in one transaction: a row SQLite refuses writes none of them, leaves
    no transaction open, and keeps them all pending for the next flush."""
    asyncio.run(_refused_batch(JobStore(tmp_path / "jobs.sqlite3")))


async def _refused_batch(store: JobStore) -> None:
    """On a loop, as in the daemon: the records wait for the flush instead of being written
    as they are added."""
    try:
        good = JobRecord(id="a" * 17, task="noop", params={}, peer=Peer(uid=0))
        bad = JobRecord(id="b" * 17, task="noop", params={}, peer=Peer(uid=0))
        bad.created_at = None  # type: ignore[assignment]  # the jobs table's NOT NULL refuses it
        store.add(good)
        store.add(bad)
        with pytest.raises(sqlite3.IntegrityError):
            store.flush()
        assert store._db is not None and not store._db.in_transaction
        assert store._db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
        assert not store.committed(good.id)
        bad.created_at = 1.0
        assert set(store.flush()) == {good.id, bad.id}
        assert store._db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 2
    finally:
        store.close()


def largest_wal_while_committing(store: JobStore, path: Path, jobs: int) -> int:
    """The WAL's largest size, looked at every 50 jobs, while `jobs` jobs are each committed
    three times (submit, start, finish: a tiny job not waited for) as fast as they can be."""
    largest = 0
    wal_file = Path(f"{path}-wal")
    for number in range(jobs):
        job = JobRecord(id=f"{number:017x}", task="noop", params={}, peer=Peer(uid=0))
        store.add(job)
        store.flush()
        job.status = JobState.running
        store.save(job)
        store.flush()
        job.status, job.result = JobState.succeeded, {"n": number}
        store.save(job)
        store.flush()
        if number % 50 == 0 and wal_file.exists():
            largest = max(largest, wal_file.stat().st_size)
    return largest


def test_the_wal_stays_bounded_by_count_under_a_sustained_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits that never pause (each checkpoint ends with newer commits behind it, so the WAL
    could never start over) leave a WAL no larger than its limit and what the commits allowed
    before the thread must catch up: bounded by a count of commits, however the thread is
    scheduled. (It grew ~35 KB a job, never truncated: 346 MB after 10,000 jobs.)"""
    monkeypatch.setattr(wal, "WAL_LIMIT_BYTES", 256 * 1024)
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY_COMMITS", 50)
    monkeypatch.setattr(wal, "MOST_COMMITS_UNCHECKED", 200)
    path = tmp_path / "jobs.sqlite3"
    store = JobStore(path)
    try:
        largest = largest_wal_while_committing(store, path, 2000)
        # 200 commits of ~4 pages (4 KiB and a frame header each) past the limit at most
        assert largest <= 256 * 1024 + 200 * 6 * 4120, largest
        assert store._db is not None
        assert store._db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 2000
    finally:
        store.close()
