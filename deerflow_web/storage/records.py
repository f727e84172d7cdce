"""The thread's `uploads` record set (SPEC D10) in the shared database.

One table serves every thread, every server process and every instance: the database's
locking makes a record write and the rename it describes one step across processes, which
an in-memory lock could not (`locked`). Conversion jobs keep their state, owner and lease
in the same rows (see `services/conversion/jobs.py`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from typing import Protocol

from sqlalchemy import ColumnElement
from sqlalchemy import Engine
from sqlalchemy import Executable
from sqlalchemy import and_
from sqlalchemy import bindparam
from sqlalchemy import case
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy import tuple_
from sqlalchemy import union_all
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from deerflow_web.models import ACTIVE_CONVERSION_STATES
from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import ScanState
from deerflow_web.models import UploadRecord
from deerflow_web.storage.database import file_versions
from deerflow_web.storage.database import is_sqlite
from deerflow_web.storage.database import record_versions
from deerflow_web.storage.database import trashed_files
from deerflow_web.storage.database import uploads
from deerflow_web.storage.database import write_transaction

CACHED_SCOPES = 64  # threads whose records a pooled SQLite connection (or a process) keeps

_RECORD_COLUMNS = (
    uploads.c.filename,
    uploads.c.size,
    uploads.c.sha256,
    uploads.c.content_type,
    uploads.c.uploaded_at,
    uploads.c.mtime_ns,
    uploads.c.inode,
    uploads.c.ctime_ns,
    uploads.c.source,
    uploads.c.original_filename,
    uploads.c.converted_from,
    uploads.c.conversion_state,
    uploads.c.conversion_error,
    uploads.c.source_sha256,
    uploads.c.scan_state,
    uploads.c.scan_signatures,
)
_ACTIVE = [state.value for state in ACTIVE_CONVERSION_STATES]


@dataclass(frozen=True)
class StoredRecord:
    """A record plus the file identity (inode, mtime, ctime) used to notice drift on disk.

    `ctime_ns` is None for records written before it was kept: such a record is checked
    by hashing the file once, at its next use.
    """

    record: UploadRecord
    mtime_ns: int
    inode: int
    ctime_ns: int | None = None


@dataclass(frozen=True)
class ThreadSummary:
    """What the threads index shows for one thread."""

    scope: str
    file_count: int
    total_size: int
    last_change: float


_SOURCES = {source.value: source for source in RecordSource}
_STATES = {state.value: state for state in ConversionState}
_SCAN_STATES = {state.value: state for state in ScanState}


def _to_stored(row: tuple) -> StoredRecord:
    (
        filename,
        size,
        sha256,
        content_type,
        uploaded_at,
        mtime_ns,
        inode,
        ctime_ns,
        source,
        original,
        converted_from,
        state,
        error,
        source_sha256,
        scan_state,
        scan_signatures,
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
            scan_state=_SCAN_STATES[scan_state] if scan_state else None,
            scan_signatures=scan_signatures,
        ),
        mtime_ns=mtime_ns,
        inode=inode,
        ctime_ns=ctime_ns,
    )


class RecordsTransaction(Protocol):
    """Writes made while the records are locked; they land together or not at all."""

    connection: Connection  # for other tables' writes that must land with the records

    def get(self, filename: str) -> StoredRecord | None: ...
    def all(self) -> list[StoredRecord]: ...
    def names_by_sha256(self, sha256s: Iterable[str]) -> dict[str, str]: ...
    def companion_candidates(self, original: str, companion: str) -> list[StoredRecord]: ...
    def get_many(self, filenames: Iterable[str]) -> dict[str, StoredRecord | None]: ...
    def put(self, stored: StoredRecord) -> None: ...
    def put_many(self, stored: Iterable[StoredRecord]) -> None: ...
    def delete(self, filename: str) -> None: ...


class UploadRecords(Protocol):
    """The record store: read freely, write only inside `locked`."""

    engine: Engine  # the shared database the other stores use too

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
        lease_until: float | None = None,
    ) -> bool: ...
    def conversion_job(self, scope: str, filename: str) -> ConversionJob | None: ...
    def update_file(self, scope: str, stored: StoredRecord) -> bool: ...
    def claim_conversion(
        self, scope: str, filename: str, owner: str, now: float, lease_until: float
    ) -> bool: ...
    def claim_expired_conversions(
        self, owner: str, now: float, lease_until: float, limit: int
    ) -> list[tuple[str, str]]: ...
    def has_claimable_conversions(self, now: float) -> bool: ...
    def renew_leases(
        self, owner: str, lease_until: float, jobs: Iterable[tuple[str, str]]
    ) -> int: ...
    def finish_conversion(
        self, scope: str, filename: str, owner: str, state: ConversionState, error: str | None
    ) -> bool: ...
    def release_conversion(self, scope: str, filename: str, owner: str) -> bool: ...
    def find_conversions(
        self, states: Iterable[ConversionState]
    ) -> list[tuple[str, str, str | None]]: ...
    def summaries(self) -> list[ThreadSummary]: ...
    def ping(self) -> None: ...


def _claimable(now: float) -> ColumnElement[bool]:
    """An active job nobody holds: queued for any worker (no lease), or whose holder
    stopped renewing its lease."""
    return and_(
        uploads.c.conversion_state.in_(_ACTIVE),
        or_(
            uploads.c.conversion_lease_until.is_(None),
            uploads.c.conversion_lease_until < now,
        ),
    )


@dataclass(frozen=True)
class ConversionJob:
    """Who runs a file's conversion and until when its lease holds."""

    state: ConversionState | None
    owner: str | None
    lease_until: float | None

    def live(self, now: float) -> bool:
        """Whether an active job's worker still holds its lease."""
        return (
            self.state in ACTIVE_CONVERSION_STATES
            and self.lease_until is not None
            and self.lease_until >= now
        )


def _values(scope: str, stored: StoredRecord) -> dict[str, Any]:
    r = stored.record
    return {
        "scope": scope,
        "filename": r.filename,
        "size": r.size,
        "sha256": r.sha256,
        "content_type": r.content_type,
        "uploaded_at": r.uploaded_at,
        "mtime_ns": stored.mtime_ns,
        "inode": stored.inode,
        "ctime_ns": stored.ctime_ns,
        "source": r.source.value,
        "original_filename": r.original_filename,
        "converted_from": r.converted_from,
        "conversion_state": r.conversion_state.value if r.conversion_state else None,
        "conversion_error": r.conversion_error,
        "source_sha256": r.source_sha256,
        "scan_state": r.scan_state.value if r.scan_state else None,
        "scan_signatures": r.scan_signatures,
        # A record written whole starts without a job holder, as a replaced file would.
        "conversion_owner": None,
        "conversion_queued_at": None,
        "conversion_lease_until": None,
    }


# The statements a commit runs for every file, built once with bound parameters: built per
# call, SQLAlchemy rebuilt and cache-keyed each (the upsert's `excluded` alone copied all
# the table's columns), which was most of an upload's CPU time (bench/README.md).
_WRITTEN_COLUMNS = tuple(column.name for column in uploads.columns)  # `_values` gives each
_SELECT_ALL = (
    select(*_RECORD_COLUMNS)
    .where(uploads.c.scope == bindparam("scope"))
    .order_by(uploads.c.filename)
)
_SELECT_ONE = select(*_RECORD_COLUMNS).where(
    uploads.c.scope == bindparam("scope"), uploads.c.filename == bindparam("filename")
)
# The records that may be a file's companions (the caller applies the companion rule),
# read by index (migration 0007), whatever the size of the thread.
_SELECT_COMPANIONS = (
    select(*_RECORD_COLUMNS)
    .where(uploads.c.scope == bindparam("scope"))
    .where(
        or_(
            uploads.c.converted_from == bindparam("original"),
            uploads.c.filename == bindparam("companion"),
        )
    )
    .order_by(uploads.c.filename)
)
_DELETE_ONE = delete(uploads).where(
    uploads.c.scope == bindparam("scope"), uploads.c.filename == bindparam("filename")
)
_SELECT_VERSION = select(record_versions.c.version).where(
    record_versions.c.scope == bindparam("scope")
)


class _Prepared:
    """A statement compiled once per dialect and run on the driver with plain values.

    `Connection.execute` of even a prebuilt statement looks its compiled form up by cache
    key and runs every parameter set through SQLAlchemy's processing, on each call: for
    the commit's few statements (one of them over every file of the request) that was
    most of an upload's database time. The columns written here need no conversion on
    either driver (text, integers, floats), so the driver takes the values as they are.
    """

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        # dialect -> (SQL, the value names in placeholder order or None for a named
        # style, the values the statement itself carries: `version=1`)
        self._compiled: dict[str, tuple[str, tuple[str, ...] | None, dict[str, Any]]] = {}

    def _form(self, db: Connection) -> tuple[str, tuple[str, ...] | None, dict[str, Any]]:
        compiled = self._compiled.get(db.dialect.name)
        if compiled is None:
            form = self.statement.compile(dialect=db.dialect)
            positions = tuple(form.positiontup) if form.positiontup else None
            fixed = {name: bind.value for name, bind in form.binds.items() if not bind.required}
            compiled = self._compiled[db.dialect.name] = (form.string, positions, fixed)
        return compiled

    def run(self, db: Connection, values: dict[str, Any] | list[dict[str, Any]]) -> Any:
        """Run with one set of values (a dict) or many (a list: one `executemany`)."""
        sql, positions, fixed = self._form(db)
        many = values if isinstance(values, list) else [values]
        if fixed:
            many = [{**fixed, **one} for one in many]
        if positions is None:  # a named paramstyle (psycopg): the dicts as they are
            rows: Any = many
        else:
            rows = [tuple(one[name] for name in positions) for one in many]
        return db.exec_driver_sql(sql, rows if isinstance(values, list) else rows[0])


def _upsert(dialect_insert: Any) -> Executable:
    statement = dialect_insert(uploads).values({k: bindparam(k) for k in _WRITTEN_COLUMNS})
    return statement.on_conflict_do_update(
        index_elements=["scope", "filename"],
        set_={k: statement.excluded[k] for k in _WRITTEN_COLUMNS if k not in ("scope", "filename")},
    )


def _version_bump(dialect_insert: Any) -> Executable:
    statement = dialect_insert(record_versions).values(scope=bindparam("scope"), version=1)
    return statement.on_conflict_do_update(
        index_elements=["scope"], set_={"version": record_versions.c.version + 1}
    )


@lru_cache(maxsize=64)
def _names_by_sha256(count: int) -> _Prepared:
    """For `count` hashes, the last name holding each: one index seek per hash (migration
    0007), however many copies of the same bytes the thread holds (a GROUP BY would read
    every one of them)."""
    arms = [
        select(uploads.c.sha256, uploads.c.filename)
        .where(uploads.c.scope == bindparam("scope"), uploads.c.sha256 == bindparam(f"h{i}"))
        .order_by(uploads.c.filename.desc())
        .limit(1)
        .subquery()
        for i in range(count)
    ]
    return _Prepared(union_all(*(select(arm.c.sha256, arm.c.filename) for arm in arms)))


@lru_cache(maxsize=64)
def _select_named(count: int) -> _Prepared:
    """The records of `count` names (`f0`...), in one read by primary key."""
    return _Prepared(
        select(*_RECORD_COLUMNS).where(
            uploads.c.scope == bindparam("scope"),
            uploads.c.filename.in_([bindparam(f"f{i}") for i in range(count)]),
        )
    )


_UPSERT = {
    "postgresql": _Prepared(_upsert(pg_insert)),
    "sqlite": _Prepared(_upsert(sqlite_insert)),
}
_BUMP_VERSION = {
    "postgresql": _Prepared(_version_bump(pg_insert)),
    "sqlite": _Prepared(_version_bump(sqlite_insert)),
}


def _read_all(db: Connection, scope: str) -> list[StoredRecord]:
    rows = db.execute(_SELECT_ALL, {"scope": scope})
    return [_to_stored(tuple(row)) for row in rows]


def _bump_version(db: Connection, scope: str) -> None:
    """Count a change to the thread's records, in the transaction that makes it."""
    _BUMP_VERSION[db.dialect.name].run(db, {"scope": scope})


def _read_version(db: Connection, scope: str) -> int | None:
    return db.execute(_SELECT_VERSION, {"scope": scope}).scalar_one_or_none()


def _read_one(db: Connection, scope: str, filename: str) -> StoredRecord | None:
    row = db.execute(_SELECT_ONE, {"scope": scope, "filename": filename}).first()
    return _to_stored(tuple(row)) if row else None


# Told the records a write is about to store, in its transaction (see `DatabaseUploadRecords`).
BeforeWrite = Callable[[str, Iterable["StoredRecord"]], None]


class _Transaction:
    """`RecordsTransaction` on the connection that holds the scope's lock."""

    def __init__(
        self, connection: Connection, scope: str, before_write: BeforeWrite | None = None
    ) -> None:
        self._db = self.connection = connection
        self._scope = scope
        self._before_write = before_write

    def get(self, filename: str) -> StoredRecord | None:
        return _read_one(self._db, self._scope, filename)

    def all(self) -> list[StoredRecord]:
        return _read_all(self._db, self._scope)

    def get_many(self, filenames: Iterable[str]) -> dict[str, StoredRecord | None]:
        """Each name's record, None for a name without one, in one read."""
        wanted = sorted(set(filenames))
        found: dict[str, StoredRecord | None] = dict.fromkeys(wanted)
        if wanted:
            params = {f"f{i}": name for i, name in enumerate(wanted)}
            rows = _select_named(len(wanted)).run(self._db, {"scope": self._scope, **params})
            found.update((row[0], _to_stored(tuple(row))) for row in rows)
        return found

    def names_by_sha256(self, sha256s: Iterable[str]) -> dict[str, str]:
        """sha256 -> the name of a record holding those bytes, for the ones the thread has.

        Of several, the last in name order, as a dict built from `all()` kept.
        """
        wanted = sorted(set(sha256s))
        if not wanted:
            return {}
        params = {f"h{i}": sha256 for i, sha256 in enumerate(wanted)}
        rows = _names_by_sha256(len(wanted)).run(self._db, {"scope": self._scope, **params})
        return {sha256: filename for sha256, filename in rows}

    def companion_candidates(self, original: str, companion: str) -> list[StoredRecord]:
        """The records converted from `original` or named `companion`, by name: a superset
        of `original`'s companions, read without the rest of the thread."""
        rows = self._db.execute(
            _SELECT_COMPANIONS,
            {"scope": self._scope, "original": original, "companion": companion},
        )
        return [_to_stored(tuple(row)) for row in rows]

    def put(self, stored: StoredRecord) -> None:
        if self._before_write is not None:
            self._before_write(self._scope, (stored,))
        _UPSERT[self._db.dialect.name].run(self._db, _values(self._scope, stored))

    def put_many(self, stored: Iterable[StoredRecord]) -> None:
        """`put` each, in one statement run over all of them."""
        stored = list(stored)
        if self._before_write is not None and stored:
            self._before_write(self._scope, stored)
        values = [_values(self._scope, one) for one in stored]
        if values:
            _UPSERT[self._db.dialect.name].run(self._db, values)

    def delete(self, filename: str) -> None:
        self._db.execute(_DELETE_ONE, {"scope": self._scope, "filename": filename})

    def move_scope(self, new: str) -> int:
        result = self._db.execute(
            update(uploads).where(uploads.c.scope == self._scope).values(scope=new)
        )
        for table in (file_versions, trashed_files):  # the thread's history moves with it
            self._db.execute(update(table).where(table.c.scope == self._scope).values(scope=new))
        _bump_version(self._db, new)
        return result.rowcount


class DatabaseUploadRecords:
    """`UploadRecords` in the shared database (SQLite or PostgreSQL, one SQL).

    Transactions keep their connection for the caller's thread or greenlet, so reads made
    inside `locked` see the rows it has not committed yet.
    """

    def __init__(self, engine: Engine, *, before_write: BeforeWrite | None = None) -> None:
        self.engine = engine
        # Called with the records about to be written, inside their transaction: the S3
        # backend stores the bytes each describes there (`working_copy`), so no record is
        # ever committed for bytes the bucket lacks.
        self.before_write = before_write
        self._sqlite = is_sqlite(engine)
        self._local = threading.local()  # the connection of an open transaction, if any
        # PostgreSQL: scope -> (record_versions.version, records), checked on every read.
        self._cache: OrderedDict[str, tuple[int | None, list[StoredRecord]]] = OrderedDict()
        self._cache_lock = threading.Lock()

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """The open transaction's connection, else a pooled one."""
        current = getattr(self._local, "txn", None)
        if current is not None:
            yield current
            return
        with self.engine.connect() as db:
            yield db

    def ping(self) -> None:
        """Run a trivial query; raises when the database cannot be reached (readiness)."""
        with self._connection() as db:
            db.execute(select(func.count()).select_from(uploads).where(text("1 = 0"))).scalar()

    def all(self, scope: str) -> list[StoredRecord]:
        """Every record of the thread, by name.

        Listing a large thread is the hot read, so the sets read last are kept, and checked
        for freshness on every call (never trusted blindly):

        - SQLite: per pooled connection. `PRAGMA data_version` moves whenever another
          connection (any process) commits and `total_changes` whenever this one writes,
          so the pair tells for certain whether the cached records are still the stored
          ones.
        - PostgreSQL: per process, keyed by the thread's `record_versions` row, which every
          write to the thread's records bumps in its own transaction (any instance). The
          version is read before the rows, so a write landing in between can only make the
          cache look older than it is (one extra read), never newer.
        """
        with self._connection() as db:
            if getattr(self._local, "txn", None) is not None:
                return _read_all(db, scope)  # uncommitted rows must never be cached
            if not self._sqlite:
                return self._all_checked_by_version(db, scope)
            raw: Any = db.connection.dbapi_connection
            version = (raw.execute("PRAGMA data_version").fetchone()[0], raw.total_changes)
            cache: OrderedDict = db.connection.info.setdefault("records_cache", OrderedDict())
            hit = cache.get(scope)
            if hit is not None and hit[0] == version:
                cache.move_to_end(scope)
                return list(hit[1])
            records = _read_all(db, scope)
            cache[scope] = (version, records)
            if len(cache) > CACHED_SCOPES:
                cache.popitem(last=False)
            return list(records)

    def _all_checked_by_version(self, db: Connection, scope: str) -> list[StoredRecord]:
        version = _read_version(db, scope)
        with self._cache_lock:
            hit = self._cache.get(scope)
            if hit is not None and hit[0] == version:
                self._cache.move_to_end(scope)
                return list(hit[1])
        records = _read_all(db, scope)
        db.commit()  # end the read's transaction before the connection goes back
        with self._cache_lock:
            self._cache[scope] = (version, records)
            if len(self._cache) > CACHED_SCOPES:
                self._cache.popitem(last=False)
        return list(records)

    def get(self, scope: str, filename: str) -> StoredRecord | None:
        """One record, or None."""
        with self._connection() as db:
            return _read_one(db, scope, filename)

    @contextmanager
    def locked(self, scope: str) -> Iterator[_Transaction]:
        """Serialise the thread's writers across processes; renames made inside commit with
        the records.

        SQLite: BEGIN IMMEDIATE takes the database's write lock up front. PostgreSQL: a
        transaction-scoped advisory lock keyed by the scope, so two instances committing
        the same name run one after the other (other threads are not held up) and the
        record always describes the bytes on disk.
        """
        with write_transaction(self.engine) as db:
            if not self._sqlite:
                db.execute(text("SELECT pg_advisory_xact_lock(hashtext(:scope))"), {"scope": scope})
            _bump_version(db, scope)  # commits (or rolls back) with the records
            self._local.txn = db
            try:
                yield _Transaction(db, scope, self.before_write)
            finally:
                self._local.txn = None

    def reading(self) -> AbstractContextManager[Connection]:
        """A connection to read other tables with: the open transaction's, else a pooled
        one (a read made half-way through a write sees what the write did so far)."""
        return self._connection()

    @contextmanager
    def locked_here(self, scope: str) -> Iterator[_Transaction]:
        """`locked`, or the transaction this thread already holds (a write that, half-way,
        needs the records read and written in its own transaction, not in a second one
        waiting for the first)."""
        current = getattr(self._local, "txn", None)
        if current is not None:
            yield _Transaction(current, scope, self.before_write)
            return
        with self.locked(scope) as txn:
            yield txn

    def _write(self) -> AbstractContextManager[Connection]:
        current = getattr(self._local, "txn", None)
        if current is not None:
            return _Reuse(current)
        return write_transaction(self.engine)

    def set_conversion(
        self,
        scope: str,
        filename: str,
        state: ConversionState | None,
        error: str | None = None,
        owner: str | None = None,
        lease_until: float | None = None,
        now: float | None = None,
    ) -> bool:
        """Record a conversion job's state, its worker and lease; False if no record."""
        values: dict[str, Any] = {
            "conversion_state": state.value if state else None,
            "conversion_error": error,
            "conversion_owner": owner,
            "conversion_lease_until": lease_until,
        }
        if state is ConversionState.QUEUED:
            values["conversion_queued_at"] = now
        with self._write() as db:
            # The state is part of the records. The version row first, as `locked` does:
            # the same lock order in every writer, so two never wait for each other.
            _bump_version(db, scope)
            result = db.execute(
                update(uploads)
                .where(uploads.c.scope == scope, uploads.c.filename == filename)
                .values(values)
            )
            return result.rowcount > 0

    def update_file(self, scope: str, stored: StoredRecord) -> bool:
        """Record new bytes of a file (size, SHA-256, type, identity), leaving its conversion
        job as it stands; False if there is no record. Inside `locked`, part of it."""
        r = stored.record
        with self._write() as db:
            _bump_version(db, scope)
            if self.before_write is not None:
                self.before_write(scope, (stored,))
            result = db.execute(
                update(uploads)
                .where(uploads.c.scope == scope, uploads.c.filename == r.filename)
                .values(
                    size=r.size,
                    sha256=r.sha256,
                    content_type=r.content_type,
                    mtime_ns=stored.mtime_ns,
                    inode=stored.inode,
                    ctime_ns=stored.ctime_ns,
                    # New bytes have not been scanned (the same bytes keep their verdict).
                    scan_state=case(
                        (uploads.c.sha256 == r.sha256, uploads.c.scan_state), else_=None
                    ),
                    scan_signatures=case(
                        (uploads.c.sha256 == r.sha256, uploads.c.scan_signatures), else_=None
                    ),
                )
            )
            return result.rowcount > 0

    def set_scan(
        self, scope: str, filename: str, sha256: str, state: ScanState, signatures: str | None
    ) -> bool:
        """Record a scan's verdict on the file, if its record still describes the bytes
        that were scanned (`sha256`); False otherwise (replaced or gone meanwhile)."""
        with self._write() as db:
            _bump_version(db, scope)  # the same lock order as every writer
            result = db.execute(
                update(uploads)
                .where(
                    uploads.c.scope == scope,
                    uploads.c.filename == filename,
                    uploads.c.sha256 == sha256,
                )
                .values(scan_state=state.value, scan_signatures=signatures)
            )
            return result.rowcount > 0

    def conversion_job(self, scope: str, filename: str) -> ConversionJob | None:
        """The file's job state, worker and lease, or None without a record."""
        with self._connection() as db:
            row = db.execute(
                select(
                    uploads.c.conversion_state,
                    uploads.c.conversion_owner,
                    uploads.c.conversion_lease_until,
                ).where(uploads.c.scope == scope, uploads.c.filename == filename)
            ).first()
        if row is None:
            return None
        return ConversionJob(_STATES[row[0]] if row[0] else None, row[1], row[2])

    def conversion_owner(self, scope: str, filename: str) -> str | None:
        """The worker (`host:pid`) that runs the file's conversion job, if any."""
        job = self.conversion_job(scope, filename)
        return job.owner if job else None

    def claim_conversion(
        self, scope: str, filename: str, owner: str, now: float, lease_until: float
    ) -> bool:
        """Take over an active job whose lease ran out (or that is ours already).

        One conditional UPDATE: of two workers trying at once, exactly one matches.
        """
        with self._write() as db:
            result = db.execute(
                update(uploads)
                .where(
                    uploads.c.scope == scope,
                    uploads.c.filename == filename,
                    uploads.c.conversion_state.in_(_ACTIVE),
                    or_(
                        uploads.c.conversion_owner == owner,
                        uploads.c.conversion_lease_until.is_(None),
                        uploads.c.conversion_lease_until < now,
                    ),
                )
                .values(conversion_owner=owner, conversion_lease_until=lease_until)
            )
            return result.rowcount > 0

    def has_claimable_conversions(self, now: float) -> bool:
        """Whether any active job has no lease or a lapsed one: a read, so a worker polling
        every second takes no write lock (SQLite) while there is nothing to claim."""
        with self._connection() as db:
            row = db.execute(select(uploads.c.scope).where(_claimable(now)).limit(1)).first()
        return row is not None

    def claim_expired_conversions(
        self, owner: str, now: float, lease_until: float, limit: int
    ) -> list[tuple[str, str]]:
        """Claim up to `limit` active jobs whose worker stopped renewing its lease.

        PostgreSQL: `FOR UPDATE SKIP LOCKED`, so instances sweeping together take different
        jobs without waiting for each other; SQLite: the write lock serialises them.
        """
        if limit <= 0:
            return []
        with write_transaction(self.engine) as db:
            rows = db.execute(
                select(uploads.c.scope, uploads.c.filename)
                .where(_claimable(now))
                .order_by(uploads.c.conversion_queued_at, uploads.c.scope, uploads.c.filename)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            for scope, filename in rows:
                db.execute(
                    update(uploads)
                    .where(uploads.c.scope == scope, uploads.c.filename == filename)
                    .values(conversion_owner=owner, conversion_lease_until=lease_until)
                )
        return [(scope, filename) for scope, filename in rows]

    def renew_leases(self, owner: str, lease_until: float, jobs: Iterable[tuple[str, str]]) -> int:
        """Extend the leases of `jobs` (scope, filename) that `owner` still holds; return
        how many.

        Only the jobs the caller names: a process renews what it really runs, so a job it
        lost track of (its end could not be written, say) lapses and is claimed again,
        instead of being kept alive by an owner that no longer runs it.
        """
        wanted = list(jobs)
        if not wanted:
            return 0
        with write_transaction(self.engine) as db:
            result = db.execute(
                update(uploads)
                .where(
                    uploads.c.conversion_owner == owner,
                    uploads.c.conversion_state.in_(_ACTIVE),
                    tuple_(uploads.c.scope, uploads.c.filename).in_(wanted),
                )
                .values(conversion_lease_until=lease_until)
            )
            return result.rowcount

    def finish_conversion(
        self, scope: str, filename: str, owner: str, state: ConversionState, error: str | None
    ) -> bool:
        """End a job `owner` holds with a final state; False if it holds it no longer (the
        record is gone or was replaced, or another process claimed the job meanwhile)."""
        return self._end_held(
            scope, filename, owner, conversion_state=state.value, conversion_error=error
        )

    def release_conversion(self, scope: str, filename: str, owner: str) -> bool:
        """Hand an active job `owner` holds back as `queued`, with no holder and no lease,
        so any worker claims it at once; its place in the queue is kept. False if `owner`
        holds it no longer."""
        return self._end_held(scope, filename, owner, conversion_state=ConversionState.QUEUED.value)

    def _end_held(self, scope: str, filename: str, owner: str, **values: object) -> bool:
        """Write `values` into an active job `owner` holds, and let go of it (no holder, no
        lease); False if `owner` holds it no longer."""
        with self._write() as db:
            _bump_version(db, scope)  # the same lock order as every writer
            result = db.execute(
                update(uploads)
                .where(
                    uploads.c.scope == scope,
                    uploads.c.filename == filename,
                    uploads.c.conversion_owner == owner,
                    uploads.c.conversion_state.in_(_ACTIVE),
                )
                .values(conversion_owner=None, conversion_lease_until=None, **values)
            )
            return result.rowcount > 0

    def find_conversions(
        self, states: Iterable[ConversionState]
    ) -> list[tuple[str, str, str | None]]:
        """(scope, filename, owner) of every record in one of `states`."""
        values = [s.value for s in states]
        with self._connection() as db:
            rows = db.execute(
                select(uploads.c.scope, uploads.c.filename, uploads.c.conversion_owner).where(
                    uploads.c.conversion_state.in_(values)
                )
            ).all()
        return [(row[0], row[1], row[2]) for row in rows]

    def summaries(self) -> list[ThreadSummary]:
        """File count, total size and last change per thread, newest first."""
        with self._connection() as db:
            rows = db.execute(
                select(
                    uploads.c.scope,
                    func.count(),
                    func.sum(uploads.c.size),
                    func.max(uploads.c.uploaded_at),
                    func.max(uploads.c.mtime_ns),
                ).group_by(uploads.c.scope)
            ).all()
        summaries = [
            ThreadSummary(
                scope, count, int(total or 0), max(uploaded or 0.0, (mtime_ns or 0) / 1e9)
            )
            for scope, count, total, uploaded, mtime_ns in rows
        ]
        summaries.sort(key=lambda s: s.last_change, reverse=True)
        return summaries

    def move_scope(self, old: str, new: str) -> int:
        """Re-key a thread's records after its folder moved (adopting a flat thread)."""
        with self.locked(old) as txn:
            return txn.move_scope(new)

    def close(self) -> None:
        """Nothing to release: the engine's pool belongs to whoever made the engine."""


class _Reuse:
    """The connection of the transaction already open in this thread, used as is."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def __enter__(self) -> Connection:
        return self._connection

    def __exit__(self, *_: object) -> None:
        return None
