"""The streamed zip: exact bytes and names, no seeking, ZIP64 when asked, every name resolved."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from deerflow_web.errors import InvalidInput
from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.zip_download import MAX_MEMBERS
from deerflow_web.services.files.zip_download import ZipMember
from deerflow_web.services.files.zip_download import members_for_paths
from deerflow_web.services.files.zip_download import stream_zip

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


def artifact(path: Path) -> Artifact:
    return Artifact(path, path.name, "application/octet-stream", False, path.stat().st_size)


def test_files_come_back_byte_for_byte_with_their_names(tmp_path: Path) -> None:
    bodies = {"报告 final.txt": "第一章".encode() * 1000, "b.bin": bytes(range(256)) * 5000}
    members = []
    for name, body in bodies.items():
        (tmp_path / name).write_bytes(body)
        members.append(ZipMember(name, artifact(tmp_path / name)))
    pieces = list(stream_zip(members, lambda m: open(m.artifact.path, "rb")))
    assert len(pieces) > 2  # streamed in pieces, not built whole
    with zipfile.ZipFile(io.BytesIO(b"".join(pieces))) as archive:
        assert archive.testzip() is None
        infos = {info.filename: info for info in archive.infolist()}
        assert set(infos) == set(bodies)
        assert infos["报告 final.txt"].flag_bits & 0x800  # names as UTF-8
        for name, body in bodies.items():
            assert archive.read(name) == body


def test_no_piece_holds_more_than_about_one_chunk(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"\0" * (5 * 1024 * 1024))
    pieces = stream_zip(
        [ZipMember("big.bin", artifact(tmp_path / "big.bin"))],
        lambda m: open(m.artifact.path, "rb"),
    )
    assert max(len(piece) for piece in pieces) <= 1024 * 1024 + 4096


def test_a_file_that_vanished_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "b.txt").write_bytes(b"b")
    members = [
        ZipMember("a.txt", artifact(tmp_path / "a.txt")),
        ZipMember("b.txt", artifact(tmp_path / "b.txt")),
    ]
    (tmp_path / "b.txt").unlink()
    data = b"".join(stream_zip(members, lambda m: open(m.artifact.path, "rb")))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.namelist() == ["a.txt"]


def test_names_keep_their_area_only_when_areas_are_mixed(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a")
    resolve = lambda virtual: artifact(tmp_path / "a.txt")  # noqa: E731
    one = members_for_paths(resolve, ["uploads/a.txt", "uploads/b.txt"])
    assert [m.arcname for m in one] == ["a.txt", "b.txt"]
    mixed = members_for_paths(resolve, ["uploads/a.txt", "outputs/dir/a.txt"])
    assert [m.arcname for m in mixed] == ["uploads/a.txt", "outputs/dir/a.txt"]


@pytest.mark.parametrize(
    "paths",
    [
        [],
        [""],
        ["uploads/a.txt", "uploads/a.txt"],
        ["uploads/x"] * 2,
        [f"uploads/{i}" for i in range(MAX_MEMBERS + 1)],
    ],
)
def test_bad_selections_are_refused(tmp_path: Path, paths: list[str]) -> None:
    (tmp_path / "a.txt").write_bytes(b"a")
    with pytest.raises(InvalidInput):
        members_for_paths(lambda virtual: artifact(tmp_path / "a.txt"), paths)
