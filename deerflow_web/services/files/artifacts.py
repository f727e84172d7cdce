"""Which file a virtual path names, and how it may be shown to a browser (SPEC 2.5, issue 9).

The decision is made here, away from Flask. A thread's files come from people and agents,
so none of them may ever become a document that runs script in the app's origin, whatever
its name, extension or content. Only an allow-list of passive kinds is shown inline:
images other than SVG, PDF, audio, video, and text. Text keeps its own type only when that
type is on a short list of passive data formats no browser renders as a document (JSON,
NDJSON, CSV, TSV, Markdown, YAML, plain text), as DeerFlow serves them; any other text (code,
CSS, an HTML page named `.txt`) is sent as `text/plain`. Under `nosniff` and the sandbox CSP a
browser shows either as text or offers a download, even when it holds HTML. Everything else,
markup of every kind included (HTML, XHTML, SVG, XML, XSLT, RSS, MathML), is an attachment.
"""

from __future__ import annotations

import enum
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import NotAFile
from deerflow_web.models import UploadRecord
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.sniff import is_binary_file
from deerflow_web.storage.sniff import is_binary_head

PLAIN_TEXT = "text/plain"
# Text formats that are data, never documents: shown inline with their own type.
PASSIVE_TEXT_TYPES = frozenset(
    {
        PLAIN_TEXT,
        "application/json",
        "application/x-ndjson",
        "text/csv",
        "text/tab-separated-values",
        "text/markdown",
        "application/yaml",
    }
)
# Their usual names, so the type does not depend on the platform's mime.types (Python's
# own table lacks YAML and NDJSON, and Linux distributions disagree about them).
TEXT_TYPE_BY_SUFFIX = {
    ".json": "application/json",
    ".ndjson": "application/x-ndjson",
    ".jsonl": "application/x-ndjson",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}

# Raster images browsers decode without any script engine; SVG is a document, never here.
INLINE_IMAGE_TYPES = frozenset(
    {
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/bmp",
        "image/avif",
        "image/x-icon",
        "image/vnd.microsoft.icon",
    }
)
# Types a browser could render as a document with script, by name or by type family.
MARKUP_TYPES = frozenset(
    {"text/html", "text/sgml", "text/x-sgml", "message/rfc822", "multipart/related"}
)
MARKUP_SUFFIXES = frozenset(
    {
        ".html",
        ".htm",
        ".shtml",
        ".xhtml",
        ".xht",
        ".svg",
        ".svgz",
        ".xml",
        ".xsl",
        ".xslt",
        ".xsd",
        ".rss",
        ".atom",
        ".rdf",
        ".mml",
        ".xbl",
        ".xul",
        ".mht",
        ".mhtml",
    }
)


class Presentation(enum.StrEnum):
    """How a browser may show a file inline; anything else is only ever downloaded."""

    IMAGE = "image"
    PDF = "pdf"
    AUDIO = "audio"
    VIDEO = "video"
    TEXT = "text"


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


def is_markup(content_type: str | None, suffix: str) -> bool:
    """Whether a browser could treat the file as a document (HTML, any XML, SVG, MHTML)."""
    if suffix.lower() in MARKUP_SUFFIXES:
        return True
    if content_type is None:
        return False
    kind = content_type.lower()
    return kind in MARKUP_TYPES or kind.endswith(("/xml", "+xml")) or "xml-" in kind


@dataclass(frozen=True)
class Artifact:
    """A resolved file under a thread's user-data folder, ready to send.

    `content_type` is what the file is (guessed from its name, or sniffed as text or
    binary); `presentation` is how a browser may show it inline, None for download only.
    """

    path: Path
    name: str
    content_type: str
    active: bool
    size: int
    presentation: Presentation | None = None
    # On the S3 backend, an upload this instance's copy lacks: its record, whose bytes the
    # bucket streams (`path` is where the copy would be, and is not read).
    in_bucket: UploadRecord | None = None

    def as_attachment(self, download: bool) -> bool:
        """Only the passive allow-list is ever shown inline, whatever the client asks."""
        return download or self.presentation is None

    def response_type(self, attachment: bool) -> str:
        """The Content-Type to send: inline text keeps a passive type, else `text/plain`."""
        if (
            not attachment
            and self.presentation is Presentation.TEXT
            and self.content_type not in PASSIVE_TEXT_TYPES
        ):
            return PLAIN_TEXT
        return self.content_type


def classify(
    path: Path, name: str | None = None, *, is_binary: Callable[[], bool] | None = None
) -> tuple[str, bool, Presentation | None]:
    """The file's content type, whether it is markup, and how it may be shown inline.

    `name`: the name it is shown under, when the bytes are stored under another one (a
    version's file is named by its id). `is_binary`: how to tell binary from text when
    the bytes are not at `path` (an upload read from the bucket)."""
    named = Path(name) if name is not None else path
    guessed = TEXT_TYPE_BY_SUFFIX.get(named.suffix.lower())
    if guessed is None:
        guessed, _ = mimetypes.guess_type(named.name, strict=False)
    active = is_markup(guessed, named.suffix)
    if guessed and guessed.startswith("text/"):
        content_type, text = guessed, True
    elif not (is_binary() if is_binary is not None else _is_binary(path)):
        content_type, text = guessed or PLAIN_TEXT, True
    else:
        content_type, text = guessed or "application/octet-stream", False
    if active:
        return content_type, True, None
    if content_type in INLINE_IMAGE_TYPES:
        return content_type, False, Presentation.IMAGE
    if content_type == "application/pdf":
        return content_type, False, Presentation.PDF
    if content_type.startswith("audio/"):
        return content_type, False, Presentation.AUDIO
    if content_type.startswith("video/"):
        return content_type, False, Presentation.VIDEO
    return content_type, False, Presentation.TEXT if text else None


def is_foreign_upload(
    folders: ThreadFolders,
    actual: Path,
    listed_upload: Callable[[str], bool] | None,
) -> bool:
    """Whether a resolved file is a hard link in uploads/ that the upload listing leaves out.

    Only a file with more than one link needs the (costlier) look at the listing.
    """
    if not folders.holds_upload(actual):
        return False
    if actual.stat().st_nlink <= 1:
        return False
    return listed_upload is None or not listed_upload(actual.name)


def resolve_artifact(
    folders: ThreadFolders,
    virtual_path: str,
    listed_upload: Callable[[str], bool] | None = None,
) -> Artifact:
    """Resolve a virtual path to a regular file inside the thread's user-data folder.

    `listed_upload(name)` says whether the upload listing includes a name; without it, a
    hard-linked file in uploads/ is never served.

    Raises:
        ArtifactPrefixError, PathTraversal, UnsafeFolder,
        ArtifactNotFound, NotAFile.
    """
    actual = folders.resolve_virtual_path(virtual_path)
    shown = virtual_path.lstrip("/")
    if not actual.exists() or is_staging_name(actual.name):  # half-written: never served
        raise ArtifactNotFound(shown)
    if not actual.is_file():
        raise NotAFile(shown)
    if is_foreign_upload(folders, actual, listed_upload):
        raise ArtifactNotFound(shown)
    content_type, active, presentation = classify(actual)
    return Artifact(actual, actual.name, content_type, active, actual.stat().st_size, presentation)


def bucket_artifact(path: Path, record: UploadRecord, head: Callable[[], bytes]) -> Artifact:
    """An upload served from the bucket (`Artifact.in_bucket`), classified as the file at
    `path` would be: `head` gives its first bytes when its name leaves text or binary open."""
    content_type, active, presentation = classify(
        path, record.filename, is_binary=lambda: is_binary_head(head())
    )
    return Artifact(path, record.filename, content_type, active, record.size, presentation, record)
