"""`install_storage`: where an install's bytes live once moved, and the start-up check every
process runs (an instance set to `local` on an install moved to S3 does not start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.errors import ConfigError
from deerflow_web.settings import S3Settings
from deerflow_web.settings import StorageSettings
from deerflow_web.storage.database import DATABASE_FILE
from deerflow_web.storage.database import make_engine
from deerflow_web.storage.install_storage import mark_moved
from deerflow_web.storage.install_storage import read_install_storage
from deerflow_web.storage.install_storage import refuse_local_after_move
from deerflow_web.storage.install_storage import refuse_local_after_move_at
from deerflow_web.storage.install_storage import settings_to_set
from deerflow_web.storage.migrate import open_database

S3 = S3Settings(endpoint_url="http://s3.internal:8333", bucket="files", prefix="deerflow")
LOCAL = StorageSettings("local", S3)
ON_S3 = StorageSettings("s3", S3)


def test_an_install_never_moved_starts_on_either_backend(base_dir: Path, database_url: str) -> None:
    engine = open_database(base_dir, database_url)
    assert read_install_storage(engine) is None
    refuse_local_after_move(engine, LOCAL)
    refuse_local_after_move(engine, ON_S3)
    engine.dispose()


def test_once_moved_only_an_instance_on_s3_starts(base_dir: Path, database_url: str) -> None:
    engine = open_database(base_dir, database_url)
    moved = mark_moved(engine, S3, now=1000.0)
    assert read_install_storage(engine) == moved
    assert (moved.backend, moved.bucket, moved.prefix, moved.moved_at) == (
        "s3",
        "files",
        "deerflow",
        1000.0,
    )
    with pytest.raises(ConfigError) as refused:
        refuse_local_after_move(engine, LOCAL)
    message = str(refused.value)
    assert message.startswith(
        "This install's files were moved to the S3 bucket files (prefix deerflow)"
    )
    for line in settings_to_set(moved):
        assert line in message
    assert "storage.backend: s3  (or DEER_FLOW_STORAGE_BACKEND=s3)" in message
    refuse_local_after_move(engine, ON_S3)
    assert mark_moved(engine, S3, now=2000.0).moved_at == 2000.0  # a rerun: still one row
    assert read_install_storage(engine).moved_at == 2000.0
    engine.dispose()


def test_the_agent_sides_check_opens_the_database_only_for_itself(
    base_dir: Path, database_url: str
) -> None:
    url = None if database_url.startswith("sqlite") else database_url
    refuse_local_after_move_at(base_dir, url, LOCAL)  # no row yet
    engine = open_database(base_dir, database_url)
    mark_moved(engine, S3)
    engine.dispose()
    with pytest.raises(ConfigError, match="DEER_FLOW_STORAGE_BACKEND=s3"):
        refuse_local_after_move_at(base_dir, url, LOCAL)
    refuse_local_after_move_at(base_dir, url, ON_S3)


def test_no_database_file_is_made_for_the_check(tmp_path: Path) -> None:
    refuse_local_after_move_at(tmp_path, None, LOCAL)
    assert not (tmp_path / DATABASE_FILE).exists()


def test_a_database_before_the_migration_was_never_moved(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / DATABASE_FILE}")
    with engine.begin() as db:
        db.exec_driver_sql("CREATE TABLE unrelated (id INTEGER)")
    assert read_install_storage(engine) is None
    refuse_local_after_move(engine, LOCAL)
    engine.dispose()
