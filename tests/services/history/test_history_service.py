"""The history services on their own (services/history): faults in the version step,
links versus copies, and trash expiry by the clock, on SQLite and PostgreSQL."""

from __future__ import annotations

import errno
import os
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.errors import StorageFailure
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.services.history import versions as versions_module
from deerflow_web.services.history.hooks import make_history
from deerflow_web.services.history.versions import versioned_file
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import HistorySettings
from deerflow_web.storage.history import link_or_copy
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.paths import is_staging_name
from tests.helpers import thread_ref

FILE = versioned_file("/mnt/user-data/uploads/a.txt")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def services(base_dir: Path, database_url: str) -> Any:
    engine = open_database(base_dir, database_url)
    uploads = make_upload_service(base_dir, engine=engine)
    history = make_history(uploads, HistorySettings())
    yield uploads, history
    engine.dispose()


def upload(uploads: Any, body: bytes, name: str = "a.txt") -> None:
    incoming = IncomingFile(name, BytesIO(body))
    uploads.save_uploads(thread_ref("t"), [incoming], on_conflict=OnConflict.REPLACE)


def folder_of(uploads: Any) -> Path:
    return uploads.folders(thread_ref("t")).uploads_dir()


def test_a_failing_version_step_refuses_the_replace_and_keeps_the_current_file(
    services: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploads, history = services
    upload(uploads, b"current")
    inode = (folder_of(uploads) / "a.txt").stat().st_ino

    def broken(source: Path, dest: Path) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(versions_module, "link_or_copy", broken)
    with pytest.raises(StorageFailure):
        upload(uploads, b"replacement")
    path = folder_of(uploads) / "a.txt"
    assert path.read_bytes() == b"current" and path.stat().st_ino == inode
    assert not [n for n in os.listdir(folder_of(uploads)) if is_staging_name(n)]
    assert history.versions.list(thread_ref("t"), FILE) == []
    assert [r.sha256 for r in uploads.list_uploads(thread_ref("t"))] == [
        uploads.get_upload(thread_ref("t"), "a.txt").sha256
    ]


def test_the_kept_version_is_the_same_inode_not_a_copy(services: Any) -> None:
    uploads, history = services
    upload(uploads, b"old bytes")
    inode = (folder_of(uploads) / "a.txt").stat().st_ino
    upload(uploads, b"new bytes")
    (version,) = history.versions.list(thread_ref("t"), FILE)
    _, path = history.versions.get(thread_ref("t"), FILE, version.version_id)
    assert path.stat().st_ino == inode and path.stat().st_nlink == 1
    assert path.read_bytes() == b"old bytes"


def test_where_no_link_can_be_made_the_version_is_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, dest = tmp_path / "current", tmp_path / "version"
    source.write_bytes(b"old bytes")

    def no_links(_source: Any, _dest: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr("deerflow_web.storage.history.os.link", no_links)
    link_or_copy(source, dest)
    monkeypatch.undo()
    assert dest.read_bytes() == b"old bytes" and dest.stat().st_ino != source.stat().st_ino


def test_trash_entries_expire_after_the_configured_days(base_dir: Path, database_url: str) -> None:
    engine = open_database(base_dir, database_url)
    try:
        uploads = make_upload_service(base_dir, engine=engine)
        history = make_history(uploads, HistorySettings(trash_days=2))
        clock = Clock()
        history.trash_bin._clock = clock
        upload(uploads, b"x", "old.txt")
        uploads.delete_upload(thread_ref("t"), "old.txt")
        clock.now += 86400
        upload(uploads, b"y", "new.txt")
        uploads.delete_upload(thread_ref("t"), "new.txt")
        trash_dir = uploads.folders(thread_ref("t")).trash_dir()
        assert len(history.trash_bin.list(thread_ref("t"))) == 2
        clock.now += 86400 + 1  # old.txt is two days and a second old
        assert [e.filename for e in history.trash_bin.list(thread_ref("t"))] == ["new.txt"]
        assert len(os.listdir(trash_dir)) == 1
        # the sweeper's entry point, across threads
        assert history.trash_bin.purge_expired_trash(clock.now + 86400) == 1
        assert history.trash_bin.list(thread_ref("t")) == []
        assert os.listdir(trash_dir) == []
    finally:
        engine.dispose()


def test_versions_follow_a_rename_and_a_rename_over_a_name_keeps_a_version(
    services: Any,
) -> None:
    uploads, history = services
    upload(uploads, b"a1")
    upload(uploads, b"a2")
    upload(uploads, b"b1", "b.txt")
    uploads.rename_upload(thread_ref("t"), "a.txt", "b.txt", on_conflict=OnConflict.REPLACE)
    b_file = versioned_file("/mnt/user-data/uploads/b.txt")
    listed = history.versions.list(thread_ref("t"), b_file)
    contents = set()
    for version in listed:
        _, path = history.versions.get(thread_ref("t"), b_file, version.version_id)
        contents.add(path.read_bytes())
    assert contents == {b"a1", b"b1"}  # a.txt's own version, and the b.txt it replaced
    assert (folder_of(uploads) / "b.txt").read_bytes() == b"a2"


def test_history_bytes_counts_one_users_versions_and_trash(services: Any, base_dir: Path) -> None:
    from deerflow_web.storage.history import history_bytes

    uploads, _history = services
    upload(uploads, b"12345")
    upload(uploads, b"1234567")  # the 5 bytes become a version
    upload(uploads, b"abc", "gone.txt")
    uploads.delete_upload(thread_ref("t"), "gone.txt")  # 3 bytes in the trash
    scope = uploads.folders(thread_ref("t")).scope
    prefix = scope.rsplit("/", 1)[0] + "/"
    with uploads.records.engine.connect() as db:
        assert history_bytes(db, prefix) == (5, 3)
        assert history_bytes(db, prefix + "other_") == (0, 0)
