"""The job store's write-ahead log, copied into the database file by a thread of its own.

SQLite copies the WAL into the database ("a checkpoint") inside whichever commit finds
1,000 pages in it, and with synchronous=NORMAL that commit also waits for two fsyncs. On
the event loop that was one commit in ~400 taking 5–7 ms on a quiet host, and 130 ms once
under load (tiny jobs, 1 client): every client of the daemon waited for it. So the store's
own connection never checkpoints (wal_autocheckpoint=0) and this thread does, on a second
connection: every CHECKPOINT_EVERY_S while commits come, or sooner after
CHECKPOINT_EVERY_COMMITS of them. A PASSIVE checkpoint never blocks the store's commits,
which go on into the WAL meanwhile. The WAL starts over only when a checkpoint has copied
every commit in it, and under a sustained rate there is always a newer commit behind the
checkpoint: the file grew ~35 KB a job, never truncated (346 MB after 10,000 jobs, 1.4 GB
after 100,000). So once the WAL is past WAL_LIMIT_BYTES and a passive checkpoint caught up
with what it saw, a TRUNCATE checkpoint copies the few commits since (the store's commits
wait for it, a few ms, in SQLite's busy handler) and empties the file; journal_size_limit
trims it to the limit whenever SQLite starts it over by itself. And a store that commits
MOST_COMMITS_UNCHECKED times without a checkpoint (the thread starved of CPU) waits for
one: the WAL's size is bounded by a count of commits, never by how the thread is scheduled.

A checkpoint that fails (a full disk) loses nothing: the commits are in the WAL, which
SQLite reads as part of the database, and the next interval tries again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path

from taogpud.observability.logging import get_logger

log = get_logger("taogpud.store")

CHECKPOINT_EVERY_S = 0.5
CHECKPOINT_EVERY_COMMITS = 400  # about what SQLite's own 1,000 pages held here
WAL_LIMIT_BYTES = 16 * 1024 * 1024  # past this, a checkpoint that caught up empties the WAL
# A job's commit writes ~4 pages of WAL (its row and the id index, each where the old row
# was and where the new one goes): 16 MB + 1,000 x ~17 KB keeps the WAL well under 64 MB.
MOST_COMMITS_UNCHECKED = 1000
CATCH_UP_WAIT_S = 5.0  # how long a store past MOST_COMMITS_UNCHECKED waits for the thread
TRUNCATE_BUSY_MS = 100  # how long a TRUNCATE waits for a commit or a reader in progress
# a passive checkpoint cut short is tried again this often before a reader is blamed
CATCH_UP_TRIES = 3
CATCH_UP_PAUSE_S = 0.002


class Checkpointer:
    """Copies the WAL of the database at `path` into it, off the caller's thread."""

    def __init__(self, path: Path) -> None:
        self.every_s = CHECKPOINT_EVERY_S  # read when made: tests set the module's value first
        self.checkpoints = 0  # completed (tests read it)
        self.truncations = 0  # TRUNCATE checkpoints that emptied the WAL
        self._wal_path = Path(f"{path}-wal")
        self._limit_bytes = WAL_LIMIT_BYTES
        self._most_unchecked = MOST_COMMITS_UNCHECKED
        self._db = sqlite3.connect(path, check_same_thread=False)  # this thread's alone
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA busy_timeout={TRUNCATE_BUSY_MS}")
        self._db.execute(f"PRAGMA journal_size_limit={self._limit_bytes}")
        self._commits = 0  # counted by the store's thread; read here (an int: no lock needed)
        self._copied = 0  # the commit count the last checkpoint covered
        # the commit count at the start of the last round that left the WAL within its limit
        # (or found it held by a reader): the store waits once MOST_COMMITS_UNCHECKED are past
        self._bounded_at = 0
        self._failing = False
        self._caught_up = threading.Event()  # set after each checkpoint (the store may wait)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="store-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """One more commit in the WAL (the store calls this after each)."""
        self._commits += 1
        if self._commits - self._copied >= CHECKPOINT_EVERY_COMMITS:
            self._wake.set()
        if self._commits - self._bounded_at >= self._most_unchecked:
            self._wait_for_checkpoint()

    def _wait_for_checkpoint(self) -> None:
        """The thread fell behind by MOST_COMMITS_UNCHECKED commits: let it catch up before
        one more (bounded: a checkpoint that fails does not hold the store for longer)."""
        self._caught_up.clear()
        self._wake.set()
        self._caught_up.wait(CATCH_UP_WAIT_S)

    def close(self) -> None:
        """Stop the thread and close its connection (before the store's own closes: the last
        connection to close copies what is left and removes the WAL)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._db.close()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.every_s)
            self._wake.clear()
            if self._commits != self._copied and not self._stopping:
                self._checkpoint(self._commits)
            self._caught_up.set()

    def _checkpoint(self, commits: int) -> None:
        try:
            busy, in_wal, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if self._wal_bytes() <= self._limit_bytes or self._truncate(in_wal == copied):
                self._bounded_at = commits
        except sqlite3.Error as exc:  # a full disk, an I/O error: the WAL keeps the commits
            if not self._failing:
                log.warning("store.checkpoint_failed", error=str(exc))
            self._failing = True
            return
        if self._failing:
            log.info("store.checkpoint_works_again")
        self._failing = False
        if not busy:
            self._copied = commits
            self.checkpoints += 1

    def _truncate(self, caught_up: bool) -> bool:
        """Copy the commits made since the passive checkpoint and empty the WAL; whether this
        round is done with it. A reader that holds an old snapshot (the sqlite3 shell, in a
        transaction) keeps the WAL whole: the passive checkpoint could not copy everything,
        and the store is not held for it (the next rounds try again). A TRUNCATE that found
        the store's commits in its way (busy past TRUNCATE_BUSY_MS, a loaded host) did not
        bound the WAL: the round does not count, so the store waits for the next one once
        MOST_COMMITS_UNCHECKED are past, and that one, with the store waiting, gets through."""
        if not (caught_up or self._catch_up()):  # a reader holds an old snapshot still
            return True
        busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        self.truncations += not busy
        return not busy

    def _catch_up(self) -> bool:
        """Whether a passive checkpoint, tried again a few times, copies the whole WAL. The
        store's own commit in progress holds a snapshot as a reader would, so one short
        checkpoint is not yet a reader's doing (taken for one, the round counted and the WAL
        outgrew its bound under a sustained rate: 6 MB against 5.2 in test_wal)."""
        for _ in range(CATCH_UP_TRIES):
            time.sleep(CATCH_UP_PAUSE_S)
            _, in_wal, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if in_wal == copied:
                return True
        return False

    def _wal_bytes(self) -> int:
        try:
            return self._wal_path.stat().st_size
        except FileNotFoundError:
            return 0


def open_checkpointer(path: Path) -> Checkpointer | None:
    """A Checkpointer for the store at `path`; None (SQLite's own checkpoints, on the
    loop, as before) when a second connection cannot be opened."""
    with contextlib.suppress(sqlite3.Error):
        return Checkpointer(path)
    log.warning("store.checkpoint_inline", path=str(path))
    return None
