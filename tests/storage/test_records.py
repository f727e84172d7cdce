"""The record store over SQLite and PostgreSQL (each test runs on both), without the
upload service."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from deerflow_web.models import ACTIVE_CONVERSION_STATES
from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import ResumableUpload
from deerflow_web.models import UploadRecord
from deerflow_web.storage.chat_turns import DatabasePreviewHistory
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.records import DatabaseUploadRecords
from deerflow_web.storage.records import StoredRecord
from deerflow_web.storage.resumable import DatabaseResumableStore


def stored(name: str, size: int = 1, **fields: object) -> StoredRecord:
    record = UploadRecord(name, size, "0" * 64, "text/plain", 10.0, 10.0, **fields)
    return StoredRecord(record, mtime_ns=10_000_000_000, inode=7)


@pytest.fixture
def records(base_dir: Path, database_url: str):
    engine = open_database(base_dir, database_url)
    yield DatabaseUploadRecords(engine)
    engine.dispose()


def test_put_get_and_all_round_trip(records: DatabaseUploadRecords) -> None:
    companion = stored("b.md", 3, source=RecordSource.DISK, converted_from="b.docx")
    with records.locked("s1") as txn:
        txn.put(stored("b.docx", 2, original_filename="B.docx"))
        txn.put(companion)
        txn.put(stored("a.txt"))
    assert [s.record.filename for s in records.all("s1")] == ["a.txt", "b.docx", "b.md"]
    assert records.get("s1", "b.md") == companion
    assert records.get("s1", "b.docx").record.original_filename == "B.docx"
    assert records.all("s2") == []


def test_a_failed_transaction_writes_nothing(records: DatabaseUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put(stored("keep.txt"))
    with pytest.raises(RuntimeError), records.locked("s1") as txn:
        txn.put(stored("new.txt"))
        txn.delete("keep.txt")
        raise RuntimeError("stop")
    assert [s.record.filename for s in records.all("s1")] == ["keep.txt"]


def test_cached_listing_sees_writes_of_another_connection(
    base_dir: Path, database_url: str
) -> None:
    first = DatabaseUploadRecords(open_database(base_dir, database_url))
    second = DatabaseUploadRecords(open_database(base_dir, database_url))  # another process
    with first.locked("s") as txn:
        txn.put(stored("a.txt"))
    assert len(first.all("s")) == 1  # now cached
    with second.locked("s") as txn:
        txn.put(stored("b.txt"))
    assert [s.record.filename for s in first.all("s")] == ["a.txt", "b.txt"]
    first.engine.dispose()
    second.engine.dispose()


def test_conversion_state_and_owner(records: DatabaseUploadRecords) -> None:
    with records.locked("s") as txn:
        txn.put(stored("a.pdf"))
        txn.put(stored("b.pdf"))
    assert records.set_conversion("s", "a.pdf", ConversionState.CONVERTING, owner="h:1")
    assert records.set_conversion("s", "b.pdf", ConversionState.FAILED, "broken")
    assert not records.set_conversion("s", "missing.pdf", ConversionState.QUEUED)
    assert records.conversion_owner("s", "a.pdf") == "h:1"
    assert records.find_conversions(ACTIVE_CONVERSION_STATES) == [("s", "a.pdf", "h:1")]
    failed = records.get("s", "b.pdf").record
    assert (failed.conversion_state, failed.conversion_error) == (ConversionState.FAILED, "broken")


def test_summaries_per_scope(records: DatabaseUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put(stored("a", 2))
        txn.put(stored("b", 3))
    with records.locked("s2") as txn:
        txn.put(stored("c", 4))
    summary = {s.scope: (s.file_count, s.total_size) for s in records.summaries()}
    assert summary == {"s1": (2, 5), "s2": (1, 4)}


def test_reads_from_another_thread_use_their_own_connection(
    records: DatabaseUploadRecords,
) -> None:
    """A transaction's connection belongs to its thread: another thread's read neither
    sees its uncommitted rows nor waits for it."""
    seen = []
    with records.locked("s1") as txn:
        txn.put(stored("a", 1))
        worker = threading.Thread(target=lambda: seen.append(records.all("s1")))
        worker.start()
        worker.join()
    assert seen == [[]]
    assert [s.record.filename for s in records.all("s1")] == ["a"]


def test_reads_inside_a_transaction_see_its_rows(records: DatabaseUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put(stored("a", 1))
        assert [s.record.filename for s in records.all("s1")] == ["a"]
        assert records.get("s1", "a") is not None
    with records.locked("s1") as txn:
        txn.put(stored("b", 2))
    assert [s.record.filename for s in records.all("s1")] == ["a", "b"]


def test_a_rolled_back_transaction_leaves_nothing(records: DatabaseUploadRecords) -> None:
    class Boom(Exception):
        pass

    try:
        with records.locked("s1") as txn:
            txn.put(stored("a", 1))
            raise Boom
    except Boom:
        pass
    assert records.all("s1") == []
    with records.locked("s1") as txn:  # the connection went back to the pool usable
        txn.put(stored("b", 1))
    assert [s.record.filename for s in records.all("s1")] == ["b"]


def test_chat_turns_live_in_the_same_database(base_dir: Path, database_url: str) -> None:
    engine = open_database(base_dir, database_url)
    history = DatabasePreviewHistory(engine, clock=lambda: 5.0, max_turns=2)
    turn = history.append("s", {"text": "hi"})
    assert history.turns("s") == [turn]
    assert (turn.created_at, turn.data) == (5.0, {"text": "hi"})
    later = [history.append("s", {"n": n}) for n in range(3)]
    assert history.turns("s") == later[1:]  # the cap drops the oldest
    assert history.turns("other") == []
    assert history.clear("s") == 2
    engine.dispose()


def test_cached_sets_are_reused_until_any_writer_changes_the_thread(
    base_dir: Path, database_url: str
) -> None:
    """The list cache hands out the same record objects while nothing changed (what the
    listing caches above it key on), and sees every kind of write by another process."""
    first = DatabaseUploadRecords(open_database(base_dir, database_url))
    second = DatabaseUploadRecords(open_database(base_dir, database_url))  # another process
    with first.locked("s") as txn:
        txn.put(stored("a.pdf"))
    held = [first.engine.connect() for _ in range(3)]  # several pooled connections now
    for connection in held:
        connection.close()
    once, twice = first.all("s"), first.all("s")
    assert once == twice and all(a is b for a, b in zip(once, twice, strict=True))
    second.set_conversion("s", "a.pdf", ConversionState.QUEUED, owner="h:1")
    [record] = first.all("s")
    assert record.record.conversion_state is ConversionState.QUEUED
    assert second.move_scope("s", "t") == 1
    assert first.all("s") == [] and len(first.all("t")) == 1
    with second.locked("t") as txn:
        txn.delete("a.pdf")
    assert first.all("t") == []
    first.engine.dispose()
    second.engine.dispose()


def test_resumable_uploads_round_trip(base_dir: Path, database_url: str) -> None:
    engine = open_database(base_dir, database_url)
    store = DatabaseResumableStore(engine)
    upload = ResumableUpload(
        upload_id="u1",
        thread_id="T",
        user_id=None,
        filename="big.bin",
        on_conflict="rename",
        metadata="filename YmlnLmJpbg==",
        length=5 * 2**30,  # past 32 bits: the columns are 64-bit on every engine
        offset=0,
        pending_from=None,
        created_at=10.0,
        expires_at=100.0,
        staging_path=base_dir / ".upload-tus-u1.part",
    )
    store.add(upload)
    assert store.get("u1") == upload and store.get("nope") is None
    store.update("u1", offset=3 * 2**30, pending_from=3 * 2**30)
    assert (store.get("u1").offset, store.get("u1").pending_from) == (3 * 2**30, 3 * 2**30)
    store.update("u1", offset=4 * 2**30, pending_from=None, expires_at=200.0)
    assert store.get("u1").expires_at == 200.0 and store.get("u1").pending_from is None
    assert store.expired(150.0) == [] and [u.upload_id for u in store.expired(200.0)] == ["u1"]
    assert store.has_staging(base_dir / ".upload-tus-u1.part")
    assert not store.has_staging(base_dir / ".upload-tus-other.part")
    store.remove("u1")
    assert store.get("u1") is None and not store.has_staging(upload.staging_path)
    engine.dispose()
