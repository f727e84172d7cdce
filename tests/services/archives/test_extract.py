"""Extraction into a folder of the thread: what is written, what is refused, and nothing
anywhere else."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from deerflow_web.errors import ArchiveRefused
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NotAnArchive
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ThreadRef
from deerflow_web.services.archives.extract import ArchiveExtractor
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ArchiveLimits
from tests.support.archives import SYMLINK_MODE
from tests.support.archives import ZEROS
from tests.support.archives import make_encrypted_zip
from tests.support.archives import make_nested_bomb
from tests.support.archives import make_overlapping_zip
from tests.support.archives import make_tar
from tests.support.archives import make_zip
from tests.support.archives import make_zip_with_modes
from tests.support.archives import tar_entry

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


WORKSPACE = "/mnt/user-data/workspace"


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


def _extractor(service: UploadService, **limits: int) -> ArchiveExtractor:
    return ArchiveExtractor(service, ArchiveLimits(**limits))


T1 = ThreadRef.single_user("t1")


def _upload(service: UploadService, name: str, data: bytes) -> None:
    service.save_uploads(T1, [IncomingFile(name, io.BytesIO(data))])


def _tree(root: Path) -> dict[str, int]:
    """Every path below `root` (the database files aside) with its size or -1 for folders."""
    found = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("deerflow.sqlite3"):
            continue
        found[relative] = -1 if path.is_dir() else path.lstat().st_size
    return found


def test_an_archive_is_extracted_into_a_folder_named_after_it(
    service: UploadService, base_dir: Path
) -> None:
    _upload(service, "reports.zip", make_zip({"q3/summary.txt": b"sum", "top.txt": b"top"}))
    extraction = _extractor(service).extract(T1, "reports.zip")
    assert extraction.as_dict() == {
        "archive": "reports.zip",
        "folder": f"{WORKSPACE}/reports",
        "files": [
            {
                "name": "q3/summary.txt",
                "virtual_path": f"{WORKSPACE}/reports/q3/summary.txt",
                "size": 3,
            },
            {"name": "top.txt", "virtual_path": f"{WORKSPACE}/reports/top.txt", "size": 3},
        ],
        "refused": [],
        "message": "Extracted 2 file(s) from reports.zip",
    }
    folder = base_dir / "threads/t1/user-data/workspace/reports"
    assert (folder / "q3/summary.txt").read_bytes() == b"sum"
    assert not list((base_dir / "threads/t1/archive-cache").iterdir())  # no staging left


def test_hostile_members_are_refused_by_name_and_nothing_leaves_the_thread(
    service: UploadService, base_dir: Path
) -> None:
    data = make_tar(
        [
            ("../../../../escape.txt", b"x"),
            ("/tmp/absolute.txt", b"x"),
            tar_entry("passwd", tarfile.SYMTYPE, link="/etc/passwd"),
            tar_entry("hard", tarfile.LNKTYPE, link="/etc/shadow"),
            tar_entry("null", tarfile.CHRTYPE),
            tar_entry("pipe", tarfile.FIFOTYPE),
            ("n" * 300, b"x"),
            ("ok/fine.txt", b"fine"),
        ],
        gzip=True,
    )
    _upload(service, "hostile.tar.gz", data)
    before = _tree(base_dir.parent)
    extraction = _extractor(service).extract(T1, "hostile.tar.gz")
    assert [f.name for f in extraction.files] == ["ok/fine.txt"]
    assert [r.reason for r in extraction.refused] == [
        "member '../../../../escape.txt' leaves the archive",
        "member '/tmp/absolute.txt' has an absolute name",
        "member 'passwd' is a symlink (symlink member)",
        "member 'hard' is a hard link (hard-link member)",
        "member 'null' is a device file",
        "member 'pipe' is a device file",
        f"member {'n' * 120 + '…'!r} has a name longer than 1024 characters (or a part longer "
        "than 255 bytes)",
    ]
    after = _tree(base_dir.parent)
    added = {name for name in after if name not in before}
    assert added == {
        "data/threads/t1/archive-cache",  # where the members were staged, now empty
        "data/threads/t1/user-data/workspace",
        "data/threads/t1/user-data/workspace/hostile",
        "data/threads/t1/user-data/workspace/hostile/ok",
        "data/threads/t1/user-data/workspace/hostile/ok/fine.txt",
    }
    assert (
        not os.path.lexists("/tmp/absolute.txt") or Path("/tmp/absolute.txt").read_bytes() != b"x"
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            make_overlapping_zip(),
            "members 'a.txt' and 'b.txt' overlap (overlapping entries, a zip bomb)",
        ),
        (make_tar([("zeros", b"\0" * ZEROS)], gzip=True), "compression ratio over 200"),
        (make_zip({f"f{i}": b"x" for i in range(11)}), "too many members (limit 10)"),
    ],
)
def test_a_refused_archive_writes_nothing(
    service: UploadService, base_dir: Path, data: bytes, reason: str
) -> None:
    name = "bomb.tar.gz" if data[:2] == b"\x1f\x8b" else "bomb.zip"
    _upload(service, name, data)
    before = _tree(base_dir)
    with pytest.raises(ArchiveRefused) as refused:
        _extractor(service, max_members=10).extract(T1, name)
    assert refused.value.reason == reason
    assert _tree(base_dir) == before


def test_an_archive_over_its_total_while_writing_is_undone(
    service: UploadService, base_dir: Path
) -> None:
    # The sizes are declared honestly; the total cap is met only while writing.
    _upload(service, "two.tar", make_tar([("a.txt", b"a" * 600), ("b.txt", b"b" * 600)]))
    before = _tree(base_dir)
    with pytest.raises(ArchiveRefused, match="uncompressed size over 1000 bytes"):
        _extractor(service, max_uncompressed_size=1000).extract(T1, "two.tar")
    assert _tree(base_dir) == before


def test_members_over_the_ratio_or_the_upload_size_or_encrypted_are_refused(
    base_dir: Path,
) -> None:
    from deerflow_web.models import UploadLimits

    service = make_upload_service(base_dir, UploadLimits(max_file_size=20_000))
    big = b"b" * 30_000  # compresses well below the upload limit the archive itself meets
    data = make_zip({"zeros.bin": b"\0" * ZEROS, "big.txt": big, "ok.txt": b"ok"})
    _upload(service, "mixed.zip", data)
    extraction = _extractor(service).extract(T1, "mixed.zip")
    assert [f.name for f in extraction.files] == ["ok.txt"]
    assert [r.reason for r in extraction.refused] == [
        "member 'zeros.bin': compression ratio over 200",
        "member 'big.txt' is larger than the upload limit of 20000 bytes",
    ]
    _upload(service, "locked.zip", make_encrypted_zip())
    locked = _extractor(service).extract(T1, "locked.zip")
    assert [f.name for f in locked.files] == ["open.txt"]
    assert [r.reason for r in locked.refused] == [
        "member 'secret.txt' is encrypted (encrypted member, not read)"
    ]


def test_a_nested_bomb_is_extracted_one_level_only(service: UploadService, base_dir: Path) -> None:
    _upload(service, "42.zip", make_nested_bomb(levels=3, copies=3))
    extraction = _extractor(service).extract(T1, "42.zip")
    assert [f.name for f in extraction.files] == ["level2-0.zip", "level2-1.zip", "level2-2.zip"]
    folder = base_dir / "threads/t1/user-data/workspace/42"
    assert sum(p.stat().st_size for p in folder.iterdir()) < 1_000_000


def test_the_folder_name_follows_the_conflict_rule(service: UploadService, base_dir: Path) -> None:
    _upload(service, "r.zip", make_zip({"a.txt": b"1"}))
    extractor = _extractor(service)
    assert extractor.extract(T1, "r.zip").folder == f"{WORKSPACE}/r"
    assert extractor.extract(T1, "r.zip").folder == f"{WORKSPACE}/r_1"
    with pytest.raises(NameConflict):
        extractor.extract(T1, "r.zip", on_conflict=OnConflict.REJECT)
    workspace = base_dir / "threads/t1/user-data/workspace"
    (workspace / "r" / "mine.txt").write_text("agent's work")
    assert extractor.extract(T1, "r.zip", on_conflict=OnConflict.REPLACE).folder == f"{WORKSPACE}/r"
    assert sorted(p.name for p in (workspace / "r").iterdir()) == ["a.txt"]
    assert sorted(p.name for p in workspace.iterdir()) == ["r", "r_1"]


def test_a_link_in_the_way_is_never_written_through(
    service: UploadService, base_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    _upload(service, "r.zip", make_zip({"a.txt": b"1"}))
    workspace = base_dir / "threads/t1/user-data/workspace"
    workspace.mkdir(parents=True)
    (workspace / "r").symlink_to(outside)
    extraction = _extractor(service).extract(T1, "r.zip")
    assert extraction.folder == f"{WORKSPACE}/r_1"
    assert list(outside.iterdir()) == []
    with pytest.raises(NameConflict):
        _extractor(service).extract(T1, "r.zip", on_conflict=OnConflict.REPLACE)
    assert list(outside.iterdir()) == []


def test_only_listed_archives_are_extracted(service: UploadService, base_dir: Path) -> None:
    _upload(service, "notes.txt", b"hello")
    with pytest.raises(NotAnArchive):
        _extractor(service).extract(T1, "notes.txt")
    with pytest.raises(UploadNotFound):
        _extractor(service).extract(T1, "missing.zip")


def test_all_members_refused_writes_no_folder(service: UploadService, base_dir: Path) -> None:
    _upload(service, "links.zip", make_zip_with_modes([("l", b"/etc/passwd", SYMLINK_MODE)]))
    extraction = _extractor(service).extract(T1, "links.zip")
    assert extraction.folder is None and extraction.files == []
    assert not (base_dir / "threads/t1/user-data/workspace").exists()
