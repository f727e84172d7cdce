"""Bring the shared database to the current schema, once, however many instances start.

`upgrade_database` runs the Alembic migrations in `storage/migrations` under a lock: a
PostgreSQL advisory lock held by the migrating transaction, or SQLite's write lock (BEGIN
IMMEDIATE; SQLite's DDL is transactional too). Instances that start together wait for the
first one and then find nothing left to do. `flask --app app db upgrade` runs the same.

Data dirs of earlier releases kept the upload records (and resumable uploads) in
`uploads.sqlite3` and the chat preview turns in `previews.sqlite3`. Their rows are copied
into the shared database in the same locked transaction, rows already there win (so a copy
cut off half-way is simply done again), and the old file is then kept beside the data as
`<name>.imported`: nothing is deleted.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy import Table
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from deerflow_web.storage.database import default_database_url
from deerflow_web.storage.database import make_engine
from deerflow_web.storage.database import preview_turns
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import seed_record_versions
from deerflow_web.storage.database import uploads
from deerflow_web.storage.database import write_transaction

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK_KEY = 0x6465_6572  # any constant shared by every instance ("deer")
IMPORTED_SUFFIX = ".imported"
BATCH = 1000

# Files of earlier releases and the tables whose rows they hold.
LEGACY_FILES: dict[str, tuple[Table, ...]] = {
    "uploads.sqlite3": (uploads, resumable_uploads),
    "previews.sqlite3": (preview_turns,),
}


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    """The newest revision in `migrations/versions`."""
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at (None: never migrated)."""
    return MigrationContext.configure(connection).get_current_revision()


def _legacy_files(base_dir: Path | None) -> list[Path]:
    if base_dir is None:
        return []
    return [base_dir / name for name in LEGACY_FILES if (base_dir / name).is_file()]


def needs_upgrade(engine: Engine, base_dir: Path | None = None) -> bool:
    """Whether `upgrade_database` has anything to do (a cheap check without the lock)."""
    if _legacy_files(base_dir):
        return True
    with engine.connect() as connection:
        return current_revision(connection) != head_revision()


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    """A transaction holding the migration lock until it commits."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
            yield connection
    else:
        with write_transaction(engine) as connection:
            yield connection


def upgrade_database(engine: Engine, base_dir: Path | None = None) -> None:
    """Migrate to the newest revision and import the files of earlier releases.

    Returns at once when there is nothing to do, so every process can call it at start-up.
    """
    if not needs_upgrade(engine, base_dir):
        return
    imported: list[Path] = []
    with _locked(engine) as connection:
        from alembic import command

        if current_revision(connection) != head_revision():
            command.upgrade(_config(connection), "head")
        for path in _legacy_files(base_dir):
            _import_legacy(connection, path)
            imported.append(path)
        if imported:
            seed_record_versions(connection)
    for path in imported:
        try:
            path.rename(path.with_name(path.name + IMPORTED_SUFFIX))
        except FileNotFoundError:
            pass  # another instance imported the same file and moved it first
        for companion in ("-wal", "-shm"):
            path.with_name(path.name + companion).unlink(missing_ok=True)


def open_database(base_dir: Path, url: str | None = None) -> Engine:
    """The engine for `url` (default: the data dir's SQLite file), upgraded and ready."""
    engine = make_engine(url or default_database_url(base_dir))
    upgrade_database(engine, base_dir)
    return engine


def _insert_ignoring_duplicates(connection: Connection, table: Table, rows: list[dict]) -> None:
    insert = pg_insert if connection.dialect.name == "postgresql" else sqlite_insert
    connection.execute(insert(table).on_conflict_do_nothing(), rows)


def _import_legacy(connection: Connection, path: Path) -> None:
    """Copy every row of the tables the old file has; columns it lacks stay NULL."""
    with closing(sqlite3.connect(path)) as old:
        present_tables = {
            row[0] for row in old.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        for table in LEGACY_FILES[path.name]:
            if table.name not in present_tables:
                continue
            old_columns = {row[1] for row in old.execute(f"PRAGMA table_info({table.name})")}
            columns = [c.name for c in table.columns if c.name in old_columns]
            cursor = old.execute(f"SELECT {', '.join(columns)} FROM {table.name}")
            count = 0
            while rows := cursor.fetchmany(BATCH):
                _insert_ignoring_duplicates(
                    connection, table, [dict(zip(columns, row, strict=True)) for row in rows]
                )
                count += len(rows)
            logger.info("imported %d row(s) of %s from %s", count, table.name, path.name)
        old.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the kept file holds every row
        old.execute("PRAGMA journal_mode = DELETE")
    if connection.dialect.name == "postgresql" and "preview_turns" in {
        t.name for t in LEGACY_FILES[path.name]
    }:
        # Imported ids were given explicitly: move the sequence past them.
        connection.execute(
            text(
                "SELECT setval(pg_get_serial_sequence('preview_turns', 'id'), "
                "COALESCE((SELECT MAX(id) FROM preview_turns), 0) + 1, false)"
            )
        )
