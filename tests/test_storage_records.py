"""The SQLite record store and its per-thread connections, without the upload service."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from deerflow_web.models import ACTIVE_CONVERSION_STATES
from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.storage.chat_turns import SQLitePreviewHistory
from deerflow_web.storage.records import SQLiteUploadRecords
from deerflow_web.storage.records import StoredRecord


def stored(name: str, size: int = 1, **fields: object) -> StoredRecord:
    record = UploadRecord(name, size, "0" * 64, "text/plain", 10.0, 10.0, **fields)
    return StoredRecord(record, mtime_ns=10_000_000_000, inode=7)


@pytest.fixture
def records(tmp_path: Path):
    store = SQLiteUploadRecords(tmp_path / "uploads.sqlite3")
    yield store
    store.close()


def test_put_get_and_all_round_trip(records: SQLiteUploadRecords) -> None:
    companion = stored("b.md", 3, source=RecordSource.DISK, converted_from="b.docx")
    with records.locked("s1") as txn:
        txn.put(stored("b.docx", 2, original_filename="B.docx"))
        txn.put(companion)
        txn.put(stored("a.txt"))
    assert [s.record.filename for s in records.all("s1")] == ["a.txt", "b.docx", "b.md"]
    assert records.get("s1", "b.md") == companion
    assert records.get("s1", "b.docx").record.original_filename == "B.docx"
    assert records.all("s2") == []


def test_a_failed_transaction_writes_nothing(records: SQLiteUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put(stored("keep.txt"))
    with pytest.raises(RuntimeError), records.locked("s1") as txn:
        txn.put(stored("new.txt"))
        txn.delete("keep.txt")
        raise RuntimeError("stop")
    assert [s.record.filename for s in records.all("s1")] == ["keep.txt"]


def test_cached_listing_sees_writes_of_another_connection(tmp_path: Path) -> None:
    first = SQLiteUploadRecords(tmp_path / "r.sqlite3")
    second = SQLiteUploadRecords(tmp_path / "r.sqlite3")  # as another process would
    with first.locked("s") as txn:
        txn.put(stored("a.txt"))
    assert len(first.all("s")) == 1  # now cached
    with second.locked("s") as txn:
        txn.put(stored("b.txt"))
    assert [s.record.filename for s in first.all("s")] == ["a.txt", "b.txt"]
    first.close()
    second.close()


def test_conversion_state_and_owner(records: SQLiteUploadRecords) -> None:
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


def test_summaries_per_scope(records: SQLiteUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put(stored("a", 2))
        txn.put(stored("b", 3))
    with records.locked("s2") as txn:
        txn.put(stored("c", 4))
    summary = {s.scope: (s.file_count, s.total_size) for s in records.summaries()}
    assert summary == {"s1": (2, 5), "s2": (1, 4)}


def test_connections_are_lent_and_reused(records: SQLiteUploadRecords) -> None:
    """A pooled connection per borrower at a time, the same one again once it is back:
    under gevent a connection per greenlet would be opened and dropped per request."""
    pool = records._pool
    with pool.borrow() as first, pool.borrow() as second:
        assert first is not second
    with pool.borrow() as again:
        assert again in (first, second)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(records.all("s1")))
    worker.start()
    worker.join()
    assert seen == [[]]


def test_reads_inside_a_transaction_see_its_rows(records: SQLiteUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put(stored("a", 1))
        assert [s.record.filename for s in records.all("s1")] == ["a"]
        assert records.get("s1", "a") is not None
    with records.locked("s1") as txn:
        txn.put(stored("b", 2))
    assert [s.record.filename for s in records.all("s1")] == ["a", "b"]


def test_a_rolled_back_transaction_leaves_nothing(records: SQLiteUploadRecords) -> None:
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


def test_chat_turns_share_the_connection_helper_and_stay_lazy(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "turns.sqlite3"
    history = SQLitePreviewHistory(path, clock=lambda: 5.0)
    assert not path.exists()
    turn = history.append("s", {"text": "hi"})
    assert path.exists()
    assert history.turns("s") == [turn]
    assert (turn.created_at, turn.data) == (5.0, {"text": "hi"})
    assert history.clear("s") == 1
    history.close()
