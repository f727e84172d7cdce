"""Migration 0008: records keep their rows and get no scan state; it downgrades cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine
from sqlalchemy import inspect
from sqlalchemy import text

from deerflow_web.storage.migrate import _config

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


def test_upgrade_from_0006_keeps_records_unscanned_and_downgrade_drops_the_columns(
    database_url: str, base_dir: Path
) -> None:
    engine = create_engine(database_url)
    try:
        with engine.begin() as db:
            command.upgrade(_config(db), "0007")
            db.execute(
                text(
                    "INSERT INTO uploads (scope, filename, size, sha256, content_type, "
                    "uploaded_at, mtime_ns, inode, source) VALUES ('threads/t1', 'a.txt', 1, "
                    "'ab', 'text/plain', 1.0, 1, 1, 'upload')"
                )
            )
        with engine.begin() as db:
            command.upgrade(_config(db), "0008")
        with engine.connect() as db:
            row = db.execute(text("SELECT filename, scan_state, scan_signatures FROM uploads"))
            assert row.all() == [("a.txt", None, None)]
            tables = set(inspect(db).get_table_names())
        assert {"scan_events", "job_leases"} <= tables
        with engine.begin() as db:
            command.downgrade(_config(db), "0007")
        with engine.connect() as db:
            columns = {c["name"] for c in inspect(db).get_columns("uploads")}
            tables = set(inspect(db).get_table_names())
            assert db.execute(text("SELECT filename FROM uploads")).all() == [("a.txt",)]
        assert "scan_state" not in columns and "scan_events" not in tables
    finally:
        engine.dispose()
