"""The archive reader: every hostile archive refused, each with its named rule."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from deerflow_web.errors import ArchiveMemberRefused
from deerflow_web.errors import ArchiveRefused
from deerflow_web.errors import NotAnArchive
from deerflow_web.services.archives.reader import iter_member_streams
from deerflow_web.services.archives.reader import list_archive
from deerflow_web.services.archives.reader import safe_member_name
from deerflow_web.settings import ArchiveLimits
from tests.support.archives import CHAR_DEVICE_MODE
from tests.support.archives import FIFO_MODE
from tests.support.archives import FILE_MODE
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


LIMITS = ArchiveLimits()


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _reasons(path: Path, limits: ArchiveLimits = LIMITS) -> dict[str, str]:
    return {r.name: r.reason for r in list_archive(path, limits).refused}


@pytest.mark.parametrize("name", ["a.zip", "a.tar", "a.tar.gz", "a.tgz"])
def test_every_format_lists_its_files_and_folders(tmp_path: Path, name: str) -> None:
    members = {"q3/summary.txt": b"summary", "q3/data/table.csv": b"a,b", "top.txt": b"t"}
    if name.endswith(".zip"):
        data = make_zip(members)
    else:
        data = make_tar(members.items(), gzip=name.endswith(("gz", "tgz")))
    listing = list_archive(_write(tmp_path, name, data), LIMITS)
    assert sorted(m.name for m in listing.files) == sorted(members)
    assert listing.is_folder("q3") and listing.is_folder("q3/data")
    assert not listing.is_folder("q3/summary.txt")
    assert listing.refused == ()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("../evil.txt", "member '../evil.txt' leaves the archive"),
        ("a/../../evil.txt", "member 'a/../../evil.txt' leaves the archive"),
        ("..\\..\\evil.txt", "member '..\\\\..\\\\evil.txt' leaves the archive"),
        ("/etc/passwd", "member '/etc/passwd' has an absolute name"),
        ("\\windows\\evil", "member '\\\\windows\\\\evil' has an absolute name"),
        ("C:/evil.txt", "member 'C:/evil.txt' has an absolute name"),
        ("line\nbreak.txt", "member 'line\\nbreak.txt' has control characters in its name"),
        (".upload-x.part", "member '.upload-x.part' has a reserved name"),
    ],
)
def test_names_that_leave_the_archive_are_refused_by_name(raw: str, reason: str) -> None:
    with pytest.raises(ArchiveMemberRefused) as refused:
        safe_member_name(raw, LIMITS)
    assert refused.value.reason == reason


def test_names_are_normalised_inside_the_archive() -> None:
    assert safe_member_name("./a//b/./c.txt", LIMITS) == "a/b/c.txt"
    assert safe_member_name("dir\\file.txt", LIMITS) == "dir/file.txt"
    assert safe_member_name("./", LIMITS) == ""
    assert safe_member_name("报告/总结.txt", LIMITS) == "报告/总结.txt"


def test_zip_slip_members_are_refused_and_the_rest_listed(tmp_path: Path) -> None:
    data = make_zip({"../../evil.txt": b"x", "/abs.txt": b"x", "ok.txt": b"fine"})
    path = _write(tmp_path, "slip.zip", data)
    assert [m.name for m in list_archive(path, LIMITS).files] == ["ok.txt"]
    assert _reasons(path) == {
        "../../evil.txt": "member '../../evil.txt' leaves the archive",
        "/abs.txt": "member '/abs.txt' has an absolute name",
    }


def test_tar_slip_links_and_devices_are_refused(tmp_path: Path) -> None:
    data = make_tar(
        [
            ("../evil.txt", b"x"),
            ("/etc/cron.d/evil", b"x"),
            tar_entry("link", tarfile.SYMTYPE, link="/etc/passwd"),
            tar_entry("hard", tarfile.LNKTYPE, link="ok.txt"),
            tar_entry("null", tarfile.CHRTYPE),
            tar_entry("disk", tarfile.BLKTYPE),
            tar_entry("pipe", tarfile.FIFOTYPE),
            ("ok.txt", b"fine"),
        ]
    )
    path = _write(tmp_path, "hostile.tar", data)
    assert [m.name for m in list_archive(path, LIMITS).files] == ["ok.txt"]
    assert _reasons(path) == {
        "../evil.txt": "member '../evil.txt' leaves the archive",
        "/etc/cron.d/evil": "member '/etc/cron.d/evil' has an absolute name",
        "link": "member 'link' is a symlink (symlink member)",
        "hard": "member 'hard' is a hard link (hard-link member)",
        "null": "member 'null' is a device file",
        "disk": "member 'disk' is a device file",
        "pipe": "member 'pipe' is a device file",
    }


def test_zip_symlink_and_device_members_are_refused(tmp_path: Path) -> None:
    data = make_zip_with_modes(
        [
            ("link", b"/etc/passwd", SYMLINK_MODE),
            ("tty", b"", CHAR_DEVICE_MODE),
            ("pipe", b"", FIFO_MODE),
            ("ok.txt", b"fine", FILE_MODE),
        ]
    )
    path = _write(tmp_path, "modes.zip", data)
    assert [m.name for m in list_archive(path, LIMITS).files] == ["ok.txt"]
    assert _reasons(path) == {
        "link": "member 'link' is a symlink (symlink member)",
        "tty": "member 'tty' is a device file",
        "pipe": "member 'pipe' is a device file",
    }


def test_an_encrypted_member_is_reported_not_guessed(tmp_path: Path) -> None:
    path = _write(tmp_path, "locked.zip", make_encrypted_zip())
    listing = list_archive(path, LIMITS)
    assert [m.name for m in listing.files] == ["open.txt"]
    assert _reasons(path) == {
        "secret.txt": "member 'secret.txt' is encrypted (encrypted member, not read)"
    }


def test_overlapping_entries_refuse_the_whole_zip(tmp_path: Path) -> None:
    path = _write(tmp_path, "overlap.zip", make_overlapping_zip())
    with pytest.raises(ArchiveRefused) as refused:
        list_archive(path, LIMITS)
    assert refused.value.reason == (
        "members 'a.txt' and 'b.txt' overlap (overlapping entries, a zip bomb)"
    )
    assert str(refused.value).startswith("overlap.zip is refused: ")


def test_a_high_ratio_member_is_refused_and_the_others_kept(tmp_path: Path) -> None:
    path = _write(tmp_path, "ratio.zip", make_zip({"zeros.bin": b"\0" * ZEROS, "ok.txt": b"x"}))
    assert [m.name for m in list_archive(path, LIMITS).files] == ["ok.txt"]
    assert _reasons(path) == {"zeros.bin": "member 'zeros.bin': compression ratio over 200"}


def test_a_small_repetitive_member_is_not_judged_by_its_ratio(tmp_path: Path) -> None:
    path = _write(tmp_path, "small.zip", make_zip({"zeros.bin": b"\0" * 100_000}))
    assert [m.name for m in list_archive(path, LIMITS).files] == ["zeros.bin"]


def test_a_tar_gz_bomb_is_refused_by_its_ratio_while_it_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "bomb.tar.gz", make_tar([("zeros", b"\0" * ZEROS)], gzip=True))
    with pytest.raises(ArchiveRefused) as refused:
        list_archive(path, LIMITS)
    assert refused.value.reason == "compression ratio over 200"


def test_the_nested_bomb_refuses_its_zeros_at_every_level(tmp_path: Path) -> None:
    bomb = make_nested_bomb(levels=2, copies=3)
    path = _write(tmp_path, "42.zip", bomb)
    listing = list_archive(path, LIMITS)
    assert [m.name for m in listing.files] == ["level1-0.zip", "level1-1.zip", "level1-2.zip"]
    assert len(bomb) < 200_000


def test_too_many_members_refuses_the_archive(tmp_path: Path) -> None:
    limits = ArchiveLimits(max_members=5)
    for name, data in (
        ("many.zip", make_zip({f"f{i}.txt": b"x" for i in range(6)})),
        ("many.tar", make_tar([(f"f{i}.txt", b"x") for i in range(6)])),
    ):
        with pytest.raises(ArchiveRefused) as refused:
            list_archive(_write(tmp_path, name, data), limits)
        assert refused.value.reason == "too many members (limit 5)"


def test_declared_uncompressed_size_over_the_cap_refuses_the_archive(tmp_path: Path) -> None:
    limits = ArchiveLimits(max_uncompressed_size=1000)
    data = make_zip({"a.txt": b"a" * 600, "b.txt": b"b" * 600})
    with pytest.raises(ArchiveRefused) as refused:
        list_archive(_write(tmp_path, "big.zip", data), limits)
    assert refused.value.reason == "uncompressed size over 1000 bytes"


def test_overlong_names_are_refused(tmp_path: Path) -> None:
    long_name = "d/" * 600 + "x.txt"
    long_segment = "n" * 300 + ".txt"
    data = make_tar([(long_name, b"x"), (long_segment, b"x"), ("ok.txt", b"x")])
    reasons = _reasons(_write(tmp_path, "long.tar", data))
    assert set(reasons) == {long_name, long_segment}
    assert all("has a name longer than 1024 characters" in r for r in reasons.values())
    assert all(len(r) < 400 for r in reasons.values())  # the name is quoted cut short


def test_duplicate_and_file_folder_clashes_are_refused(tmp_path: Path) -> None:
    data = make_tar([("a.txt", b"1"), ("a.txt", b"2"), ("b", b"file"), ("b/c.txt", b"x")])
    assert _reasons(_write(tmp_path, "clash.tar", data)) == {
        "a.txt": "member 'a.txt' appears more than once",
        "b/c.txt": "member 'b/c.txt' is both a file and a folder",
    }


def test_not_an_archive_and_unreadable_archives(tmp_path: Path) -> None:
    with pytest.raises(NotAnArchive):
        list_archive(_write(tmp_path, "notes.txt", b"hello"), LIMITS)
    for name in ("fake.zip", "fake.tar.gz"):
        with pytest.raises(ArchiveRefused) as refused:
            list_archive(_write(tmp_path, name, b"not an archive at all" * 30), LIMITS)
        assert "is not a readable" in refused.value.reason


def test_a_link_at_the_archive_name_is_not_followed(tmp_path: Path) -> None:
    target = _write(tmp_path, "real.zip", make_zip({"a.txt": b"x"}))
    (tmp_path / "link.zip").symlink_to(target)
    with pytest.raises(ArchiveRefused):
        list_archive(tmp_path / "link.zip", LIMITS)


def test_streams_count_real_bytes_against_the_archive_total(tmp_path: Path) -> None:
    path = _write(tmp_path, "two.tar", make_tar([("a.txt", b"a" * 600), ("b.txt", b"b" * 600)]))
    listing = list_archive(path, ArchiveLimits())
    small = ArchiveLimits(max_uncompressed_size=1000)
    with pytest.raises(ArchiveRefused) as refused:
        for stream in iter_member_streams(path, listing.files, small):
            while stream.read(100):
                pass
    assert refused.value.reason == "uncompressed size over 1000 bytes"


def test_a_member_that_lies_about_its_size_is_stopped(tmp_path: Path) -> None:
    raw = bytearray(make_zip({"a.txt": b"x" * 5000}, method=0))
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = raw.find(signature) + offset
        raw[at : at + 4] = (10).to_bytes(4, "little")  # declares 10 bytes, stores 5000
    path = _write(tmp_path, "liar.zip", bytes(raw))
    listing = list_archive(path, LIMITS)
    with pytest.raises(ArchiveMemberRefused) as refused:
        for stream in iter_member_streams(path, listing.files, LIMITS):
            while stream.read():
                pass
    assert "member 'a.txt'" in refused.value.reason
