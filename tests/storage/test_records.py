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

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


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


def test_a_batch_is_read_and_written_by_name(records: DatabaseUploadRecords) -> None:
    with records.locked("s1") as txn:
        txn.put_many([stored("a.txt", 1), stored("b.txt", 2)])
        txn.put_many([])  # nothing to write is no statement at all
        txn.put_many([stored("a.txt", 3)])  # an existing name is replaced whole
        found = txn.get_many(["b.txt", "missing.txt", "a.txt", "a.txt"])
        assert txn.get_many([]) == {}
    with records.locked("s2") as txn:
        txn.put(stored("a.txt", 9))  # another thread's record of the same name
    assert found == {
        "a.txt": records.get("s1", "a.txt"),
        "b.txt": records.get("s1", "b.txt"),
        "missing.txt": None,
    }
    assert [(s.record.filename, s.record.size) for s in records.all("s1")] == [
        ("a.txt", 3),
        ("b.txt", 2),
    ]


def test_a_rolled_back_batch_leaves_nothing(records: DatabaseUploadRecords) -> None:
    with pytest.raises(RuntimeError), records.locked("s1") as txn:
        txn.put_many([stored("a.txt"), stored("b.txt")])
        raise RuntimeError("stop")
    assert records.all("s1") == []


def test_duplicates_are_found_by_content_in_any_number_of_copies(
    records: DatabaseUploadRecords,
) -> None:
    def with_hash(name: str, sha256: str) -> StoredRecord:
        plain = stored(name)
        return StoredRecord(
            UploadRecord(name, 1, sha256, "text/plain", 10.0, 10.0), plain.mtime_ns, plain.inode
        )

    same, other, absent = "a" * 64, "b" * 64, "c" * 64
    with records.locked("s1") as txn:
        txn.put_many([with_hash(f"copy-{n:03d}.txt", same) for n in range(150)])
        txn.put(with_hash("other.txt", other))
    with records.locked("s2") as txn:
        txn.put(with_hash("zzz-elsewhere.txt", same))  # another thread's copy never counts
        assert txn.names_by_sha256([absent]) == {}
    with records.locked("s1") as txn:
        # The last of the copies in name order, as reading every record used to give.
        expected = {s.record.sha256: s.record.filename for s in txn.all()}
        assert txn.names_by_sha256([same, other, absent, same]) == expected
        assert expected == {same: "copy-149.txt", other: "other.txt"}
        assert txn.names_by_sha256([]) == {}


def test_companion_candidates_are_the_converted_and_the_namesake(
    records: DatabaseUploadRecords,
) -> None:
    with records.locked("s1") as txn:
        txn.put_many(
            [
                stored("report.docx"),
                stored("report.md", converted_from="report.docx"),
                stored("renamed.md", converted_from="report.docx"),
                stored("other.md", converted_from="other.docx"),
                stored("unrelated.txt"),
            ]
        )
    with records.locked("s2") as txn:
        txn.put(stored("theirs.md", converted_from="report.docx"))
    with records.locked("s1") as txn:
        names = [s.record.filename for s in txn.companion_candidates("report.docx", "report.md")]
        assert names == ["renamed.md", "report.md"]
        names = [s.record.filename for s in txn.companion_candidates("other.docx", "x.md")]
        assert names == ["other.md"]
        assert txn.companion_candidates("nothing.pdf", "nothing.md") == []
