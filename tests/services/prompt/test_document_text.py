"""The Markdown an agent reads for an uploaded document (services/prompt/document_text.py).

Real upload records and real conversion jobs; only the isolated converter is a stand-in
that writes Markdown (or fails) at once, and counts how often it was asked.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from deerflow_web.errors import ConversionError
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import ConversionState
from deerflow_web.models import IncomingFile
from deerflow_web.models import RecordSource
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadRecord
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.prompt.document_text import DocumentNotReadable
from deerflow_web.services.prompt.document_text import DocumentStillConverting
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.document_text import current_companion
from deerflow_web.services.prompt.document_text import is_document_name
from deerflow_web.services.prompt.document_text import misnamed_document
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings

# Nothing here reads the mode: the service is built by hand over single-user threads.
# The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

PDF = b"%PDF-1.4\n% a small document\n"
REF = ThreadRef.single_user("T")  # the flat layout: no accounts at the service level


class Converter:
    """Writes `# text of NAME` for each source, or raises `error`; counts its calls."""

    def __init__(self, error: Exception | None = None, hold: threading.Event | None = None):
        self.calls: list[str] = []
        self.error = error
        self.hold = hold

    def __call__(self, source: Path, destination: Path, **_: object) -> None:
        self.calls.append(source.name)
        if self.hold is not None:
            self.hold.wait(10)
        if self.error is not None:
            raise self.error
        destination.write_text(f"# text of {source.name}\n", encoding="utf-8")


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


def texts(service: UploadService, converter: Converter, wait: float = 60.0) -> DocumentTexts:
    """Waits that a fake converter never needs, on any machine (a test of "still converting"
    passes its own short wait)."""
    jobs = ConversionJobs(service, ConversionSettings(wait_seconds=60), converter=converter)
    return DocumentTexts(jobs, service.folders(REF), wait_seconds=wait)


def save(service: UploadService, name: str, data: bytes) -> None:
    service.save_uploads(REF, [IncomingFile(name, io.BytesIO(data))])


def record(name: str, sha: str = "s1", **fields: object) -> UploadRecord:
    return UploadRecord(name, 1, sha, "application/pdf", 0.0, 0.0, **fields)


# ---- names and types ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    (("a.pdf", True), ("A.PDF", True), ("r.docx", True), ("n.md", False), ("x", False)),
)
def test_documents_are_known_by_their_extension(name: str, expected: bool) -> None:
    assert is_document_name(name) is expected


def test_a_document_under_another_name_is_found_by_its_bytes() -> None:
    assert misnamed_document("notes.txt", PDF) == ".pdf"
    assert misnamed_document("sheet.bin", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))


def test_a_document_with_its_own_name_and_plain_text_are_not_misnamed() -> None:
    assert misnamed_document("paper.pdf", PDF) is None
    assert misnamed_document("notes.txt", b"just text\n") is None
    assert misnamed_document("empty.txt", b"") is None


# ---- which companion describes the document ---------------------------------------------


def test_the_companion_made_from_the_current_bytes_counts() -> None:
    document = record("a.pdf", "new")
    old = record("a.md", converted_from="a.pdf", source_sha256="old")
    current = record("a (1).md", converted_from="a.pdf", source_sha256="new")
    assert current_companion(document, [document, old, current]) == current
    assert current_companion(document, [document, old]) is None


def test_a_companion_from_before_hashes_were_recorded_counts_once_converted() -> None:
    companion = record("a.md", converted_from="a.pdf")
    done = record("a.pdf", conversion_state=ConversionState.DONE)
    assert current_companion(done, [done, companion]) == companion
    pending = record("a.pdf", conversion_state=ConversionState.QUEUED)
    assert current_companion(pending, [pending, companion]) is None


def test_deerflows_md_found_on_disk_counts_by_its_name() -> None:
    document = record("report.pdf")
    on_disk = record("report.md", source=RecordSource.DISK)
    uploaded = record("report.md", source=RecordSource.UPLOAD)
    other_companion = record("report.md", source=RecordSource.DISK, converted_from="x.pdf")
    assert current_companion(document, [document, on_disk]) == on_disk
    assert current_companion(document, [document, uploaded]) is None  # the user's own file
    assert current_companion(document, [document, other_companion]) is None


def test_no_records_no_companion() -> None:
    assert current_companion(record("a.pdf"), ()) is None


# ---- reading through the conversion jobs -----------------------------------------------


def test_a_document_is_converted_once_and_its_markdown_read(service: UploadService) -> None:
    save(service, "paper.pdf", PDF)
    converter = Converter()
    reader = texts(service, converter)
    path = reader.markdown_path("paper.pdf")
    assert path.read_text(encoding="utf-8") == "# text of paper.pdf\n"
    assert path.parent == reader.uploads_dir
    assert reader.markdown_path("paper.pdf") == path
    assert len(converter.calls) == 1
    assert reader.companions() == {path.name: "paper.pdf"}


def test_new_bytes_under_the_same_name_are_converted_again(service: UploadService) -> None:
    save(service, "paper.pdf", PDF)
    converter = Converter()
    reader = texts(service, converter)
    first = reader.markdown_path("paper.pdf")
    (reader.uploads_dir / "paper.pdf").write_bytes(PDF + b"% edited in place\n")
    second = reader.markdown_path("paper.pdf")
    assert len(converter.calls) == 2 and second.is_file()
    assert first.parent == second.parent


def test_an_unknown_upload_is_not_found(service: UploadService) -> None:
    with pytest.raises(UploadNotFound):
        texts(service, Converter()).markdown_path("nothing.pdf")


def test_a_failed_conversion_is_not_readable_and_not_tried_again(service: UploadService) -> None:
    save(service, "broken.pdf", PDF)
    converter = Converter(error=ConversionError("broken.pdf is corrupt"))
    reader = texts(service, converter)
    with pytest.raises(DocumentNotReadable, match="corrupt"):
        reader.markdown_path("broken.pdf")
    with pytest.raises(DocumentNotReadable, match="corrupt"):
        reader.markdown_path("broken.pdf")
    assert len(converter.calls) == 1  # the same bytes would fail the same way
    assert reader.companions() == {}


def test_a_conversion_longer_than_the_budget_says_so(service: UploadService) -> None:
    save(service, "slow.pdf", PDF)
    hold = threading.Event()
    reader = texts(service, Converter(hold=hold), wait=0.05)
    try:
        with pytest.raises(DocumentStillConverting, match="still converting"):
            reader.markdown_path("slow.pdf")
        reader.request("slow.pdf")  # never raises, never waits
    finally:
        hold.set()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert reader.markdown_path("slow.pdf", wait=1.0).is_file()
            break
        except DocumentStillConverting:
            assert time.monotonic() < deadline


def test_request_starts_a_conversion_without_waiting(service: UploadService) -> None:
    save(service, "later.pdf", PDF)
    converter = Converter()
    reader = texts(service, converter)
    reader.request("later.pdf")
    assert reader.markdown_path("later.pdf").is_file()
    assert converter.calls == ["later.pdf"]


def test_request_of_an_unknown_upload_raises_not_found(service: UploadService) -> None:
    with pytest.raises(UploadNotFound):
        texts(service, Converter()).request("missing.pdf")


def test_a_companion_that_is_a_link_is_never_read(service: UploadService, tmp_path: Path) -> None:
    save(service, "paper.pdf", PDF)
    reader = texts(service, Converter())
    path = reader.markdown_path("paper.pdf")
    outside = tmp_path / "secret.md"
    outside.write_text("not the thread's", encoding="utf-8")
    path.unlink()
    path.symlink_to(outside)
    try:
        found = reader.markdown_path("paper.pdf")
    except DocumentNotReadable:
        return  # refused: fine
    assert not found.is_symlink()  # or converted again into a file of its own
    assert found.read_text(encoding="utf-8") == "# text of paper.pdf\n"


def test_the_shared_budget_runs_down_to_zero() -> None:
    assert DocumentTexts.deadline_wait(None, time.monotonic() + 60) > 59  # type: ignore[arg-type]
    assert DocumentTexts.deadline_wait(None, time.monotonic() - 5) == 0.0  # type: ignore[arg-type]
