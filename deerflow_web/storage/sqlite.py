"""One SQLite connection per OS thread, for the embedded databases (records, chat turns).

sqlite3 connections must not be shared across threads, and every server process opens its
own; WAL mode lets readers go on while one writer commits, and a generous busy timeout
turns a write collision between processes into a short wait instead of an error.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

BUSY_TIMEOUT_SECONDS = 60


def connect(db_path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (callers open transactions with BEGIN themselves)."""
    db = sqlite3.connect(
        db_path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
    )
    db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_SECONDS * 1000}")
    db.execute("PRAGMA synchronous = NORMAL")
    return db


class ThreadConnections:
    """The database file at `db_path`, set up with `schema` once, one connection per thread.

    `prepare()` creates the folder, turns WAL on and runs the schema; the first `get()` in
    any thread does it when nobody has yet, so a store can stay lazy (no file until used).
    """

    def __init__(self, db_path: Path, schema: str) -> None:
        self.db_path = db_path
        self._schema = schema
        self._local = threading.local()
        self._prepared = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        with self._lock:
            if self._prepared:
                return
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            with closing(connect(self.db_path)) as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(self._schema)
            self._prepared = True

    def get(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        db = getattr(self._local, "db", None)
        if db is None:
            self.prepare()
            db = self._local.db = connect(self.db_path)
        return db

    def close(self) -> None:
        """Close this thread's connection (tests open many stores)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
