"""The shared database: migrations, in-place upgrade of older data dirs, losing the server.

A data dir made by the releases before this database layer is rebuilt here with the very
schema those releases created (their SQL, copied below), then opened by the current code.
"""

from __future__ import annotations

import io
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import select
from sqlalchemy import text

from deerflow_web.services.accounts.service import AccountService
from deerflow_web.storage import database
from deerflow_web.storage.chat_turns import DatabasePreviewHistory
from deerflow_web.storage.database import metadata
from deerflow_web.storage.database import uploads
from deerflow_web.storage.migrate import IMPORTED_SUFFIX
from deerflow_web.storage.migrate import current_revision
from deerflow_web.storage.migrate import head_revision
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.records import DatabaseUploadRecords
from deerflow_web.storage.resumable import DatabaseResumableStore
from tests.helpers import TEST_EMAIL
from tests.helpers import USER_ID
from tests.helpers import needs_auth
from tests.support.postgres import PostgresServer

# The first release's records file (`uploads.sqlite3`).
FIRST_RELEASE_UPLOADS = """
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
    PRIMARY KEY (scope, filename)
) WITHOUT ROWID;
"""
# What the release before this one added: a column, resumable uploads, preview turns.
ADDED_COLUMN = "ALTER TABLE uploads ADD COLUMN source_sha256 TEXT"
RESUMABLE = """
CREATE TABLE IF NOT EXISTS resumable_uploads (
    upload_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    user_id TEXT,
    filename TEXT NOT NULL,
    on_conflict TEXT NOT NULL,
    metadata TEXT NOT NULL,
    length INTEGER NOT NULL,
    upload_offset INTEGER NOT NULL,
    pending_from INTEGER,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    staging_path TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS resumable_uploads_expiry ON resumable_uploads (expires_at);
CREATE INDEX IF NOT EXISTS resumable_uploads_staging ON resumable_uploads (staging_path);
"""
PREVIEWS = """
CREATE TABLE IF NOT EXISTS preview_turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    created_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS preview_turns_scope ON preview_turns (scope, id);
"""
# The accounts file (`deerflow.sqlite3`) as `metadata.create_all` made it, before migrations.
ACCOUNTS = """
CREATE TABLE users (
    id VARCHAR(36) NOT NULL, email VARCHAR(320) NOT NULL, password_hash VARCHAR(255) NOT NULL,
    system_role VARCHAR(16) NOT NULL, needs_setup BOOLEAN NOT NULL, disabled BOOLEAN NOT NULL,
    created_at FLOAT NOT NULL, PRIMARY KEY (id), UNIQUE (email)
);
CREATE TABLE login_failures (
    id INTEGER NOT NULL, kind VARCHAR(16) NOT NULL, subject VARCHAR(320) NOT NULL,
    at FLOAT NOT NULL, PRIMARY KEY (id)
);
CREATE INDEX ix_login_failures_subject ON login_failures (kind, subject, at);
CREATE TABLE sessions (
    id_hash VARCHAR(64) NOT NULL, user_id VARCHAR(36) NOT NULL, created_at FLOAT NOT NULL,
    expires_at FLOAT NOT NULL, PRIMARY KEY (id_hash),
    FOREIGN KEY(user_id) REFERENCES users (id) ON DELETE CASCADE
);
CREATE INDEX ix_sessions_user ON sessions (user_id);
CREATE TABLE api_tokens (
    id VARCHAR(36) NOT NULL, token_hash VARCHAR(64) NOT NULL, user_id VARCHAR(36) NOT NULL,
    name VARCHAR(100) NOT NULL, created_at FLOAT NOT NULL, expires_at FLOAT,
    last_used_at FLOAT, PRIMARY KEY (id), UNIQUE (token_hash),
    FOREIGN KEY(user_id) REFERENCES users (id) ON DELETE CASCADE
);
CREATE INDEX ix_api_tokens_user ON api_tokens (user_id);
CREATE TABLE thread_owners (
    thread_id VARCHAR(64) NOT NULL, user_id VARCHAR(36) NOT NULL, created_at FLOAT NOT NULL,
    PRIMARY KEY (thread_id), FOREIGN KEY(user_id) REFERENCES users (id) ON DELETE CASCADE
);
CREATE INDEX ix_thread_owners_user ON thread_owners (user_id);
"""


def _old_file(path: Path, script: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")  # as the old stores ran them
    db.executescript(script)
    return db


def _record_row(scope: str, name: str, *extra: object) -> tuple:
    return (scope, name, 3, "ab" * 32, "text/plain", 10.0, 10_000_000_000, 7, "upload",
            None, None, None, None, None, *extra)  # fmt: skip


def make_first_release_dir(base_dir: Path) -> None:
    """Records of the flat single-user layout, with the first release's columns."""
    with closing(_old_file(base_dir / "uploads.sqlite3", FIRST_RELEASE_UPLOADS)) as db:
        db.executemany(
            "INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_record_row("threads/T", f"f{n}.txt") for n in range(1500)],
        )


def make_previous_release_dir(base_dir: Path) -> None:
    """Every file the release before this one wrote: records, tus state, turns, accounts."""
    with closing(_old_file(base_dir / "uploads.sqlite3", FIRST_RELEASE_UPLOADS)) as db:
        db.execute(ADDED_COLUMN)
        db.executescript(RESUMABLE)
        db.execute(
            "INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _record_row("users/u1/threads/T", "a.txt", "cd" * 32),
        )
        db.execute(
            "INSERT INTO resumable_uploads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ("up1", "T", "u1", "big.bin", "rename", "{}", 100, 40, None, 1.0, 2e9, "/x/.part"),
        )
    with closing(_old_file(base_dir / "previews.sqlite3", PREVIEWS)) as db:
        db.execute(
            "INSERT INTO preview_turns (scope, created_at, data) VALUES (?, ?, ?)",
            ("users/u1/threads/T", 5.0, '{"text":"hi"}'),
        )
    with closing(_old_file(base_dir / "deerflow.sqlite3", ACCOUNTS)) as db:
        db.execute("INSERT INTO users VALUES ('u1', 'old@example.com', 'x', 'admin', 0, 0, 1.0)")


def test_a_new_database_matches_the_declared_tables(
    base_dir: Path, empty_database_url: str
) -> None:
    """The migrations build exactly what `database.py` declares (no drift either way)."""
    engine = open_database(base_dir, empty_database_url)
    with engine.connect() as db:
        assert current_revision(db) == head_revision()
        assert compare_metadata(MigrationContext.configure(db), metadata) == []
    engine.dispose()


def test_a_first_release_data_dir_upgrades_in_place(base_dir: Path) -> None:
    make_first_release_dir(base_dir)
    engine = open_database(base_dir)
    records = DatabaseUploadRecords(engine).all("threads/T")
    assert len(records) == 1500
    assert records[0].record.size == 3 and records[0].record.source_sha256 is None
    assert not (base_dir / "uploads.sqlite3").exists()
    kept = base_dir / f"uploads.sqlite3{IMPORTED_SUFFIX}"  # nothing deleted
    with closing(sqlite3.connect(kept)) as old:
        assert old.execute("SELECT COUNT(*) FROM uploads").fetchone() == (1500,)
    with engine.connect() as db:
        assert compare_metadata(MigrationContext.configure(db), metadata) == []
    engine.dispose()


def test_the_previous_release_data_dir_upgrades_in_place(base_dir: Path) -> None:
    make_previous_release_dir(base_dir)
    engine = open_database(base_dir)
    [record] = DatabaseUploadRecords(engine).all("users/u1/threads/T")
    assert record.record.source_sha256 == "cd" * 32
    upload = DatabaseResumableStore(engine).get("up1")
    assert upload is not None and (upload.offset, upload.length) == (40, 100)
    [turn] = DatabasePreviewHistory(engine).turns("users/u1/threads/T")
    assert turn.data == {"text": "hi"}
    later = DatabasePreviewHistory(engine).append("users/u1/threads/T", {"text": "again"})
    assert later.turn_id > turn.turn_id
    account = AccountService(engine).find_by_email("old@example.com")
    assert account is not None and account.id == "u1"
    with engine.connect() as db:
        assert compare_metadata(MigrationContext.configure(db), metadata) == []
    assert sorted(p.name for p in base_dir.iterdir() if "sqlite3" in p.name) == [
        "deerflow.sqlite3",
        "deerflow.sqlite3-shm",
        "deerflow.sqlite3-wal",
        f"previews.sqlite3{IMPORTED_SUFFIX}",
        f"uploads.sqlite3{IMPORTED_SUFFIX}",
    ]
    engine.dispose()


def test_old_records_can_be_imported_into_postgresql(base_dir: Path, postgres_url: str) -> None:
    """Moving a single-machine data dir onto a server: its records follow it."""
    make_previous_release_dir(base_dir)
    (base_dir / "deerflow.sqlite3").unlink()  # accounts are not carried over, see migrate.py
    engine = open_database(base_dir, postgres_url)
    assert len(DatabaseUploadRecords(engine).all("users/u1/threads/T")) == 1
    assert DatabaseResumableStore(engine).get("up1") is not None
    history = DatabasePreviewHistory(engine)
    assert history.append("s", {}).turn_id > history.turns("users/u1/threads/T")[0].turn_id
    engine.dispose()


def test_instances_starting_together_migrate_once(base_dir: Path, empty_database_url: str) -> None:
    make_first_release_dir(base_dir)
    engines, errors = [], []
    start = threading.Barrier(4)

    def start_instance() -> None:
        start.wait()
        try:
            engines.append(open_database(base_dir, empty_database_url))
        except Exception as error:  # the test reports it below
            errors.append(error)

    threads = [threading.Thread(target=start_instance) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with engines[0].connect() as db:
        count = db.execute(select(uploads.c.filename).where(uploads.c.scope == "threads/T"))
        assert len(count.all()) == 1500  # imported once, whoever did it
        assert current_revision(db) == head_revision()
    for engine in engines:
        engine.dispose()


def test_db_upgrade_command(base_dir: Path, make_app) -> None:
    app = make_app()
    make_first_release_dir(base_dir)  # appears after start-up: the command imports it
    result = app.test_cli_runner().invoke(args=["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert head_revision() in result.output
    assert (base_dir / f"uploads.sqlite3{IMPORTED_SUFFIX}").exists()


@pytest.fixture
def postgres_app(make_app, own_postgres_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DATABASE_URL", own_postgres_url)
    app = make_app()
    yield app
    app.extensions["deerflow_web"].engine.dispose()  # before the database is dropped


def _list(client) -> int:
    return client.get("/api/threads/T/uploads/list").status_code


def test_losing_postgresql_answers_503_and_recovers_without_a_restart(
    postgres_app, own_postgres: PostgresServer, own_postgres_url: str
) -> None:
    client = postgres_app.test_client()
    assert _list(client) == 200
    assert client.get("/readyz").status_code == 200

    own_postgres.terminate_connections(own_postgres_url)  # a failover cuts every connection
    assert _list(client) == 200  # pool_pre_ping reconnects

    own_postgres.stop_server()
    try:
        response = client.get("/api/threads/T/uploads/list")
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "5"
        assert "database" in response.get_json()["detail"]
        upload = client.post(
            "/api/threads/T/uploads", data={"files": [(io.BytesIO(b"x"), "a.txt")]}
        )
        assert upload.status_code == 503
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.get_json()["database"] == "failed"
        assert ready.get_json()["storage"] == "ok"
    finally:
        own_postgres.start_server()
    assert _list(client) == 200
    assert client.get("/readyz").status_code == 200
    assert (
        client.post(
            "/api/threads/T/uploads", data={"files": [(io.BytesIO(b"x"), "a.txt")]}
        ).status_code
        == 200
    )
    with postgres_app.extensions["deerflow_web"].engine.connect() as db:
        assert db.execute(text("SELECT COUNT(*) FROM uploads")).scalar_one() == 1


@needs_auth
def test_accounts_live_in_postgresql_too(postgres_app) -> None:
    """The test user signs in against the PostgreSQL database the app was given."""
    services = postgres_app.extensions["deerflow_web"]
    assert services.accounts.find_by_email(TEST_EMAIL).id == USER_ID
    assert services.uploads.records.engine.dialect.name == "postgresql"
    assert _list(postgres_app.test_client()) == 200


def test_a_writer_waits_for_its_turn_in_the_process_no_longer_than_sqlite_would(
    base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_database(base_dir)
    monkeypatch.setattr(database, "BUSY_TIMEOUT_SECONDS", 0.2)
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with database.write_transaction(engine):
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            with database.write_transaction(engine):
                pass
    finally:
        leave.set()
        holder.join()
    with database.write_transaction(engine) as conn:  # the turn came back with the holder
        conn.execute(text("SELECT 1"))
