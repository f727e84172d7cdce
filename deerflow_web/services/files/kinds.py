"""Coarse file kinds for people: what the Type column shows and the type filter offers.

A person filtering a file list thinks "images" or "documents", not MIME types. The kind is
decided from the extension first (what the person named the file) and the sniffed content
type second, so a `notes` file without a suffix still lands under "text".
"""

from __future__ import annotations

import enum
import functools

from deerflow_web.models import suffix_of


class FileKind(enum.StrEnum):
    """The groups the type filter offers, in the order the filter lists them."""

    DOCUMENT = "document"
    SPREADSHEET = "spreadsheet"
    PRESENTATION = "presentation"
    TEXT = "text"
    DATA = "data"
    CODE = "code"
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"
    ARCHIVE = "archive"
    OTHER = "other"


_BY_SUFFIX: dict[FileKind, frozenset[str]] = {
    FileKind.DOCUMENT: frozenset({".pdf", ".doc", ".docx", ".odt", ".rtf", ".epub", ".pages"}),
    FileKind.SPREADSHEET: frozenset({".xls", ".xlsx", ".ods", ".numbers"}),
    FileKind.PRESENTATION: frozenset({".ppt", ".pptx", ".odp", ".key"}),
    FileKind.TEXT: frozenset({".txt", ".md", ".markdown", ".rst", ".log", ".text"}),
    FileKind.DATA: frozenset(
        {".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".xml", ".yaml", ".yml", ".toml", ".ini"}
    ),
    FileKind.CODE: frozenset(
        {
            ".py",
            ".js",
            ".mjs",
            ".ts",
            ".tsx",
            ".jsx",
            ".java",
            ".c",
            ".h",
            ".cc",
            ".cpp",
            ".hpp",
            ".cs",
            ".go",
            ".rs",
            ".rb",
            ".php",
            ".sh",
            ".bash",
            ".sql",
            ".css",
            ".html",
            ".htm",
            ".xhtml",
            ".svg",
            ".kt",
            ".swift",
            ".r",
            ".lua",
            ".pl",
            ".ipynb",
        }
    ),  # fmt: skip
    FileKind.IMAGE: frozenset(
        {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".ico", ".avif", ".tif", ".tiff"}
    ),
    FileKind.AUDIO: frozenset({".mp3", ".wav", ".ogg", ".oga", ".flac", ".m4a", ".aac", ".opus"}),
    FileKind.VIDEO: frozenset({".mp4", ".m4v", ".webm", ".mov", ".mkv", ".avi", ".ogv"}),
    FileKind.ARCHIVE: frozenset({".zip", ".gz", ".tgz", ".tar", ".bz2", ".xz", ".7z", ".rar"}),
}
_KIND_OF_SUFFIX = {suffix: kind for kind, suffixes in _BY_SUFFIX.items() for suffix in suffixes}

_BY_TYPE_PREFIX: tuple[tuple[str, FileKind], ...] = (
    ("image/", FileKind.IMAGE),
    ("audio/", FileKind.AUDIO),
    ("video/", FileKind.VIDEO),
    ("application/pdf", FileKind.DOCUMENT),
    ("application/json", FileKind.DATA),
    ("application/xml", FileKind.DATA),
    ("application/yaml", FileKind.DATA),
    ("text/csv", FileKind.DATA),
    ("text/", FileKind.TEXT),
    ("application/zip", FileKind.ARCHIVE),
    ("application/gzip", FileKind.ARCHIVE),
)


def file_kind(filename: str, content_type: str | None = None) -> FileKind:
    """The kind a person would file this under: by extension, else by content type."""
    return _kind_of(suffix_of(filename).lower(), content_type)


@functools.lru_cache(maxsize=1024)
def _kind_of(suffix: str, content_type: str | None) -> FileKind:
    """Cached: a thread of 10,000 files has a few dozen (suffix, type) pairs."""
    if suffix in _KIND_OF_SUFFIX:
        return _KIND_OF_SUFFIX[suffix]
    for prefix, kind in _BY_TYPE_PREFIX:
        if content_type and content_type.startswith(prefix):
            return kind
    return FileKind.OTHER


def parse_kind(value: str | None) -> FileKind | None:
    """A kind from a query string; anything unknown means "no filter"."""
    try:
        return FileKind(value) if value else None
    except ValueError:
        return None
