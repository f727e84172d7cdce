"""Content sniffing and the binary check: one table, bytes in, type out (SPEC D10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.storage.sniff import SNIFF_BYTES
from deerflow_web.storage.sniff import is_binary_file
from deerflow_web.storage.sniff import is_binary_head
from deerflow_web.storage.sniff import sniff_content_type

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


@pytest.mark.parametrize(
    ("head", "filename", "expected"),
    [
        (b"%PDF-1.7\n", "report.pdf", "application/pdf"),
        (b"%PDF-1.7\n", "disguised.txt", "application/pdf"),  # bytes win over the name
        (b"\x89PNG\r\n\x1a\n\0\0", "a.png", "image/png"),
        (b"\xff\xd8\xff\xe0", "photo.jpg", "image/jpeg"),
        (b"GIF89a", "x.gif", "image/gif"),
        (b"RIFF\0\0\0\0WEBPVP8 ", "x.webp", "image/webp"),
        (b"RIFF\0\0\0\0WAVEfmt ", "x.wav", "audio/wav"),
        (b"\0\0\0\x18ftypmp42", "x.mp4", "video/mp4"),
        (b"PK\x03\x04rest", "r.docx", DOCX),
        (b"PK\x03\x04rest", "r.zip", "application/zip"),
        (b"PK\x03\x04rest", "r.txt", "application/zip"),  # a zip named .txt is still a zip
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "old.doc", "application/msword"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "old.bin", "application/x-ole-storage"),
        (b"\x7fELF\x02\x01", "tool", "application/x-executable"),
        (b"# Title\n", "notes.md", "text/markdown"),
        (b"a,b\n1,2\n", "t.csv", "text/csv"),
        (b'{"a": 1}', "d.json", "application/json"),
        (b"plain words", "notes", "text/plain"),
        (b"<html><script>", "page.html", "text/html"),
        (b"<svg/>", "pic.svg", "image/svg+xml"),
        (b"<html>", "page.txt", "text/plain"),  # a text name never becomes an active type
        ("h\u00e9llo".encode(), "utf8.txt", "text/plain"),
        ("\u00e9".encode()[:1], "cut.txt", "text/plain"),  # a character cut by the window
        (b"text\0with nul", "nul.txt", "application/octet-stream"),
        (b"\xff\xfe\xfd garbage", "x.txt", "application/octet-stream"),
        (b"", "empty.txt", "text/plain"),
    ],
)
def test_sniff_content_type(head: bytes, filename: str, expected: str) -> None:
    assert sniff_content_type(head, filename) == expected


@pytest.mark.parametrize(
    ("head", "binary"),
    [
        (b"", False),
        (b"plain text", False),
        (b"\0", True),
        (b"x" * (SNIFF_BYTES - 1) + b"\0", True),
        (b"x" * SNIFF_BYTES + b"\0", False),  # past the window: not looked at
        ("\u00e9t\u00e9".encode(), False),
    ],
)
def test_is_binary_head(head: bytes, binary: bool) -> None:
    assert is_binary_head(head) is binary


def test_is_binary_file_reads_only_the_window(tmp_path: Path) -> None:
    late = tmp_path / "late.txt"
    late.write_bytes(b"x" * SNIFF_BYTES + b"\0")
    early = tmp_path / "early.bin"
    early.write_bytes(b"ab\0cd")
    assert is_binary_file(late) is False
    assert is_binary_file(early) is True
    with pytest.raises(FileNotFoundError):
        is_binary_file(tmp_path / "missing")
