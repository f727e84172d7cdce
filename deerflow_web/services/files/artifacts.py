"""Which file a virtual path names, and how it may be shown to a browser (SPEC 2.5).

The decision is made here, away from Flask: anything a browser could execute (HTML,
XHTML, SVG) is always an attachment, whatever the client asks for.
"""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import NotAFile
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.sniff import is_binary_file

ACTIVE_CONTENT_TYPES = frozenset({"text/html", "application/xhtml+xml", "image/svg+xml"})
ACTIVE_SUFFIXES = frozenset({".html", ".htm", ".xhtml", ".xht", ".svg", ".svgz", ".shtml"})


def artifact_url(thread_id: str, virtual_path: str) -> str:
    """The artifact URL of a virtual path, every segment percent-encoded (SPEC 1.3)."""
    segments = virtual_path.strip("/").split("/")
    encoded = "/".join(quote(segment, safe="") for segment in segments)
    return f"/api/threads/{quote(thread_id, safe='')}/artifacts/{encoded}"


def _is_binary(path: Path) -> bool:
    try:
        return is_binary_file(path)
    except OSError:
        return True  # unreadable counts as binary: never guess text for it


@dataclass(frozen=True)
class Artifact:
    """A resolved file under a thread's user-data folder, ready to send."""

    path: Path
    name: str
    content_type: str
    active: bool
    size: int

    def as_attachment(self, download: bool) -> bool:
        """Active content is never shown inline, even when the client asks for it."""
        return download or self.active


def content_type_for(path: Path) -> tuple[str, bool]:
    """(content type to send, whether it is active content) for a file on disk."""
    guessed, _ = mimetypes.guess_type(path.name, strict=False)
    active = guessed in ACTIVE_CONTENT_TYPES or path.suffix.lower() in ACTIVE_SUFFIXES
    if guessed and guessed.startswith("text/"):
        return guessed, active
    if not _is_binary(path):
        return guessed or "text/plain", active
    return guessed or "application/octet-stream", active


def resolve_artifact(
    paths: ThreadPaths, thread_id: str, virtual_path: str, user_id: str | None = None
) -> Artifact:
    """Resolve a virtual path to a regular file inside the thread's user-data folder.

    Raises:
        InvalidThreadId, ArtifactPrefixError, PathTraversal, ArtifactNotFound, NotAFile.
    """
    actual = paths.resolve_virtual_path(thread_id, virtual_path, user_id)
    shown = virtual_path.lstrip("/")
    if not actual.exists() or is_staging_name(actual.name):  # half-written: never served
        raise ArtifactNotFound(shown)
    if not actual.is_file():
        raise NotAFile(shown)
    content_type, active = content_type_for(actual)
    return Artifact(actual, actual.name, content_type, active, actual.stat().st_size)
