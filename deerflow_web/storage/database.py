"""The shared database: one SQLAlchemy Core engine per process and every table it holds.

An embedded SQLite file by default (`{base}/deerflow.sqlite3`), or the server named by
`DATABASE_URL` / `database.url` (SPEC 9), e.g. `postgresql+psycopg://user:pass@host/db`.
Everything several server processes (or several machines) must agree on lives here and
never in one process's memory: upload records and conversion jobs, who is signed in, which
session was revoked, how many logins failed, each user's threads, resumable uploads, chat
preview turns. The SQL is written once, with Core constructs, for both engines; the schema
is created and upgraded by the Alembic migrations in `storage/migrations` (`migrate.py`).

SQLite under gevent: SQLite's own busy handler sleeps inside the C library and would freeze
every greenlet of the process, so connections give it no time at all. Every writer takes the
write lock up front (`write_transaction`, BEGIN IMMEDIATE) and waits for it with a Python
sleep, which gevent turns into a cooperative one; readers never wait in WAL mode. The
writers of one process queue on a lock of their own before that, so one of them at a time
polls. (Measured with 500 uploads committing at once over two processes: a 5 ms C-level
wait per collision held a fast client's list for 0.4-0.7 s; with none, p99 10-104 ms over
eight runs, the retries of 500 writers in the way; with one poller per process, 8-10 ms.)
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger
from sqlalchemy import Boolean
from sqlalchemy import Column
from sqlalchemy import Engine
from sqlalchemy import Float
from sqlalchemy import ForeignKey
from sqlalchemy import Index
from sqlalchemy import Integer
from sqlalchemy import MetaData
from sqlalchemy import PrimaryKeyConstraint
from sqlalchemy import String
from sqlalchemy import Table
from sqlalchemy import Text
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import OperationalError

from deerflow_web.storage.paths import SECRET_FILE_MODE
from deerflow_web.storage.paths import make_dirs_with_mode
from deerflow_web.storage.paths import tighten_secret_file

DATABASE_FILE = "deerflow.sqlite3"
SQLITE_JOURNALS = ("-wal", "-shm", "-journal")
BUSY_SLICE_SECONDS = 0.0  # what SQLite's own (blocking) busy handler gets: nothing
BUSY_TIMEOUT_SECONDS = 60  # how long a writer waits for SQLite's write lock, in Python sleeps
BUSY_RETRY_MAX_SECONDS = 0.005  # the longest of those sleeps (see _retry_busy)
CONNECT_TIMEOUT_SECONDS = 5  # a server that does not answer fails the request, never hangs it

metadata = MetaData()

users = Table(
    "users",
    metadata,
    Column("id", String(36), primary_key=True),  # a UUID: safe as a folder name (SPEC 1.5)
    Column("email", String(320), nullable=False, unique=True),
    Column("password_hash", String(255), nullable=False),
    Column("system_role", String(16), nullable=False, default="user"),
    Column("needs_setup", Boolean, nullable=False, default=False),
    Column("disabled", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),  # sha256 of the secret in the cookie
    Column("user_id", String(36), ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),  # the absolute end, however busy
    # "Remember me": a session without it also ends after the idle timeout.
    Column("persistent", Boolean, nullable=False, default=True),
    # The last request seen, written at most once a minute (NULL: none since created_at).
    Column("last_seen_at", Float, nullable=True),
    Index("ix_sessions_user", "user_id"),
)

session_secrets = Table(
    "session_secrets",
    metadata,
    # A secret to show once (a new API token, a temporary password), kept for the session
    # that asked for it and sealed with that session's own secret, which only its cookie
    # holds: the database alone cannot read it, and showing it deletes the row.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "session_hash",
        String(64),
        ForeignKey("sessions.id_hash", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("kind", String(32), nullable=False),
    Column("label", Text, nullable=False),
    Column("nonce", String(32), nullable=False),
    Column("sealed", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_session_secrets_session", "session_hash", "kind"),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("user_id", String(36), ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(100), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=True),
    Column("last_used_at", Float, nullable=True),
    Index("ix_api_tokens_user", "user_id"),
)

login_failures = Table(
    "login_failures",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # "address", "pair" or "account"
    Column("subject", String(320), nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_login_failures_subject", "kind", "subject", "at"),
)

threads = Table(
    "threads",
    metadata,
    # Each user's threads (SPEC 7.4): ids are per user, so A's `project` and B's are two
    # threads, as their folders `users/{uid}/threads/{id}` are. The single-user layout's
    # threads have the user id "" (no account, no foreign key for that reason).
    Column("user_id", String(36), nullable=False),
    Column("thread_id", String(64), nullable=False),
    Column("title", Text),  # DeerFlow's display name, answered as `values.title`
    Column("metadata", Text, nullable=False),  # a JSON object, merged by PATCH
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    PrimaryKeyConstraint("user_id", "thread_id"),
)


uploads = Table(
    "uploads",
    metadata,
    # The thread's `uploads` record set (SPEC D10); `scope` names the thread's folder.
    Column("scope", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("content_type", Text, nullable=False),
    Column("uploaded_at", Float, nullable=False),
    Column("mtime_ns", BigInteger, nullable=False),
    Column("inode", BigInteger, nullable=False),
    Column("ctime_ns", BigInteger),  # with size, mtime and inode: the file the record describes
    Column("source", Text, nullable=False),
    Column("original_filename", Text),
    Column("converted_from", Text),
    Column("conversion_state", Text),
    Column("conversion_error", Text),
    Column("conversion_owner", Text),  # host:pid of the worker holding the job
    Column("source_sha256", Text),
    Column("conversion_queued_at", Float),  # claim order of queued jobs
    Column("conversion_lease_until", Float),  # a converting job past this is claimed again
    # The virus scanner's verdict and the signature version it came from (models.ScanState;
    # NULL: never scanned, stored while scanning was off).
    Column("scan_state", Text),
    Column("scan_signatures", Text),
    PrimaryKeyConstraint("scope", "filename"),
    Index("ix_uploads_conversion_state", "conversion_state"),
    # A commit's duplicate check and a file's companions, read by index (migration 0007).
    Index("ix_uploads_sha256", "scope", "sha256", "filename"),
    Index("ix_uploads_converted_from", "scope", "converted_from"),
    sqlite_with_rowid=False,
)

scan_events = Table(
    "scan_events",
    metadata,
    # Uploads the scanner refused and files a later rescan quarantined, for the admin page
    # and for the thread's owner. A quarantined file's bytes sit under `quarantine_path`
    # (outside every thread) until `purge_after`.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # "refused" or "quarantined"
    Column("at", Float, nullable=False),
    Column("user_id", String(36)),  # None in the single-user layout
    Column("thread_id", String(64), nullable=False),
    Column("scope", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("sha256", Text),
    Column("size", BigInteger),
    Column("signature", Text, nullable=False),
    Column("quarantine_path", Text),
    Column("purge_after", Float),
    Index("ix_scan_events_at", "at"),
    Index("ix_scan_events_scope", "scope", "at"),
)

job_leases = Table(
    "job_leases",
    metadata,
    # One row per periodic job (the rescan): the instance whose lease has not run out runs
    # it; any other instance takes it over once the lease lapses.
    Column("name", String(64), primary_key=True),
    Column("owner", Text, nullable=False),
    Column("lease_until", Float, nullable=False),
    Column("state", Text),  # what the job needs to remember between runs (JSON)
)

record_versions = Table(
    "record_versions",
    metadata,
    # Bumped in the transaction of every write to a thread's records, so a process can tell
    # whether the records it cached are still the stored ones (PostgreSQL; see records.py).
    Column("scope", Text, primary_key=True),
    Column("version", BigInteger, nullable=False),
    # One owner's threads by byte order, the quota's range (on PostgreSQL `COLLATE "C"`,
    # which the primary key's collation cannot serve: migration 0012).
    Index("ix_record_versions_scope_bytes", "scope"),
)

preview_turns = Table(
    "preview_turns",
    metadata,
    # The chat preview's turns: disposable tooling data, stored as JSON documents.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("scope", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("data", Text, nullable=False),
    Index("ix_preview_turns_scope", "scope", "id"),
)

resumable_uploads = Table(
    "resumable_uploads",
    metadata,
    # Unfinished tus uploads (SPEC 8): any process may take an upload's next request.
    Column("upload_id", String(64), primary_key=True),
    Column("thread_id", Text, nullable=False),
    Column("user_id", String(36)),
    Column("filename", Text, nullable=False),
    Column("on_conflict", String(16), nullable=False),
    Column("metadata", Text, nullable=False),
    Column("length", BigInteger, nullable=False),
    Column("upload_offset", BigInteger, nullable=False),
    Column("pending_from", BigInteger),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("staging_path", Text, nullable=False),
    # Set in the commit's transaction: the upload is complete and stored under this name
    # (kept until expiry, so a retried request learns so).
    Column("committed_name", Text),
    # The S3 backend (migration 0014): the multipart upload the bytes go to, the object
    # holding the bytes after its last full part, the blob's SHA-256 once they became one,
    # and the one writer across instances (a lease, as instances share no `flock`).
    Column("s3_upload_id", Text),
    Column("tail_key", Text),
    Column("sha256", String(64)),
    Column("lease_owner", String(64)),
    Column("lease_expires", Float),
    Index("ix_resumable_uploads_expiry", "expires_at"),
    Index("ix_resumable_uploads_staging", "staging_path"),
    Index("ix_resumable_uploads_user", "user_id"),
)

resumable_parts = Table(
    "resumable_parts",
    metadata,
    # The S3 parts a resumable upload's PATCHes sent, in order (SPEC 8 on the S3 backend);
    # they go with their upload, however it is removed (a thread's deletion too).
    Column(
        "upload_id",
        String(64),
        ForeignKey("resumable_uploads.upload_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("part_number", Integer, primary_key=True, autoincrement=False),
    Column("etag", Text, nullable=False),
    Column("checksum_sha256", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
)

share_links = Table(
    "share_links",
    metadata,
    # A link that hands a thread's file (or several) to someone without an account. Only
    # the SHA-256 of the link's secret is kept: the database alone opens nothing.
    Column("id", String(32), primary_key=True),  # names the link on its owner's pages
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("user_id", String(36), nullable=False),  # "" in the single-user layout
    Column("thread_id", String(64), nullable=False),
    Column("paths", Text, nullable=False),  # a JSON list of user-data paths
    Column("password_hash", String(255)),  # argon2id, or NULL for no password
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("revoked_at", Float),
    Index("ix_share_links_thread", "user_id", "thread_id"),
)

user_quotas = Table(
    "user_quotas",
    metadata,
    # An admin's override of one account's storage quota (`quotas.default_bytes` applies to
    # everyone without a row). `quota_bytes` NULL: unlimited for this account.
    Column("user_id", String(36), ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    Column("quota_bytes", BigInteger),
    Column("updated_at", Float, nullable=False),
)

share_link_hits = Table(
    "share_link_hits",
    metadata,
    # Recent opens of share links (kind "open") and wrong passwords (kind "password"), per
    # address: the rate limit holds across every worker and machine, as login lockouts do.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),
    Column("subject", String(320), nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_share_link_hits_subject", "kind", "subject", "at"),
)


file_versions = Table(
    "file_versions",
    metadata,
    # The earlier bytes of a file that was replaced (issue 27): a re-upload over its name, a
    # resumable upload finished over it, an artifact edit, a restore. The bytes live in the
    # thread's hidden history folder (`ThreadFolders.versions_dir`), named by `version_id`.
    Column("version_id", String(32), primary_key=True),
    Column("scope", Text, nullable=False),  # the thread, as the upload records key it
    Column("area", String(16), nullable=False),  # "uploads" or "outputs"
    Column("filename", Text, nullable=False),  # the file's path inside its area
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("content_type", Text),
    Column("created_at", Float, nullable=False),  # when these bytes stopped being current
    Column("created_by", String(36)),  # the user whose write replaced them; NULL: no account
    Index("ix_file_versions_file", "scope", "area", "filename", "created_at"),
)

trashed_files = Table(
    "trashed_files",
    metadata,
    # Deleted uploads kept for `trash.days` (issue 27), with the records they had, so a
    # restore gives the file (and its converted companions) back as it was.
    Column("trash_id", String(32), primary_key=True),
    Column("scope", Text, nullable=False),
    Column("filename", Text, nullable=False),  # the name it had when it was deleted
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),  # its bytes and its companions' together
    Column("deleted_at", Float, nullable=False),
    Column("deleted_by", String(36)),
    Column("records", Text, nullable=False),  # JSON: the file's record, then its companions'
    Index("ix_trashed_files_scope", "scope", "deleted_at"),
    Index("ix_trashed_files_expiry", "deleted_at"),
)

install_storage = Table(
    "install_storage",
    metadata,
    # Where the install's file bytes live, once `storage migrate --to s3` moved them: one
    # row (id 1), none while they never moved. Every process reads it at start-up
    # (`storage/install_storage.py`), so no instance keeps writing to a disk of its own
    # after the others serve from the bucket.
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("backend", String(16), nullable=False),  # "s3"
    Column("bucket", Text),
    Column("prefix", Text),
    Column("endpoint_url", Text),
    Column("moved_at", Float, nullable=False),
)


def insert_missing_threads(db: Connection, rows: list[dict[str, Any]]) -> None:
    """Rows of the `threads` table for threads that have none; a row already there (made
    meanwhile by another request or instance) is kept as it is."""
    if rows:
        dialect_insert = pg_insert if db.dialect.name == "postgresql" else sqlite_insert
        db.execute(dialect_insert(threads).values(rows).on_conflict_do_nothing())


def seed_record_versions(db: Connection) -> None:
    """Give every thread with records and no `record_versions` row one (version 1): rows
    copied in from elsewhere (a migration, an import of an earlier release's file) are
    then covered by the version every later write bumps."""
    from sqlalchemy import exists
    from sqlalchemy import literal
    from sqlalchemy import select

    missing = (
        select(uploads.c.scope, literal(1))
        .where(~exists().where(record_versions.c.scope == uploads.c.scope))
        .distinct()
    )
    db.execute(record_versions.insert().from_select(["scope", "version"], missing))


class DatabaseUnavailable(Exception):
    """The database cannot be reached right now; the request may be retried later."""


# What PostgreSQL (and libpq) say when the server answered and refused whom or what the URL
# names: no waiting mends these, an operator must. Connection errors carry no SQLSTATE in
# psycopg, so the (English) words are read; a server speaking another language is taken
# for one out of reach, and the log line of each retry names what it said.
_REFUSED_BY_CONFIGURATION = (
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "no pg_hba.conf entry",
    "pg_hba.conf rejects connection",
    "does not exist",  # role "..." / database "..." does not exist
    "is not permitted to log in",
    "permission denied for database",
    "server does not support ssl",
    "invalid sslmode value",
    "invalid connection option",
)


def is_misconfigured(error: BaseException) -> bool:
    """Whether a failure to connect means the URL is wrong (its user, password or database
    is refused) rather than the server being out of reach: the first stops start-up with a
    clear message, the second is waited out (`is_unavailable`)."""
    if not isinstance(error, OperationalError):
        return False
    message = str(getattr(error, "orig", error)).lower()
    return any(words in message for words in _REFUSED_BY_CONFIGURATION)


def default_database_url(base_dir: Path) -> str:
    """The embedded default: one SQLite file under the data dir."""
    return f"sqlite:///{base_dir / DATABASE_FILE}"


def is_sqlite(engine: Engine) -> bool:
    """Whether the engine is the embedded SQLite one (locking and caching differ)."""
    return engine.dialect.name == "sqlite"


def _sqlite_connect(connection: Any, _record: Any) -> None:
    """Autocommit at the driver (transactions are begun in `_sqlite_begin`), WAL, FKs."""
    connection.isolation_level = None
    cursor = connection.cursor()
    for pragma in (
        f"PRAGMA busy_timeout = {int(BUSY_SLICE_SECONDS * 1000)}",
        "PRAGMA foreign_keys = ON",
        "PRAGMA synchronous = NORMAL",
        "PRAGMA journal_mode = WAL",  # a new file: another process may hold it meanwhile
    ):
        _retry_busy(lambda statement=pragma: cursor.execute(statement))
    cursor.close()


def _is_busy(error: Exception) -> bool:
    text = str(error)
    return "locked" in text or "busy" in text


def _retry_busy(attempt: Any) -> Any:
    """Run `attempt` until SQLite stops answering "locked", sleeping in Python between tries.

    The sleeps stay short: with one writer per process polling (`write_transaction`), a
    long one is the time the lock lies free after another process lets it go, and eight
    uploads committing at once measured 0.97x gthread with 50 ms between tries against
    1.00x with 5 ms, in the same rounds.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    delay = 0.001
    while True:
        try:
            return attempt()
        except Exception as error:  # sqlite3.OperationalError, wrapped or not
            if not _is_busy(error) or time.monotonic() > deadline:
                raise
        time.sleep(delay)  # gevent's sleep when the server runs on gevent
        delay = min(delay * 2, BUSY_RETRY_MAX_SECONDS)


def _sqlite_begin(conn: Connection) -> None:
    """BEGIN (readers) or BEGIN IMMEDIATE (writers: the write lock up front, see below).

    A deferred transaction that reads and then writes can fail at once when another
    connection committed meanwhile (WAL snapshots), so writers take the lock first, waiting
    for it cooperatively.
    """
    mode = conn.get_execution_options().get("sqlite_begin", "")
    statement = f"BEGIN {mode}".strip()
    raw = conn.connection.dbapi_connection
    assert raw is not None
    _retry_busy(lambda: raw.execute(statement))


# Per SQLite engine: the lock its writers of this process queue on (see write_transaction).
_writers_gates: weakref.WeakKeyDictionary[Engine, Any] = weakref.WeakKeyDictionary()


def make_engine(url: str) -> Engine:
    """An engine for `url`.

    SQLite files get WAL, no C-level busy wait and explicit BEGINs; connections are
    pooled without a hard cap (SQLite connections are cheap and a capped pool would make
    greenlets queue). A server database gets connect timeouts and `pool_pre_ping`, so a
    restarted server is found again without restarting the app.
    """
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": BUSY_SLICE_SECONDS},
            pool_size=8,
            max_overflow=-1,
            # The most recently used connection first: the records cache lives per
            # connection, and the listing cache above it keeps its JSON only while the very
            # same record objects come back (FIFO would rotate through eight caches).
            pool_use_lifo=True,
        )
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        _writers_gates[engine] = threading.RLock()  # created now: cooperative under gevent
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            _private_sqlite_file(Path(url.removeprefix("sqlite:///")))
    else:
        connect_args: dict[str, Any] = {}
        if url.startswith("postgresql"):
            connect_args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        engine = create_engine(
            url,
            connect_args=connect_args,
            pool_pre_ping=True,
            pool_size=10,
            max_overflow=20,
            pool_timeout=CONNECT_TIMEOUT_SECONDS * 2,
        )
    return engine


def _private_sqlite_file(path: Path) -> None:
    """Create the database file with `SECRET_FILE_MODE` before SQLite opens it, or tighten
    it and its journals (an earlier release left them 0644).

    It holds password hashes, emails and token hashes. SQLite itself would create it 0644
    less the umask, and gives its -wal and -shm files the database file's mode.
    """
    make_dirs_with_mode(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, SECRET_FILE_MODE)
    os.close(fd)  # an empty file is an empty database to SQLite
    for name in (path.name, *(path.name + suffix for suffix in SQLITE_JOURNALS)):
        tighten_secret_file(path.with_name(name))


@contextmanager
def _writers_turn(engine: Engine) -> Iterator[None]:
    """This process's turn to write to a SQLite engine; waits as long as SQLite would."""
    gate = _writers_gates.get(engine)
    if gate is None:  # a server database locks rows, not the whole file
        yield
        return
    if not gate.acquire(timeout=BUSY_TIMEOUT_SECONDS):
        raise sqlite3.OperationalError("database is locked")  # what SQLite says by then
    try:
        yield
    finally:
        gate.release()


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: on SQLite it holds the write lock from its start.

    Commits when the block ends, rolls back when it raises. On SQLite the writers of one
    process queue on a lock of their own first, so only one of them at a time polls for
    the file's write lock while another process holds it; the rest wait without a cycle
    of the CPU. (500 uploads committing within a second over two processes: every one of
    them retried BEGIN IMMEDIATE, and a fast client's list waited behind the retries.)
    """
    with _writers_turn(engine), engine.connect() as conn:
        if is_sqlite(engine):
            conn.execution_options(sqlite_begin="IMMEDIATE")
        with conn.begin():
            yield conn


# SQLite's SQLITE_FULL ("database or disk is full": the file or its journal cannot grow)
# and PostgreSQL's SQLSTATE class 53 (insufficient resources: disk_full is 53100).
_SQLITE_FULL = "database or disk is full"
_POSTGRES_DISK_FULL = "53100"


def is_storage_full(error: BaseException) -> bool:
    """Whether a database error means "no space left where the database writes": the
    database answered, and the fix is freeing disk space, not waiting for a restart."""
    if not isinstance(error, DBAPIError | sqlite3.Error):
        return False
    if _SQLITE_FULL in str(error):
        return True
    original = getattr(error, "orig", error)
    return getattr(original, "sqlstate", None) == _POSTGRES_DISK_FULL


def is_unavailable(error: BaseException) -> bool:
    """Whether a database error means "cannot reach the server" rather than a bug.

    A lost connection, a refused one and a server shutting down are all operational errors
    flagged as disconnects (or timeouts of the connection pool), and so is an app that
    could not start on its database yet (`DatabaseUnavailable`); a constraint violation
    or bad SQL is not, nor is a full disk (`is_storage_full`).
    """
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(error, PoolTimeout | DatabaseUnavailable):
        return True
    if isinstance(error, DBAPIError):
        if error.connection_invalidated:
            return True
        if isinstance(error, OperationalError) and not (_is_busy(error) or is_storage_full(error)):
            return True
    return False
