"""The job store's write-ahead log, copied into the database file by a thread of its own.

SQLite copies the WAL into the database ("a checkpoint") inside whichever commit finds
1,000 pages in it, and with synchronous=NORMAL that commit also waits for two fsyncs. On
the event loop that was one commit in ~400 taking 5–7 ms on a quiet host, and 130 ms once
under load (tiny jobs, 1 client): every client of the daemon waited for it. So the store's
own connection never checkpoints (wal_autocheckpoint=0) and this thread does, on a second
connection: every CHECKPOINT_EVERY_S while commits come, or sooner after
CHECKPOINT_EVERY_COMMITS of them. A PASSIVE checkpoint never blocks the store's commits,
which go on into the WAL meanwhile; once one has copied everything, the next commit starts
the WAL over from its beginning, so the file stays about one interval's commits long.

A checkpoint that fails (a full disk) loses nothing: the commits are in the WAL, which
SQLite reads as part of the database, and the next interval tries again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

from taogpud.logging import get_logger

log = get_logger("taogpud.store")

CHECKPOINT_EVERY_S = 0.5
CHECKPOINT_EVERY_COMMITS = 400  # about what SQLite's own 1,000 pages held here


class Checkpointer:
    """Copies the WAL of the database at `path` into it, off the caller's thread."""

    def __init__(self, path: Path) -> None:
        self.every_s = CHECKPOINT_EVERY_S  # read when made: tests set the module's value first
        self.checkpoints = 0  # completed (tests read it)
        self._db = sqlite3.connect(path, check_same_thread=False)  # this thread's alone
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._commits = 0  # counted by the store's thread; read here (an int: no lock needed)
        self._copied = 0  # the commit count the last checkpoint covered
        self._failing = False
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="store-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """One more commit in the WAL (the store calls this after each)."""
        self._commits += 1
        if self._commits - self._copied >= CHECKPOINT_EVERY_COMMITS:
            self._wake.set()

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

    def _checkpoint(self, commits: int) -> None:
        try:
            busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
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


def open_checkpointer(path: Path) -> Checkpointer | None:
    """A Checkpointer for the store at `path`; None (SQLite's own checkpoints, on the
    loop, as before) when a second connection cannot be opened."""
    with contextlib.suppress(sqlite3.Error):
        return Checkpointer(path)
    log.warning("store.checkpoint_inline", path=str(path))
    return None
