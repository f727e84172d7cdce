"""Connections to the embedded SQLite databases (records, chat turns).

sqlite3 connections must not be shared across threads, and every server process opens its
own; WAL mode lets readers go on while one writer commits, and a generous busy timeout
turns a write collision between processes into a short wait instead of an error.

`ThreadConnections` keeps one connection per thread. `ConnectionPool` lends connections
instead, for the hot records store: under the gevent server every request is a short-lived
greenlet, and a connection per greenlet would be opened and dropped on every request. Its
connections give SQLite's own busy handler only a few milliseconds, because that handler
sleeps inside the C library and would freeze every greenlet of the process; `write` waits
for the rest with a Python sleep, which gevent turns into a cooperative one.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import closing
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_SECONDS = 60
BUSY_SLICE_SECONDS = 0.005  # what SQLite's own busy handler gets on pooled connections
IDLE_CONNECTIONS = 8  # pooled connections kept open per process


def connect(db_path: Path, busy_seconds: float = BUSY_TIMEOUT_SECONDS) -> sqlite3.Connection:
    """A connection in autocommit mode (callers open transactions with BEGIN themselves)."""
    db = sqlite3.connect(
        db_path, timeout=busy_seconds, isolation_level=None, check_same_thread=False
    )
    db.execute(f"PRAGMA busy_timeout = {int(busy_seconds * 1000)}")
    db.execute("PRAGMA synchronous = NORMAL")
    return db


def write(db: sqlite3.Connection, sql: str, params: tuple = ()) -> sqlite3.Cursor:
    """Run a statement that needs the write lock, waiting for it with a Python sleep."""
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    delay = 0.001
    while True:
        try:
            return db.execute(sql, params)
        except sqlite3.OperationalError as error:
            busy = "locked" in str(error) or "busy" in str(error)
            if not busy or time.monotonic() > deadline:
                raise
        time.sleep(delay)  # gevent's sleep when the server runs on gevent
        delay = min(delay * 2, 0.05)


class PooledConnection:
    """One pooled connection and whatever its user caches alongside it."""

    __slots__ = ("db", "cache")

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.cache: OrderedDict[Any, Any] = OrderedDict()


class ConnectionPool:
    """The database file at `db_path`, set up with `schema` at once, connections lent out."""

    def __init__(self, db_path: Path, schema: str) -> None:
        self.db_path = db_path
        self._idle: list[PooledConnection] = []
        self._lock = threading.Lock()
        db_path.parent.mkdir(parents=True, exist_ok=True)
        with closing(connect(db_path)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(schema)

    @contextmanager
    def borrow(self) -> Iterator[PooledConnection]:
        """An idle connection, or a new one; back in the pool afterwards (a few are kept)."""
        with self._lock:
            pooled = self._idle.pop() if self._idle else None
        if pooled is None:
            pooled = PooledConnection(connect(self.db_path, BUSY_SLICE_SECONDS))
        try:
            yield pooled
        finally:
            with self._lock:
                keep = len(self._idle) < IDLE_CONNECTIONS and not pooled.db.in_transaction
                if keep:
                    self._idle.append(pooled)
            if not keep:
                pooled.db.close()

    def close(self) -> None:
        """Close the idle connections (tests open many stores)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for pooled in idle:
            pooled.db.close()


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
