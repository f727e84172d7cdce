"""The thread catalog without Flask (services/threads/catalog.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import pytest
from sqlalchemy import select

from deerflow_web.errors import ThreadNotFound
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.prompt.chat_preview import make_chat_preview_service
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.storage.database import threads
from deerflow_web.storage.migrate import open_database
from tests.helpers import thread_ref


@pytest.fixture
def catalog(base_dir: Path, database_url: str) -> Iterator[ThreadCatalog]:
    engine = open_database(base_dir, database_url)
    uploads = make_upload_service(base_dir, None, engine)
    yield ThreadCatalog(uploads, make_chat_preview_service(uploads))
    engine.dispose()


def rows(catalog: ThreadCatalog) -> list[tuple]:
    with catalog.engine.connect() as db:
        return [tuple(r[:2]) for r in db.execute(select(threads)).all()]


def test_one_user_creating_one_id_at_once_gets_one_thread(catalog: ThreadCatalog) -> None:
    barrier = threading.Barrier(8)
    outcomes = []

    def create() -> None:
        barrier.wait()
        outcomes.append(catalog.create("u1", "same", title="First"))

    workers = [threading.Thread(target=create) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(created for _record, created in outcomes) == [False] * 7 + [True]
    records = [record for record, _created in outcomes]
    assert all(record == records[0] for record in records)
    assert rows(catalog) == [("u1", "same")]
    assert catalog.paths.uploads_dir(thread_ref("same", "u1")).is_dir()


def test_the_same_id_is_a_thread_of_each_user(catalog: ThreadCatalog) -> None:
    catalog.create("u1", "p", title="One's")
    catalog.create("u2", "p", metadata={"x": 1})
    catalog.create(SINGLE_USER, "p")  # the single-user layout's
    assert sorted(rows(catalog)) == [("", "p"), ("u1", "p"), ("u2", "p")]
    assert (
        catalog.get(thread_ref("p", "u1")).title == "One's"
        and catalog.get(thread_ref("p", "u2")).title is None
    )
    catalog.delete(thread_ref("p", "u2"))
    assert catalog.get(thread_ref("p", "u1")).title == "One's"
    assert (
        catalog.paths.thread_dir(ThreadRef.single_user("p")).is_dir()
        and catalog.paths.thread_dir(thread_ref("p", "u1")).is_dir()
    )
    with pytest.raises(ThreadNotFound, match="Thread p not found"):
        catalog.get(thread_ref("p", "u2"))


def test_a_folder_made_without_a_row_is_adopted(catalog: ThreadCatalog) -> None:
    """An agent's sandbox (or an older release) made the folder: it is the user's thread."""
    catalog.paths.ensure_thread_dirs(thread_ref("by-agent", "u1"))
    stamp = 1_700_000_000.0
    os.utime(catalog.paths.thread_dir(thread_ref("by-agent", "u1")), (stamp, stamp))
    assert rows(catalog) == []
    assert catalog.exists(thread_ref("by-agent", "u1")) and not catalog.exists(
        thread_ref("by-agent", "u2")
    )
    [record] = catalog.all("u1")
    assert record.thread_id == "by-agent" and record.created_at >= stamp
    assert rows(catalog) == [("u1", "by-agent")]
    assert catalog.all("u2") == []


def test_delete_takes_the_folder_records_and_turns(catalog: ThreadCatalog) -> None:
    uploads = catalog._uploads
    uploads.save_uploads(thread_ref("t", "u1"), [IncomingFile("a.txt", BytesIO(b"a"))])
    catalog._previews.preview(thread_ref("t", "u1"), "hi", ["a.txt"], "current")
    uploads.save_uploads(thread_ref("t", "u2"), [IncomingFile("b.txt", BytesIO(b"b"))])
    catalog.delete(thread_ref("t", "u1"))
    assert not catalog.paths.thread_dir(thread_ref("t", "u1")).exists()
    assert (
        uploads.list_uploads(thread_ref("t", "u1")) == []
        and catalog._previews.history(thread_ref("t", "u1")) == []
    )
    assert [r.filename for r in uploads.list_uploads(thread_ref("t", "u2"))] == ["b.txt"]
    assert not list(
        catalog.paths.thread_dir(thread_ref("t", "u1")).parent.iterdir()
    )  # no hidden leftovers
    with pytest.raises(ThreadNotFound):
        catalog.delete(thread_ref("t", "u1"))


def test_a_create_that_cannot_make_its_folders_leaves_no_row(
    catalog: ThreadCatalog, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (catalog.paths.base_dir / "users" / "u1").mkdir(parents=True)
    os.symlink(outside, catalog.paths.base_dir / "users" / "u1" / "threads")
    with pytest.raises(UnsafeFolder):
        catalog.create("u1", "t")
    assert rows(catalog) == [] and list(outside.iterdir()) == []


def test_many_folders_are_adopted_by_one_listing(catalog: ThreadCatalog) -> None:
    """The first listing after an upgrade finds every old folder (one transaction)."""
    for n in range(300):
        catalog.paths.make_dirs(catalog.paths.thread_dir(thread_ref(f"old-{n:03d}", "u1")))
    catalog.create("u1", "new-one", title="New")
    listed = catalog.all("u1")
    assert len(listed) == 301 and listed[0].thread_id == "new-one"  # newest first
    assert len(rows(catalog)) == 301
    assert catalog.search("u1", query="OLD-29", limit=None)[-1].thread_id == "old-290"
