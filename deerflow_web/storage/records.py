"""The thread's `uploads` record set (SPEC D10) in an embedded SQLite database.

One database under the base dir serves every thread and every server process: SQLite's own
locking makes a record write and the rename it describes one step, across processes, which
an in-memory lock could not. `UploadRecords` is the narrow surface a server database could
implement later.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.storage.sqlite import ConnectionPool
from deerflow_web.storage.sqlite import PooledConnection
from deerflow_web.storage.sqlite import write

SCHEMA = """
CREATE TABLE IF NOT EXISTS uploads (
    scope TEXT NOT NULL,
    filename TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    content_type TEXT NOT NULL,
    uploaded_at REAL NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    source TEXT NOT NULL,
    original_filename TEXT,
    converted_from TEXT,
    conversion_state TEXT,
    conversion_error TEXT,
    conversion_owner TEXT,
    source_sha256 TEXT,
    PRIMARY KEY (scope, filename)
) WITHOUT ROWID;
"""
# Columns added after the first release, with their type: databases made before get them
# at start-up (existing rows read NULL).
ADDED_COLUMNS = (("source_sha256", "TEXT"),)

CACHED_SCOPES = 64  # threads whose records each pooled connection keeps in memory

_COLUMNS = (
    "filename, size, sha256, content_type, uploaded_at, mtime_ns, inode, source, "
    "original_filename, converted_from, conversion_state, conversion_error, source_sha256"
)


@dataclass(frozen=True)
class StoredRecord:
    """A record plus the file identity (inode, mtime) used to notice drift on disk."""

    record: UploadRecord
    mtime_ns: int
    inode: int


@dataclass(frozen=True)
class ThreadSummary:
    """What the threads index shows for one thread."""

    scope: str
    file_count: int
    total_size: int
    last_change: float


_SOURCES = {source.value: source for source in RecordSource}
_STATES = {state.value: state for state in ConversionState}


def _to_stored(row: tuple) -> StoredRecord:
    (
        filename,
        size,
        sha256,
        content_type,
        uploaded_at,
        mtime_ns,
        inode,
        source,
        original,
        converted_from,
        state,
        error,
        source_sha256,
    ) = row
    return StoredRecord(
        record=UploadRecord(
            filename=filename,
            size=size,
            sha256=sha256,
            content_type=content_type,
            uploaded_at=uploaded_at,
            modified=mtime_ns / 1e9,
            source=_SOURCES[source],
            original_filename=original,
            converted_from=converted_from,
            conversion_state=_STATES[state] if state else None,  # dict: Enum() is slow
            conversion_error=error,
            source_sha256=source_sha256,
        ),
        mtime_ns=mtime_ns,
        inode=inode,
    )


class RecordsTransaction(Protocol):
    """Writes made while the records are locked; they land together or not at all."""

    def get(self, filename: str) -> StoredRecord | None: ...
    def all(self) -> list[StoredRecord]: ...
    def put(self, stored: StoredRecord) -> None: ...
    def delete(self, filename: str) -> None: ...


class UploadRecords(Protocol):
    """The record store: read freely, write only inside `locked`."""

    def all(self, scope: str) -> list[StoredRecord]: ...
    def get(self, scope: str, filename: str) -> StoredRecord | None: ...
    def locked(self, scope: str) -> AbstractContextManager[RecordsTransaction]: ...
    def set_conversion(
        self,
        scope: str,
        filename: str,
        state: ConversionState | None,
        error: str | None = None,
        owner: str | None = None,
    ) -> bool: ...
    def conversion_owner(self, scope: str, filename: str) -> str | None: ...
    def find_conversions(
        self, states: Iterable[ConversionState]
    ) -> list[tuple[str, str, str | None]]: ...
    def summaries(self) -> list[ThreadSummary]: ...
    def ping(self) -> None: ...


class _SQLiteTransaction:
    def __init__(self, connection: sqlite3.Connection, scope: str) -> None:
        self._db = connection
        self._scope = scope

    def get(self, filename: str) -> StoredRecord | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM uploads WHERE scope = ? AND filename = ?",
            (self._scope, filename),
        ).fetchone()
        return _to_stored(row) if row else None

    def all(self) -> list[StoredRecord]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM uploads WHERE scope = ? ORDER BY filename", (self._scope,)
        ).fetchall()
        return [_to_stored(row) for row in rows]

    def put(self, stored: StoredRecord) -> None:
        r = stored.record
        self._db.execute(
            f"INSERT OR REPLACE INTO uploads (scope, {_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._scope,
                r.filename,
                r.size,
                r.sha256,
                r.content_type,
                r.uploaded_at,
                stored.mtime_ns,
                stored.inode,
                r.source.value,
                r.original_filename,
                r.converted_from,
                r.conversion_state.value if r.conversion_state else None,
                r.conversion_error,
                r.source_sha256,
            ),
        )

    def delete(self, filename: str) -> None:
        self._db.execute(
            "DELETE FROM uploads WHERE scope = ? AND filename = ?", (self._scope, filename)
        )


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a database made by an earlier release up to `SCHEMA`."""
    present = {row[1] for row in db.execute("PRAGMA table_info(uploads)")}
    for name, kind in ADDED_COLUMNS:
        if name not in present:
            try:
                write(db, f"ALTER TABLE uploads ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as error:
                if "duplicate column" not in str(error):  # another process added it first
                    raise


class SQLiteUploadRecords:
    """`UploadRecords` in one SQLite file (WAL mode, so readers never wait for the writer).

    Connections come from a small pool rather than one per thread: under the gevent
    server every request runs in a short-lived greenlet, and a connection (and its cache)
    per greenlet would be opened and thrown away on every request. A transaction keeps its
    connection for the caller's thread or greenlet, so reads made inside `locked` see the
    rows it has not committed yet.
    """

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._local = threading.local()  # the connection of an open transaction, if any
        self._pool = ConnectionPool(db_path, SCHEMA)
        with self._pool.borrow() as pooled:
            _add_missing_columns(pooled.db)

    @contextmanager
    def _connection(self) -> Iterator[PooledConnection]:
        """The open transaction's connection, else one borrowed from the pool."""
        current = getattr(self._local, "txn", None)
        if current is not None:
            yield current
            return
        with self._pool.borrow() as pooled:
            yield pooled

    def ping(self) -> None:
        """Run a trivial query; raises when the database cannot be reached (readiness)."""
        with self._connection() as pooled:
            pooled.db.execute("SELECT COUNT(*) FROM uploads WHERE 0").fetchone()

    def all(self, scope: str) -> list[StoredRecord]:
        """Every record of the thread, by name; unchanged sets come from a per-connection cache.

        Listing a large thread is the hot read. `PRAGMA data_version` moves whenever another
        connection (any process) commits and `total_changes` whenever this one writes, so
        the pair tells for certain whether the cached records are still the stored ones.
        """
        with self._connection() as pooled:
            db = pooled.db
            if db.in_transaction:  # uncommitted rows must never be cached
                return _SQLiteTransaction(db, scope).all()
            version = (db.execute("PRAGMA data_version").fetchone()[0], db.total_changes)
            cache = pooled.cache
            hit = cache.get(scope)
            if hit is not None and hit[0] == version:
                cache.move_to_end(scope)
                return list(hit[1])
            records = _SQLiteTransaction(db, scope).all()
            cache[scope] = (version, records)
            if len(cache) > CACHED_SCOPES:
                cache.popitem(last=False)
            return list(records)

    def get(self, scope: str, filename: str) -> StoredRecord | None:
        """One record, or None."""
        with self._connection() as pooled:
            return _SQLiteTransaction(pooled.db, scope).get(filename)

    @contextmanager
    def locked(self, scope: str) -> Iterator[_SQLiteTransaction]:
        """Hold the database's write lock; file renames made inside commit with the records.

        BEGIN IMMEDIATE takes SQLite's write lock up front, so two processes committing the
        same name run one after the other and the record always describes the bytes on disk.
        """
        with self._connection() as pooled:
            db = pooled.db
            write(db, "BEGIN IMMEDIATE")
            self._local.txn = pooled
            try:
                yield _SQLiteTransaction(db, scope)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            finally:
                self._local.txn = None
            db.execute("COMMIT")

    def set_conversion(
        self,
        scope: str,
        filename: str,
        state: ConversionState | None,
        error: str | None = None,
        owner: str | None = None,
    ) -> bool:
        """Record a conversion job's state and the process running it; False if no record."""
        with self._connection() as pooled:
            cursor = write(
                pooled.db,
                "UPDATE uploads SET conversion_state = ?, conversion_error = ?, "
                "conversion_owner = ? WHERE scope = ? AND filename = ?",
                (state.value if state else None, error, owner, scope, filename),
            )
            return cursor.rowcount > 0

    def conversion_owner(self, scope: str, filename: str) -> str | None:
        """The process (`host:pid`) that runs the file's conversion job, if any."""
        with self._connection() as pooled:
            row = pooled.db.execute(
                "SELECT conversion_owner FROM uploads WHERE scope = ? AND filename = ?",
                (scope, filename),
            ).fetchone()
        return row[0] if row else None

    def find_conversions(
        self, states: Iterable[ConversionState]
    ) -> list[tuple[str, str, str | None]]:
        """(scope, filename, owner) of every record in one of `states`."""
        values = [s.value for s in states]
        marks = ", ".join("?" for _ in values)
        query = (
            "SELECT scope, filename, conversion_owner FROM uploads "
            f"WHERE conversion_state IN ({marks})"
        )
        with self._connection() as pooled:
            return [tuple(row) for row in pooled.db.execute(query, values).fetchall()]

    def summaries(self) -> list[ThreadSummary]:
        """File count, total size and last change per thread, newest first."""
        with self._connection() as pooled:
            rows = pooled.db.execute(
                "SELECT scope, COUNT(*), SUM(size), MAX(MAX(uploaded_at), MAX(mtime_ns) / 1e9) "
                "FROM uploads GROUP BY scope ORDER BY 4 DESC"
            ).fetchall()
        return [
            ThreadSummary(scope, count, total or 0, last or 0.0)
            for scope, count, total, last in rows
        ]

    def close(self) -> None:
        """Close the pooled connections (tests open many stores)."""
        self._pool.close()
