"""The pure turn functions UploadsMiddleware and the chat preview share (no Flask, no LangChain)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.services.prompt.turn import compose_text
from deerflow_web.services.prompt.turn import current_turn
from deerflow_web.services.prompt.turn import incremental_turn
from deerflow_web.services.prompt.turn import message_files
from deerflow_web.services.prompt.turn import shown_pairs
from tests.support.agent_helpers import write_file

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


def _record(name: str, content: bytes = b"x", **kwargs) -> UploadRecord:
    return UploadRecord(
        name, len(content), hashlib.sha256(content).hexdigest(), "text/plain", 1.0, 2.0, **kwargs
    )


def test_compose_text_puts_the_block_and_a_blank_line_in_front() -> None:
    assert compose_text("<b>", "hi") == "<b>\n\nhi"
    assert compose_text("<b>", "") == "<b>\n\n"
    assert compose_text(None, "hi") == "hi"


def test_message_files_ignore_junk_and_rebuild_paths(tmp_path: Path) -> None:
    write_file(tmp_path / "a.txt")
    raw = [{"filename": "a.txt", "size": "3", "path": "/etc/a.txt"}, "junk", {"filename": "../x"}]
    assert message_files(raw, tmp_path) == [
        {
            "filename": "a.txt",
            "size": 3,
            "path": "/mnt/user-data/uploads/a.txt",
            "extension": ".txt",
        }
    ]
    assert message_files("not a list", tmp_path) == []


def test_unreadable_records_leave_the_uploads_key_out(tmp_path: Path) -> None:
    write_file(tmp_path / "a.txt")
    turn = current_turn([{"filename": "a.txt"}], None, tmp_path)
    assert turn.block is not None and "uploads" not in turn.state_update()
    assert current_turn([], [], tmp_path).state_update() == {"uploaded_files": [], "uploads": []}


def test_a_companion_of_an_omitted_file_is_neither_listed_nor_counted(tmp_path: Path) -> None:
    """Only described files borrow outlines; an omitted file's companion stays out of the block."""
    names = [f"f{i:02d}.txt" for i in range(3)]
    for name in [*names, "f02.md"]:
        write_file(tmp_path / name, "# Heading\n" if name.endswith(".md") else "x")
    companion = _record("f02.md", source=RecordSource.CONVERSION, converted_from="f02.txt")
    records = [*(_record(name) for name in names), companion]
    turn = current_turn([{"filename": n} for n in names], records, tmp_path, max_files=2)
    assert "... (1 more file(s) from this message omitted" in turn.block
    assert "Omitted file types: 1 .txt" in turn.block
    assert "f02.md" not in turn.block


def test_incremental_forgets_pairs_of_changed_files() -> None:
    first = incremental_turn([_record("a.txt", b"1")], None, None)
    assert shown_pairs(first.shown_uploads) == {("a.txt", hashlib.sha256(b"1").hexdigest())}
    second = incremental_turn([_record("a.txt", b"2")], first.shown_uploads, None)
    assert [f["filename"] for f in second.uploaded_files] == ["a.txt"]
    assert shown_pairs(second.shown_uploads) == {("a.txt", hashlib.sha256(b"2").hexdigest())}
    third = incremental_turn([_record("a.txt", b"2")], second.shown_uploads, None)
    assert third.block is None and third.uploaded_files == []
