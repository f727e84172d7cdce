"""`UploadService` on its own, without Flask: limits, the all-or-nothing commit, rename and
the delete cascade, checked on the folder and the records alike."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NoFilesProvided
from deerflow_web.errors import TooManyFiles
from deerflow_web.errors import TotalTooLarge
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadLimits
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.records import DatabaseUploadRecords
from tests.helpers import uploads_dir

LIMITS = UploadLimits(max_files=2, max_file_size=10, max_total_size=15)


def make_service(base_dir: Path, clock: Callable[[], float] = lambda: 1000.0) -> UploadService:
    paths = ThreadPaths(base_dir)
    records = DatabaseUploadRecords(open_database(paths.base_dir))
    return UploadService(paths, records, LIMITS, clock=clock)


def files(*pairs: tuple[str, bytes]) -> list[IncomingFile]:
    return [IncomingFile(name, io.BytesIO(data)) for name, data in pairs]


def folder_state(base_dir: Path) -> dict[str, bytes]:
    """Every entry of the uploads folder (staging files included) with its bytes."""
    folder = uploads_dir(base_dir, "T", None)
    if not folder.exists():
        return {}
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def stored(service: UploadService) -> dict[str, int]:
    return {
        s.record.filename: s.record.size
        for s in service.records.all(service.paths.scope(ThreadRef.single_user("T")))
    }


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_service(base_dir)


def test_saves_files_and_records(service: UploadService, base_dir: Path) -> None:
    result = service.save_uploads(
        ThreadRef.single_user("T"), files(("a.txt", b"hello"), ("b.txt", b"world!"))
    )
    assert [saved.record.filename for saved in result.files] == ["a.txt", "b.txt"]
    assert folder_state(base_dir) == {"a.txt": b"hello", "b.txt": b"world!"}
    assert stored(service) == {"a.txt": 5, "b.txt": 6}
    assert service.get_upload(ThreadRef.single_user("T"), "a.txt").uploaded_at == 1000.0


@pytest.mark.parametrize(
    ("parts", "error"),
    [
        ([("a", b"1"), ("b", b"2"), ("c", b"3")], TooManyFiles),
        ([("big.bin", b"x" * 11)], FileTooLarge),
        ([("a.bin", b"x" * 10), ("b.bin", b"x" * 6)], TotalTooLarge),
        ([], NoFilesProvided),
    ],
    ids=["count", "file-size", "total-size", "none"],
)
def test_a_limit_writes_nothing(
    service: UploadService, base_dir: Path, parts: list[tuple[str, bytes]], error: type
) -> None:
    service.save_uploads(ThreadRef.single_user("T"), files(("keep.txt", b"kept")))
    with pytest.raises(error):
        service.save_uploads(ThreadRef.single_user("T"), files(*parts))
    assert folder_state(base_dir) == {"keep.txt": b"kept"}
    assert stored(service) == {"keep.txt": 4}


def test_a_size_equal_to_the_limit_is_accepted(service: UploadService, base_dir: Path) -> None:
    service.save_uploads(
        ThreadRef.single_user("T"), files(("a.bin", b"x" * 10), ("b.bin", b"x" * 5))
    )
    assert stored(service) == {"a.bin": 10, "b.bin": 5}


def test_a_failed_commit_puts_the_replaced_file_back(base_dir: Path) -> None:
    service = make_service(base_dir)
    service.save_uploads(ThreadRef.single_user("T"), files(("a.txt", b"old")))
    calls = itertools.count()

    def clock_failing_on_second_file() -> float:
        if next(calls) == 1:
            raise OSError("disk went away")
        return 2000.0

    service = make_service(base_dir, clock_failing_on_second_file)
    with pytest.raises(Exception, match="disk went away"):
        service.save_uploads(
            ThreadRef.single_user("T"), files(("a.txt", b"new"), ("b.txt", b"other"))
        )
    assert folder_state(base_dir) == {"a.txt": b"old"}
    assert stored(service) == {"a.txt": 3}
    assert service.get_upload(ThreadRef.single_user("T"), "a.txt").uploaded_at == 1000.0


def test_reject_keeps_the_existing_file(service: UploadService, base_dir: Path) -> None:
    service.save_uploads(ThreadRef.single_user("T"), files(("a.txt", b"old")))
    with pytest.raises(NameConflict):
        service.save_uploads(
            ThreadRef.single_user("T"), files(("a.txt", b"new")), on_conflict=OnConflict.REJECT
        )
    assert folder_state(base_dir) == {"a.txt": b"old"}


def test_rename_on_conflict_numbers_the_new_file(service: UploadService, base_dir: Path) -> None:
    service.save_uploads(ThreadRef.single_user("T"), files(("a.txt", b"old")))
    result = service.save_uploads(
        ThreadRef.single_user("T"), files(("a.txt", b"new")), on_conflict=OnConflict.RENAME
    )
    assert result.files[0].record.filename == "a_1.txt"
    assert result.files[0].record.original_filename == "a.txt"
    assert folder_state(base_dir) == {"a.txt": b"old", "a_1.txt": b"new"}


def test_rename_moves_bytes_and_record(service: UploadService, base_dir: Path) -> None:
    service.save_uploads(ThreadRef.single_user("T"), files(("a.txt", b"data"), ("b.txt", b"other")))
    record = service.rename_upload(ThreadRef.single_user("T"), "a.txt", "c.txt")
    assert record.filename == "c.txt"
    assert folder_state(base_dir) == {"c.txt": b"data", "b.txt": b"other"}
    assert stored(service) == {"b.txt": 5, "c.txt": 4}
    with pytest.raises(NameConflict):
        service.rename_upload(ThreadRef.single_user("T"), "c.txt", "b.txt")
    assert folder_state(base_dir) == {"c.txt": b"data", "b.txt": b"other"}


def test_delete_cascades_to_the_companion_only(service: UploadService, base_dir: Path) -> None:
    service.save_uploads(
        ThreadRef.single_user("T"), files(("r.docx", b"PK\x03\x04doc"), ("notes.md", b"mine"))
    )
    folder = uploads_dir(base_dir, "T", None)
    (folder / "r.md").write_text("# converted\n")  # DeerFlow's companion name, found on disk
    service.list_uploads(ThreadRef.single_user("T"))
    assert service.delete_upload(ThreadRef.single_user("T"), "r.docx") == ["r.docx", "r.md"]
    assert folder_state(base_dir) == {"notes.md": b"mine"}
    assert stored(service) == {"notes.md": 4}
    with pytest.raises(UploadNotFound):
        service.delete_upload(ThreadRef.single_user("T"), "r.docx")
