"""The shared database: engine and tables for accounts, sessions, tokens, lockouts, owners.

SQLAlchemy Core over an embedded SQLite file by default (`{base}/deerflow.sqlite3`), or the
server named by `DATABASE_URL` / `database.url` (SPEC 9). Everything several server
processes must agree on (who is signed in, which session was revoked, how many logins
failed, who owns a thread) lives here and never in one process's memory. The SQL stays
portable: no SQLite-only syntax, so PostgreSQL can serve the same tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Boolean
from sqlalchemy import Column
from sqlalchemy import Engine
from sqlalchemy import Float
from sqlalchemy import ForeignKey
from sqlalchemy import Index
from sqlalchemy import Integer
from sqlalchemy import MetaData
from sqlalchemy import String
from sqlalchemy import Table
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

DATABASE_FILE = "deerflow.sqlite3"

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
    Column("expires_at", Float, nullable=False),
    Index("ix_sessions_user", "user_id"),
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
    Column("kind", String(16), nullable=False),  # "address" or "account"
    Column("subject", String(320), nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_login_failures_subject", "kind", "subject", "at"),
)

thread_owners = Table(
    "thread_owners",
    metadata,
    # Thread ids are global: the first user to write to an id claims it (SPEC 7.4).
    Column("thread_id", String(64), primary_key=True),
    Column("user_id", String(36), ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_thread_owners_user", "user_id"),
)


def default_database_url(base_dir: Path) -> str:
    """The embedded default: one SQLite file under the data dir."""
    return f"sqlite:///{base_dir / DATABASE_FILE}"


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    """Wait for other processes' writes instead of failing, and let readers run alongside."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 30000")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get WAL, a busy timeout and foreign keys."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    return engine


def create_schema(engine: Engine) -> None:
    """Create the tables that do not exist yet (migrations come with the database work).

    Several server processes start at once; one that loses the race to create a table
    sees it exist on the second look.
    """
    try:
        metadata.create_all(engine)
    except OperationalError:
        metadata.create_all(engine)
