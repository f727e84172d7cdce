"""Where every upload lands (services/uploads/intake.py): saved, then converted if asked.

Real upload service and conversion jobs; the isolated converter is a stand-in that writes
Markdown at once and records what it converted.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from deerflow_web.errors import NameConflict
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.local import StagingFile
from tests.helpers import uploads_dir

PDF = b"%PDF-1.4\n% a document\n"
REF = ThreadRef.single_user("T")  # the flat layout: no accounts at the service level


class Converter:
    def __init__(self) -> None:
        self.converted: list[str] = []

    def __call__(self, source: Path, destination: Path, **_: object) -> None:
        self.converted.append(source.name)
        destination.write_text(f"# {source.name}\n", encoding="utf-8")


@pytest.fixture
def uploads(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


def intake_for(uploads: UploadService, converter: Converter, *, auto: bool) -> UploadIntake:
    settings = ConversionSettings(auto_convert_documents=auto, wait_seconds=10)
    return UploadIntake(uploads, ConversionJobs(uploads, settings, converter=converter))


def files(*pairs: tuple[str, bytes]) -> list[IncomingFile]:
    return [IncomingFile(name, io.BytesIO(data)) for name, data in pairs]


def staged(folder: Path, data: bytes, name: str) -> tuple[StagingFile, str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    staging = StagingFile(folder)
    staging.write(data)
    sha256, content_type = staging.finish(name)
    return staging, sha256, content_type


def test_without_auto_conversion_files_are_only_saved(
    uploads: UploadService, base_dir: Path
) -> None:
    converter = Converter()
    accepted = intake_for(uploads, converter, auto=False).accept(
        REF, files(("a.pdf", PDF), ("b.txt", b"b")), on_conflict=OnConflict.REPLACE
    )
    assert [saved.record.filename for saved in accepted.result.files] == ["a.pdf", "b.txt"]
    assert accepted.companions == {} and converter.converted == []
    assert sorted(p.name for p in uploads_dir(base_dir, "T", None).iterdir()) == ["a.pdf", "b.txt"]


def test_with_auto_conversion_documents_get_their_companions(
    uploads: UploadService, base_dir: Path
) -> None:
    converter = Converter()
    accepted = intake_for(uploads, converter, auto=True).accept(
        REF, files(("a.pdf", PDF), ("b.txt", b"plain")), on_conflict=OnConflict.REPLACE
    )
    assert converter.converted == ["a.pdf"]  # text is not converted
    companion = accepted.companions["a.pdf"]
    assert companion.converted_from == "a.pdf" and set(accepted.companions) == {"a.pdf"}
    folder = uploads_dir(base_dir, "T", None)
    assert (folder / companion.filename).read_text(encoding="utf-8") == "# a.pdf\n"


def test_a_refused_batch_saves_and_converts_nothing(uploads: UploadService) -> None:
    converter = Converter()
    intake = intake_for(uploads, converter, auto=True)
    intake.accept(REF, files(("a.pdf", PDF)), on_conflict=OnConflict.REPLACE)
    converter.converted.clear()
    with pytest.raises(NameConflict):
        intake.accept(REF, files(("new.pdf", PDF), ("a.pdf", PDF)), on_conflict=OnConflict.REJECT)
    assert converter.converted == []
    assert "new.pdf" not in {r.filename for r in uploads.list_uploads(REF)}


def test_a_staged_file_is_committed_like_a_part_and_converted(
    uploads: UploadService, base_dir: Path
) -> None:
    converter = Converter()
    folder = uploads_dir(base_dir, "T", None)
    staging, sha256, content_type = staged(folder, PDF, "resumed.pdf")
    seen: list[list[str]] = []

    def then(_txn, saved) -> None:  # noqa: ANN001 - the commit's transaction and files
        seen.append([item.record.filename for item in saved])

    try:
        accepted = intake_for(uploads, converter, auto=True).accept_staged(
            REF,
            "resumed.pdf",
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=OnConflict.REPLACE,
            then=then,
        )
    finally:
        staging.close()
    record = accepted.result.files[0].record
    assert (record.filename, record.sha256, record.content_type) == (
        "resumed.pdf",
        sha256,
        "application/pdf",
    )
    assert seen == [["resumed.pdf"]]
    assert (folder / "resumed.pdf").read_bytes() == PDF
    assert accepted.companions["resumed.pdf"].converted_from == "resumed.pdf"


def test_a_staged_file_refused_by_reject_stays_for_the_caller(
    uploads: UploadService, base_dir: Path
) -> None:
    intake = intake_for(uploads, Converter(), auto=False)
    intake.accept(REF, files(("taken.txt", b"old")), on_conflict=OnConflict.REPLACE)
    folder = uploads_dir(base_dir, "T", None)
    staging, sha256, content_type = staged(folder, b"new", "taken.txt")
    try:
        with pytest.raises(NameConflict):
            intake.accept_staged(
                REF,
                "taken.txt",
                staging,
                sha256=sha256,
                content_type=content_type,
                on_conflict=OnConflict.REJECT,
            )
        assert staging.path.exists()  # the caller discards it
        assert (folder / "taken.txt").read_bytes() == b"old"
    finally:
        staging.discard()
        staging.close()
    assert not staging.path.exists()


def test_rename_gives_a_staged_file_a_free_name(uploads: UploadService, base_dir: Path) -> None:
    intake = intake_for(uploads, Converter(), auto=False)
    intake.accept(REF, files(("a.txt", b"old")), on_conflict=OnConflict.REPLACE)
    staging, sha256, content_type = staged(uploads_dir(base_dir, "T", None), b"new", "a.txt")
    try:
        accepted = intake.accept_staged(
            REF,
            "a.txt",
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=OnConflict.RENAME,
        )
    finally:
        staging.close()
    renamed = accepted.result.files[0].record.filename
    assert renamed != "a.txt"
    assert sorted(r.filename for r in uploads.list_uploads(REF)) == sorted(["a.txt", renamed])
