"""The job store: every job the daemon accepted, in SQLite (WAL) under the state directory.

A job is written before its id is returned, and again at each state change (within 2 ms,
in one commit with its neighbours, and before anyone is told of it: tell),
so a restart — clean or `kill -9` — finds every accepted job as a client last saw it:
queued ones run, ones that were running are marked interrupted (or run again when they
allow retries).
Recent jobs are also kept in memory for reads; finished ones are bounded by count
and age. WAL with synchronous=NORMAL survives a crash of the daemon at the cost
of a few microseconds per write; only a power cut can lose the last commits. The WAL is
copied into the database by a thread of its own (taogpud.jobs.wal), never inside a commit.

A store that cannot be read (not a database, or, after a crash, it fails its integrity
check) is moved aside (never deleted) and a fresh one started, with a log line saying
where the old one went; `damaged_at_start` then tells housekeeping that the store no
longer knows which kept outputs are whose. A store that is busy ("database is locked":
another process holds it) is never taken for damage: that is an error at start.

A commit that fails (ENOSPC, EIO) keeps every pending record pending: they are written
by the next commit that succeeds (retried every WRITE_RETRY_S), and meanwhile
`check_writable` refuses new jobs with StateDiskFull (507), naming the state directory
and the space left on it.

Commit before tell: nobody hears of a job's change before a commit holds it — a client's
answer, a worker's order, the trace. Every telling goes through one function, JobStore.tell,
which says what each does while the disk refuses commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from taogpud.errors import StateDiskFull
from taogpud.jobs import wal
from taogpud.jobs.records import JobRecord, JobState
from taogpud.observability.logging import get_logger

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS arrays (
    id TEXT PRIMARY KEY,
    ref TEXT NOT NULL
);
-- The jobs a restart takes back, found without reading the finished ones (a start that read
-- every row took twice as long at 100,000 stored jobs); small: a job leaves it as it ends.
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs(created_at) WHERE finished_at IS NULL;
"""
UNFINISHED = (JobState.queued.value, JobState.running.value)
# State changes are committed together at most this long after they happen (and always
# before an answer that shows them): a submit, its start and its finish usually share one
# commit, and under load many jobs share one.
FLUSH_DELAY_S = 0.002
WRITE_RETRY_S = 1.0  # after a failed commit, how often the pending records are tried again
# SQLite's names for a write the disk refused; anything else is a bug, raised as it is.
WRITE_FAILURES = frozenset({"SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN"})

log = get_logger("taogpud.store")
T = TypeVar("T")


class Tell(enum.Enum):
    """Who hears of a change (JobStore.tell), which decides what a refused commit does."""

    # A client's answer, a worker's order: told once the commit is tried. On a full disk they
    # go all the same, the records kept pending: reads are served and accepted jobs run
    # rather than wait for space (only a crash before it frees could undo what was shown).
    ANSWER = "answer"
    # A new job's id: on a full disk nobody is told (StateDiskFull) unless some commit holds
    # the job already; a 201 never names a job that a restart would not find.
    ACCEPTANCE = "acceptance"
    # The trace: told with the next commit that succeeds (within FLUSH_DELAY_S, none forced;
    # on a full disk, once space returns), never of a job discarded meanwhile.
    TRACE = "trace"


class JobStore:
    def __init__(
        self,
        path: Path | None = None,
        keep_finished: int = 10_000,
        keep_finished_s: float = 7 * 86400,
    ) -> None:
        """`path` None keeps everything in memory only (tests of the scheduler alone)."""
        self.path = path
        self.keep_finished = keep_finished
        self.keep_finished_s = keep_finished_s
        self._recent: OrderedDict[str, JobRecord] = OrderedDict()
        self._done: dict[str, asyncio.Event] = {}
        self._when_finished: dict[str, list[Callable[[], None]]] = {}  # see when_finished()
        self._finished_in_memory = 0
        self._dirty: dict[str, JobRecord] = {}  # written at the next flush
        self._unwritten: set[str] = set()  # added, not yet in any commit
        # (job id, trace line) to tell once the pending changes are committed (tell)
        self._after_commit: list[tuple[str, Callable[[], object]]] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self.write_failure: str | None = None  # why the last commit failed; None once one works
        # The records the last flush wrote, as JSON by job id: a submit is answered with the
        # same text (Scheduler.commit, api/programs.py)
        self.written: dict[str, str] = {}
        self.damaged_at_start = False
        self._db: sqlite3.Connection | None = None
        self._wal: wal.Checkpointer | None = None  # checkpoints off the loop (taogpud.jobs.wal)
        if path is not None:
            self._db, self.damaged_at_start = _open(path)
            self._wal = wal.open_checkpointer(path)
            if self._wal is not None:
                self._db.execute("PRAGMA wal_autocheckpoint=0")  # never inside a commit
            self._db.execute(f"PRAGMA journal_size_limit={wal.WAL_LIMIT_BYTES}")

    # -- writes ---------------------------------------------------------------------------

    def add(self, job: JobRecord) -> None:
        self._recent[job.id] = job
        self._done[job.id] = asyncio.Event()
        if self._db is not None:
            self._unwritten.add(job.id)
        self._write(job)

    def discard(self, job_id: str) -> None:
        """Forget a job that was never committed (its submit was refused)."""
        self._recent.pop(job_id, None)
        self._dirty.pop(job_id, None)
        self._unwritten.discard(job_id)
        self._when_finished.pop(job_id, None)
        self._after_commit = [entry for entry in self._after_commit if entry[0] != job_id]
        event = self._done.pop(job_id, None)
        if event is not None:
            if event.is_set():
                self._finished_in_memory -= 1
            event.set()  # nobody waits forever for a job that is not

    def committed(self, job_id: str) -> bool:
        """Whether some commit has written the job (in any state)."""
        return job_id not in self._unwritten

    def check_writable(self) -> None:
        """Raise StateDiskFull while commits fail (after trying the pending ones once more)."""
        if self.write_failure is not None:
            self.flush()

    def save(self, job: JobRecord) -> None:
        self._write(job)

    @overload
    def tell(
        self,
        tell: Callable[[], T],
        how: Literal[Tell.ANSWER, Tell.ACCEPTANCE] = Tell.ANSWER,
        job_id: str | None = None,
    ) -> T: ...

    @overload
    def tell(self, tell: Callable[[], None], how: Literal[Tell.TRACE], job_id: str) -> None: ...

    def tell(
        self, tell: Callable[[], T], how: Tell = Tell.ANSWER, job_id: str | None = None
    ) -> T | None:
        """Commit before tell, the one place it is done: `tell` (an answer, an order, a trace
        line) is called once a commit holds every change written so far, so nothing anyone
        hears of is undone by a kill -9 just after. `how` says what a disk that refuses the
        commit does (Tell); `job_id` is the job an acceptance or a trace line is of.

        A waiter (finished, when_finished, a lease's or a log's event) is woken at once and
        tells only through here: a commit per wake-up would undo FLUSH_DELAY_S's batching.
        One order leaves ahead of its commit, on purpose: that of a job placed at its submit
        (Orders.send from Scheduler.submit), no one's until its acceptance is committed here."""
        if how is Tell.TRACE:
            assert job_id is not None
            self._with_next_commit(job_id, tell)
            return None
        try:
            self.flush()
        except StateDiskFull:
            if how is Tell.ACCEPTANCE and (job_id is None or not self.committed(job_id)):
                raise
        return tell()

    def _with_next_commit(self, job_id: str, tell: Callable[[], object]) -> None:
        """At once when nothing is pending (or the store is in memory only), else right after
        the next commit that succeeds (_committed); never if the job is discarded first."""
        if self._db is None or not self._dirty:
            tell()
        else:
            self._after_commit.append((job_id, tell))

    def mark_finished(self, job: JobRecord) -> None:
        """Write the final record and wake every waiter; forget the oldest in memory."""
        self._write(job)
        event = self._done.get(job.id)
        if event is None:
            return  # withdrawn: no record is kept
        event.set()
        for callback in self._when_finished.pop(job.id, ()):
            asyncio.get_running_loop().call_soon(callback)
        self._finished_in_memory += 1
        if self._finished_in_memory > self.keep_finished:
            self._forget_oldest_finished()

    def prune(self, now: float | None = None) -> int:
        """Delete finished jobs past the age limit or beyond the count limit; returns how many."""
        if self._db is None:
            return 0
        self.flush()
        cutoff = (now or time.time()) - self.keep_finished_s
        with _transaction(self._db):
            aged = self._db.execute(
                "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at < ?", (cutoff,)
            ).rowcount
            counted = self._db.execute(
                "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE finished_at IS NOT NULL "
                "ORDER BY finished_at DESC LIMIT -1 OFFSET ?)",
                (self.keep_finished,),
            ).rowcount
        if aged + counted:
            # a script: the module steps it to the end (execute() frees one page a call)
            self._db.executescript("PRAGMA incremental_vacuum;")  # freed pages back to the disk
        return aged + counted

    # -- reads ----------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        job = self._recent.get(job_id)
        if job is not None or self._db is None:
            return job
        row = self._db.execute("SELECT record FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord.model_validate_json(row[0]) if row else None

    def recent(self, status: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        """Newest first."""
        picked: list[JobRecord] = []
        for job in reversed(self._recent.values()):
            if status is None or job.status == status:
                picked.append(job)
                if len(picked) >= limit:
                    break
        return picked

    def when_finished(self, job_id: str, callback: Callable[[], None]) -> bool:
        """Have `callback` called soon after the job finishes, like a waiter woken, outside
        the scheduler's own step; False (and no call) when it has finished already."""
        event = self._done.get(job_id)
        if event is None or event.is_set():
            return False
        self._when_finished.setdefault(job_id, []).append(callback)
        return True

    def forget(self, job_id: str, callback: Callable[[], None]) -> None:
        """Undo when_finished (the waiter gave up first)."""
        callbacks = self._when_finished.get(job_id, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if not callbacks:
            self._when_finished.pop(job_id, None)

    async def wait(self, job_id: str, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.finished(job_id)

    async def finished(self, job_id: str) -> None:
        """Until the job finished, however long: the caller bounds the wait (api/jobs.py)."""
        event = self._done.get(job_id)
        if event is not None and not event.is_set():
            await event.wait()

    # -- restart --------------------------------------------------------------------------

    def unfinished(self) -> list[JobRecord]:
        """Jobs a previous run accepted and did not finish, oldest first, now in memory too."""
        if self._db is None:
            return []
        rows = self._db.execute(
            "SELECT record FROM jobs WHERE finished_at IS NULL AND status IN (?, ?) "
            "ORDER BY created_at",
            UNFINISHED,
        ).fetchall()
        jobs = [JobRecord.model_validate_json(row[0]) for row in rows]
        for job in jobs:
            self._recent[job.id] = job
            self._done[job.id] = asyncio.Event()
        return jobs

    def load_recent(self, limit: int) -> None:
        """Bring the last finished jobs back into memory so `list` shows them after a restart.
        Last written, last in rowid (a record is written anew, REPLACE, at its end): read
        from the end of the table, however many it holds."""
        if self._db is None:
            return
        rows = self._db.execute(
            "SELECT record FROM jobs WHERE finished_at IS NOT NULL ORDER BY rowid DESC LIMIT ?",
            (limit,),
        ).fetchall()
        for row in reversed(rows):
            job = JobRecord.model_validate_json(row[0])
            self._recent[job.id] = job
            self._done[job.id] = _set_event()
            self._finished_in_memory += 1

    # -- arrays (uploaded inputs survive a daemon restart while /dev/shm keeps them) ------

    def put_array(self, array_id: str, ref: dict[str, Any]) -> None:
        """Raises StateDiskFull when the disk refuses it (the upload is then refused)."""
        if self._db is not None:
            try:
                self._db.execute(  # one statement: its own transaction (_connect)
                    "INSERT OR REPLACE INTO arrays VALUES (?, ?)", (array_id, json.dumps(ref))
                )
            except sqlite3.OperationalError as exc:
                if not _write_failure(exc):
                    raise
                raise self._write_failed(exc) from exc

    def delete_array(self, array_id: str) -> None:
        """A row the disk does not let go of is harmless: restore() drops rows whose image
        is gone."""
        if self._db is not None:
            try:
                self._db.execute("DELETE FROM arrays WHERE id = ?", (array_id,))
            except sqlite3.OperationalError as exc:
                if not _write_failure(exc):
                    raise
                log.warning("store.array_row_kept", array_id=array_id, error=str(exc))

    def arrays(self) -> dict[str, dict[str, Any]]:
        if self._db is None:
            return {}
        rows = self._db.execute("SELECT id, ref FROM arrays").fetchall()
        return {array_id: json.loads(ref) for array_id, ref in rows}

    def close(self) -> None:
        """Commit what is pending, then close. A disk still full at the stop loses what is
        pending (the log says how many records): nothing else can keep them."""
        try:
            self.flush()
        except StateDiskFull as exc:
            log.error("store.unwritten_at_stop", records=len(self._dirty), error=exc.message)
            self._committed()  # the trace keeps what happened; the line above says it is lost
        if self._wal is not None:
            self._wal.close()
            self._wal = None
        if self._db is not None:
            self._db.close()  # the last connection: SQLite copies the rest and removes the WAL
            self._db = None

    # -- internals ------------------------------------------------------------------------

    def _write(self, job: JobRecord) -> None:
        """Mark the job for the next flush (within FLUSH_DELAY_S; the API flushes before it
        answers with a job, so an id a client holds is always on disk)."""
        if self._db is None:
            return
        self._dirty[job.id] = job
        if self._flush_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool or a test using the store alone): write now
            self.flush()
            return
        self._flush_timer = loop.call_later(FLUSH_DELAY_S, self._flush_in_background)

    def _flush_in_background(self) -> None:
        """The timer's flush: a failure is kept (write_failure) and retried, never raised
        into the event loop."""
        self._flush_timer = None
        with contextlib.suppress(StateDiskFull):
            self.flush()

    def flush(self) -> dict[str, str]:
        """Commit every pending change; returns the records written, as JSON by job id (the
        API answers with the same text). A commit the disk refuses raises StateDiskFull and
        leaves every record pending, to be written by a later flush."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self.written = {}
        if self._db is None or not self._dirty:
            self._committed()
            return self.written
        rows = [
            (job.id, job.status.value, job.created_at, job.finished_at, job.model_dump_json())
            for job in self._dirty.values()
        ]
        try:
            _write_rows(self._db, rows)
        except sqlite3.OperationalError as exc:
            if not _write_failure(exc):
                raise
            raise self._write_failed(exc) from exc
        if self._wal is not None:
            self._wal.committed()
        self._dirty.clear()
        self._unwritten.clear()
        if self.write_failure is not None:
            log.warning("store.writable_again", pending_written=len(rows))
            self.write_failure = None
        self.written = {row[0]: row[4] for row in rows}
        self._committed()
        return self.written

    def _committed(self) -> None:
        """Everything written is in a commit: call what waited for it, in order."""
        callbacks, self._after_commit = self._after_commit, []
        for _, callback in callbacks:
            callback()

    def _write_failed(self, exc: sqlite3.OperationalError) -> StateDiskFull:
        """Note the failure, have the pending records tried again, and say what is wrong."""
        assert self.path is not None
        folder = self.path.parent
        free = _free_bytes(folder)
        first = self.write_failure is None
        self.write_failure = f"{exc} ({free:,} bytes free in {folder})"
        if first:
            log.error("store.write_failed", error=str(exc), state_dir=str(folder), free_bytes=free)
        with contextlib.suppress(RuntimeError):  # no loop: the caller's next flush retries
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(WRITE_RETRY_S, self._flush_in_background)
        return StateDiskFull(
            f"the job store in {folder} cannot be written ({exc}); {free:,} bytes are free "
            "there. No new job is taken until it can; jobs already accepted are kept",
            f"free space on the file system of {folder}; taogpud writes what is pending "
            "as soon as it can",
        )

    def _forget_oldest_finished(self) -> None:
        for job_id, job in self._recent.items():
            if job.status.finished:
                del self._recent[job_id]
                self._done.pop(job_id, None)
                self._finished_in_memory -= 1
                return


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


def _write_failure(exc: sqlite3.OperationalError) -> bool:
    return (getattr(exc, "sqlite_errorname", None) or "") in WRITE_FAILURES


def _free_bytes(folder: Path) -> int:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


def _open(path: Path) -> tuple[sqlite3.Connection, bool]:
    """The store, and whether a damaged one was moved aside to start it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _connect(path), False
    except sqlite3.DatabaseError as exc:
        if not _unreadable(exc):
            raise  # busy, locked, the disk: an error at start, never "damage"
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            damaged = Path(f"{path}{suffix}")
            if damaged.exists():
                damaged.rename(Path(f"{aside}{suffix}"))
        log.error(
            "store.damaged",
            path=str(path),
            moved_to=str(aside),
            error=str(exc),
            hint="a fresh store was started; jobs in the damaged file are not run again",
        )
        return _connect(path), True


INSERT_JOB = "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?)"


def _write_rows(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """One commit of job rows. A lone row (a tiny job's submit, start and finish, written
    before its answer) is one statement, which SQLite commits by itself: the sqlite3 module's
    implicit BEGIN and its COMMIT were two more steps of the engine, each letting go of the
    GIL and taking it back. In eight alternating pairs of 3,000 sequential tiny jobs that took
    the p50 from 0.751 to 0.696 ms (medians of the pairs) and the daemon's CPU per job lower
    in seven (docs/performance.md)."""
    if len(rows) == 1:
        db.execute(INSERT_JOB, rows[0])
        return
    with _transaction(db):
        db.executemany(INSERT_JOB, rows)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """Statements as one transaction on an autocommit connection: all or none of them."""
    db.execute("BEGIN")
    try:
        yield
        db.execute("COMMIT")  # a COMMIT the disk refuses is rolled back below, as the rest
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


def _unreadable(exc: sqlite3.DatabaseError) -> bool:
    """Only a file that is not a database, or one that fails its check, is damage."""
    if isinstance(exc, sqlite3.OperationalError):
        return False  # "database is locked", "unable to open", "disk I/O error"
    name = getattr(exc, "sqlite_errorname", None) or ""  # "": raised by _connect's check
    return name in ("SQLITE_NOTADB", "SQLITE_CORRUPT", "")


def _connect(path: Path) -> sqlite3.Connection:
    # Autocommit (isolation_level None): the sqlite3 module opens no transaction by itself, so
    # a lone statement is its own (SQLite's) and several go in _transaction.
    crashed = Path(f"{path}-wal").exists()  # the last connection to close removes the WAL
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        _check(db, crashed)
        # Not locking_mode=EXCLUSIVE (two fcntl calls a commit fewer): the checkpoints run on a
        # connection of their own (taogpud.jobs.wal), and the sqlite3 shell may read the store
        # while the daemon runs. One daemon per state directory is daemon/state_lock.py's.
        _vacuum_incrementally(db)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
    except BaseException:
        db.close()
        raise
    return db


def _check(db: sqlite3.Connection, crashed: bool) -> None:
    """After a crash (a WAL left behind: kill -9, a power cut) the whole file is checked
    (quick_check: every page, 0.67 s at 100,000 stored jobs); after a clean stop only that
    it is a database whose schema reads, so that a start takes as long at 100,000 jobs as
    at none. A page damaged since a clean stop shows when it is read."""
    if not crashed:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # SQLITE_NOTADB
    elif db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
        raise sqlite3.DatabaseError("the integrity check failed")


def _vacuum_incrementally(db: sqlite3.Connection) -> None:
    """Pages freed by a prune go back to the file system (incremental_vacuum), instead of
    staying in the file for ever. A new store is made so; one made before is converted once,
    by a VACUUM (its size's worth of copying, at that one start)."""
    if db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # 2: incremental
        return
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        log.info("store.converting", to="auto_vacuum=incremental")
        db.execute("VACUUM")
