"""Content types sniffed from a file's first bytes, never trusted from the client (SPEC D10).

A small table of magic numbers covers the formats this workspace cares about; the name's
extension only refines a container format (a ZIP that is really a .docx) or names a text
format, and never turns binary bytes into an active type.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from pathlib import PurePosixPath

SNIFF_BYTES = 8192

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"ID3", "audio/mpeg"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
    (b"\x1a\x45\xdf\xa3", "video/webm"),
    (b"\x1f\x8b", "application/gzip"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (b"Rar!\x1a\x07", "application/vnd.rar"),
    (b"SQLite format 3\x00", "application/vnd.sqlite3"),
    (b"\x7fELF", "application/x-executable"),
)

_ZIP_FAMILY = {
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".odt": "application/vnd.oasis.opendocument.text",
    ".epub": "application/epub+zip",
    ".jar": "application/java-archive",
}

_OLE_FAMILY = {
    ".doc": "application/msword",
    ".xls": "application/vnd.ms-excel",
    ".ppt": "application/vnd.ms-powerpoint",
    ".msg": "application/vnd.ms-outlook",
}

_TEXT_TYPES = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".json": "application/json",
    ".html": "text/html",
    ".htm": "text/html",
    ".xhtml": "application/xhtml+xml",
    ".svg": "image/svg+xml",
    ".xml": "application/xml",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}


def is_binary_head(head: bytes) -> bool:
    """Whether a file's first bytes hold a NUL within the sniff window: the one test every
    reader (sniffing, preview, the agent's tools, inline artifacts) uses for "binary"."""
    return b"\x00" in head[:SNIFF_BYTES]


def is_binary_file(path: Path) -> bool:
    """`is_binary_head` of a file's first `SNIFF_BYTES`; OSError is the caller's to judge."""
    with open(path, "rb") as handle:
        return is_binary_head(handle.read(SNIFF_BYTES))


def _looks_like_text(head: bytes) -> bool:
    if is_binary_head(head):
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        # A multi-byte character cut by the sniff window is still text.
        return error.start >= len(head) - 3
    return True


def sniff_content_type(head: bytes, filename: str) -> str:
    """Return the content type of a file from its first bytes and, for text, its name."""
    suffix = PurePosixPath(filename).suffix.lower()
    for magic, content_type in _MAGIC:
        if head.startswith(magic):
            return content_type
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "audio/wav"
    if head[4:8] == b"ftyp":
        return "video/mp4"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _ZIP_FAMILY.get(suffix, "application/zip")
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return _OLE_FAMILY.get(suffix, "application/x-ole-storage")
    if _looks_like_text(head):
        if suffix in _TEXT_TYPES:
            return _TEXT_TYPES[suffix]
        guessed, _ = mimetypes.guess_type(f"x{suffix}") if suffix else (None, None)
        if guessed and (guessed.startswith("text/") or guessed.endswith(("json", "xml"))):
            return guessed
        return "text/plain"
    return "application/octet-stream"
