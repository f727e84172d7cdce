"""`archives.*` and `uploads.extract_archives` settings, and the upload block's archive line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from deerflow_web.services.prompt.context_block import build_upload_context
from deerflow_web.services.prompt.context_block import context_files_for
from deerflow_web.settings import ArchiveLimits
from deerflow_web.settings import load_settings
from tests.support.archives import make_overlapping_zip
from tests.support.archives import make_zip

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


def test_archive_settings_are_read_and_bad_values_fall_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_settings(tmp_path / "data", cwd=tmp_path).archives == ArchiveLimits()
    (tmp_path / "config.yaml").write_text(
        "uploads:\n  extract_archives: 'yes'\n"
        "archives:\n  max_members: 50\n  max_ratio: -3\n  max_depth: '2'\n",
        encoding="utf-8",
    )
    with caplog.at_level(logging.WARNING):
        archives = load_settings(tmp_path / "data", cwd=tmp_path).archives
    assert archives.extract_on_upload is True
    assert archives.max_members == 50 and archives.max_depth == 2
    assert archives.max_ratio == ArchiveLimits.max_ratio
    assert "archives.max_ratio=-3" in caplog.text


def test_the_block_gives_an_archive_its_file_count(tmp_path: Path) -> None:
    (tmp_path / "reports.zip").write_bytes(
        make_zip({"q3/a.docx": b"a", "b.txt": b"b", "../x": b"x"})
    )
    (tmp_path / "bomb.zip").write_bytes(make_overlapping_zip())
    (tmp_path / "notes.txt").write_text("plain notes\n")
    entries = [
        {"filename": "reports.zip", "size": 2048},
        {"filename": "bomb.zip", "size": 300},
        {"filename": "notes.txt", "size": 12},
    ]
    block = build_upload_context(context_files_for(tmp_path, entries))
    assert block.split("To work with these files:")[0] == (
        "<current_uploads>\n"
        "The following files were uploaded in this message:\n"
        "\n"
        "- reports.zip (2.0 KB)\n"
        "  Path: /mnt/user-data/uploads/reports.zip\n"
        "  Archive of 2 file(s): read or grep a member at its path inside, such as "
        "/mnt/user-data/uploads/reports.zip/<member> (1 member(s) refused; read_file on it "
        "lists why)\n"
        "\n"
        "- bomb.zip (0.3 KB)\n"
        "  Path: /mnt/user-data/uploads/bomb.zip\n"
        "  Archive refused, its members cannot be read: members 'a.txt' and 'b.txt' overlap "
        "(overlapping entries, a zip bomb)\n"
        "\n"
        "- notes.txt (0.0 KB)\n"
        "  Path: /mnt/user-data/uploads/notes.txt\n"
        "  Use `grep` on /mnt/user-data/uploads/ to search this file for keywords.\n"
        "\n"
    )
