"""Archive members through the tools' file access: read, glob and grep by virtual path."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import FileAccessError
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.file_access import UserDataFiles
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ArchiveLimits
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.paths import ThreadFolders
from tests.support.archives import SYMLINK_MODE
from tests.support.archives import make_encrypted_zip
from tests.support.archives import make_nested
from tests.support.archives import make_overlapping_zip
from tests.support.archives import make_tar
from tests.support.archives import make_zip
from tests.support.archives import make_zip_with_modes
from tests.support.archives import tar_entry

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


UPLOADS = "/mnt/user-data/uploads"


def _stand_in_converter(source: Path, destination: Path, **limits: object) -> None:
    """Converts without markitdown: the document's bytes, upper-cased, are its 'text'."""
    if b"broken" in source.read_bytes():
        from deerflow_web.errors import ConversionError

        raise ConversionError(f"{source.name} is corrupt or not a valid document")
    destination.write_text("# " + source.read_text().upper(), encoding="utf-8")


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


T1 = ThreadRef.single_user("t1")


def _folders(service: UploadService) -> ThreadFolders:
    return service.folders(T1)


def _files(service: UploadService, **limits: int) -> UserDataFiles:
    jobs = ConversionJobs(service, ConversionSettings(), converter=_stand_in_converter)
    thread = _folders(service)
    texts = DocumentTexts(jobs, thread, 5.0, ArchiveLimits(**limits))
    return UserDataFiles(thread, texts, lambda name: True)


def _upload(service: UploadService, name: str, data: bytes) -> None:
    service.save_uploads(T1, [IncomingFile(name, io.BytesIO(data))])


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_members_are_read_by_their_virtual_path(service: UploadService) -> None:
    _upload(service, "reports.zip", make_zip({"q3/notes.txt": b"first\nsecond\n"}))
    text = _files(service).read(f"{UPLOADS}/reports.zip/q3/notes.txt", start_line=2)
    assert text == f"[{UPLOADS}/reports.zip/q3/notes.txt, lines 2-2 of 2]\n     2\tsecond"


def test_a_document_member_is_read_through_the_converter(service: UploadService) -> None:
    _upload(service, "r.tar.gz", make_tar([("summary.docx", b"quarterly")], gzip=True))
    text = _files(service).read(f"{UPLOADS}/r.tar.gz/summary.docx")
    assert text.splitlines() == [
        f"[{UPLOADS}/r.tar.gz/summary.docx as Markdown text, lines 1-1 of 1]",
        "     1\t# QUARTERLY",
    ]


def test_a_failed_member_conversion_is_named_and_not_retried(service: UploadService) -> None:
    _upload(service, "r.zip", make_zip({"bad.pdf": b"broken"}))
    files = _files(service)
    for _ in range(2):
        with pytest.raises(FileAccessError) as failed:
            files.read(f"{UPLOADS}/r.zip/bad.pdf")
        assert str(failed.value) == (
            f"Cannot read {UPLOADS}/r.zip/bad.pdf: bad.pdf is corrupt or not a valid document"
        )


def test_reading_the_archive_or_a_folder_lists_its_members(service: UploadService) -> None:
    data = make_zip({"q3/a.txt": b"a", "q3/b.txt": b"b", "top.txt": b"t", "../x": b"x"})
    _upload(service, "reports.zip", data)
    files = _files(service)
    whole = files.read(f"{UPLOADS}/reports.zip").splitlines()
    assert whole[0].startswith(f"[{UPLOADS}/reports.zip is an archive holding 3 file(s)")
    assert f"{UPLOADS}/reports.zip/q3/a.txt" in whole
    assert whole[-1] == "- member '../x' leaves the archive"
    folder = files.read(f"{UPLOADS}/reports.zip/q3").splitlines()
    assert folder[1:] == [f"{UPLOADS}/reports.zip/q3/a.txt", f"{UPLOADS}/reports.zip/q3/b.txt"]


def test_refused_members_answer_with_their_reason(service: UploadService) -> None:
    _upload(service, "locked.zip", make_encrypted_zip())
    _upload(service, "links.zip", make_zip_with_modes([("link", b"/etc/passwd", SYMLINK_MODE)]))
    files = _files(service)
    with pytest.raises(DeerFlowError, match=r"member 'secret.txt' is encrypted"):
        files.read(f"{UPLOADS}/locked.zip/secret.txt")
    with pytest.raises(DeerFlowError, match=r"member 'link' is a symlink \(symlink member\)"):
        files.read(f"{UPLOADS}/links.zip/link")
    with pytest.raises(DeerFlowError, match="locked.zip has no member 'missing.txt'"):
        files.read(f"{UPLOADS}/locked.zip/missing.txt")


def test_a_refused_archive_answers_with_its_rule(service: UploadService) -> None:
    _upload(service, "overlap.zip", make_overlapping_zip())
    with pytest.raises(DeerFlowError, match="overlap.zip is refused: .*overlapping entries"):
        _files(service).read(f"{UPLOADS}/overlap.zip/a.txt")


def test_nested_archives_are_read_down_to_the_depth_cap(service: UploadService) -> None:
    _upload(service, "deep.zip", make_nested(3))
    files = _files(service, max_depth=3)
    text = files.read(f"{UPLOADS}/deep.zip/l2.zip/l3.zip/leaf.txt")
    assert text.endswith("     1\tdeep text")
    with pytest.raises(DeerFlowError, match="nesting deeper than 2 archives"):
        _files(service, max_depth=2).read(f"{UPLOADS}/deep.zip/l2.zip/l3.zip/leaf.txt")


def test_glob_finds_members_and_names_refusals(service: UploadService) -> None:
    _upload(service, "reports.zip", make_zip({"q3/summary.docx": b"s", "q3/n.txt": b"n"}))
    _upload(service, "overlap.zip", make_overlapping_zip())
    result = _files(service).glob("**/*.docx", UPLOADS)
    assert result["matches"] == [f"{UPLOADS}/reports.zip/q3/summary.docx"]
    assert result["refused"] == [
        {
            "path": f"{UPLOADS}/overlap.zip",
            "reason": "overlap.zip is refused: members 'a.txt' and 'b.txt' overlap "
            "(overlapping entries, a zip bomb)",
        }
    ]
    inside = _files(service).glob("*", f"{UPLOADS}/reports.zip/q3")
    assert inside["matches"] == [
        f"{UPLOADS}/reports.zip/q3/summary.docx",
        f"{UPLOADS}/reports.zip/q3/n.txt",
    ]


def test_grep_searches_text_and_document_members(service: UploadService) -> None:
    data = make_zip(
        {"a/notes.txt": b"no\nneedle here\n", "b.docx": b"a needle", "c.bin": b"\0needle"}
    )
    _upload(service, "r.zip", data)
    result = _files(service).grep("(?i)needle", UPLOADS)
    assert [(m["path"], m["line"]) for m in result["matches"]] == [
        (f"{UPLOADS}/r.zip/a/notes.txt", 2),
        (f"{UPLOADS}/r.zip/b.docx", 1),
    ]
    one = _files(service).grep("needle", f"{UPLOADS}/r.zip/a/notes.txt")
    assert [m["line"] for m in one["matches"]] == [2]
    by_name = _files(service).grep("(?i)needle", UPLOADS, file_glob="*.docx")
    assert [m["path"] for m in by_name["matches"]] == [f"{UPLOADS}/r.zip/b.docx"], by_name
    by_path = _files(service).grep("needle", f"{UPLOADS}/r.zip", file_glob="a/*.txt")
    assert [m["path"] for m in by_path["matches"]] == [f"{UPLOADS}/r.zip/a/notes.txt"]


def test_member_bytes_stay_in_the_thread_folder_outside_user_data(
    service: UploadService, base_dir: Path
) -> None:
    _upload(service, "r.zip", make_zip({"../../../escape.txt": b"x", "ok.docx": b"fine"}))
    before = _tree(base_dir)
    user_data = _tree(base_dir / "threads/t1/user-data")
    files = _files(service)
    files.read(f"{UPLOADS}/r.zip/ok.docx")
    files.grep("x", UPLOADS)
    added = _tree(base_dir) - before
    assert added and all(name.startswith("threads/t1/archive-cache") for name in added)
    assert _tree(base_dir / "threads/t1/user-data") == user_data
    assert not any("escape" in name for name in _tree(base_dir))


def test_member_conversions_are_bounded(service: UploadService) -> None:
    import threading

    from deerflow_web.services.archives import members as archive_members
    from tests.helpers import wait_until

    running = {"now": 0, "most": 0}
    lock = threading.Lock()
    release = threading.Event()

    def slow(source: Path, destination: Path, **limits: object) -> None:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        release.wait(30)  # none finishes before the first grep has answered
        destination.write_text(source.read_text(), encoding="utf-8")
        with lock:
            running["now"] -= 1

    count = archive_members.MAX_PENDING_CONVERSIONS + 4
    _upload(service, "many.zip", make_zip({f"d{i}.docx": b"word" for i in range(count)}))
    jobs = ConversionJobs(service, ConversionSettings(workers=2), converter=slow)
    thread = _folders(service)
    files = UserDataFiles(thread, DocumentTexts(jobs, thread, 0.0))
    first = files.grep("word", UPLOADS)
    assert archive_members._conversions.pending() <= archive_members.MAX_PENDING_CONVERSIONS
    assert len(first["skipped"]) == count  # none ready within a wait of 0 s
    assert all("is still converting to text" in s["reason"] for s in first["skipped"])
    release.set()
    wait_until(lambda: archive_members._conversions.pending() == 0, timeout=30)
    assert running["most"] <= 2
    again = DocumentTexts(jobs, _folders(service), 10.0)
    second = UserDataFiles(_folders(service), again).grep("word", UPLOADS)
    assert len(second["matches"]) == count


def test_a_replaced_archive_serves_its_new_members_and_drops_the_old_cache(
    service: UploadService, base_dir: Path
) -> None:
    _upload(service, "r.zip", make_zip({"a.txt": b"old words"}))
    _upload(service, "keep.zip", make_zip({"k.txt": b"kept"}))
    files = _files(service)
    assert files.read(f"{UPLOADS}/r.zip/a.txt").endswith("old words")
    assert files.read(f"{UPLOADS}/keep.zip/k.txt").endswith("kept")
    cache = base_dir / "threads/t1/archive-cache"
    assert len(list(cache.iterdir())) == 2
    _upload(service, "r.zip", make_zip({"a.txt": b"new words"}))
    assert _files(service).read(f"{UPLOADS}/r.zip/a.txt").endswith("new words")
    assert len(list(cache.iterdir())) == 2  # the old r.zip's folder went, keep.zip's stayed
    assert not any("old words" in p.read_text() for p in cache.rglob("a.txt"))


def test_a_path_through_a_refused_member_names_its_refusal(service: UploadService) -> None:
    from tests.support.archives import ZEROS

    inner = make_zip({"zeros.txt": b"\0" * ZEROS, "x.txt": b"x"})
    _upload(service, "outer.zip", make_zip({"inner.zip": inner}))
    link = tar_entry("docs", tarfile.SYMTYPE, link="/etc")
    _upload(service, "links.tar", make_tar([link, ("ok.txt", b"ok")]))
    files = _files(service)
    with pytest.raises(DeerFlowError, match="member 'zeros.txt': compression ratio over 200"):
        files.read(f"{UPLOADS}/outer.zip/inner.zip/zeros.txt")
    assert files.read(f"{UPLOADS}/outer.zip/inner.zip/x.txt").endswith("\tx")
    with pytest.raises(DeerFlowError, match=r"member 'docs' is a symlink \(symlink member\)"):
        files.read(f"{UPLOADS}/links.tar/docs/passwd")
