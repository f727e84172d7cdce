"""What the preview page shows for a file, decided without Flask (issue 3, SPEC 2.5, 2.7).

Only the first `PREVIEW_BYTES` (1 MiB, the range DeerFlow's preview requests) are ever
read, so a huge file costs no more than a small one; the page says when it shows only the
beginning. Media the browser can play or show (images, PDF, audio, video: the artifact
route's inline allow-list) are not read at all: the page points the browser at the
artifact URL. Markup of any kind (HTML, XHTML, SVG, XML) is shown as source text, never
rendered.
"""

from __future__ import annotations

import codecs
import csv
import enum
import io
import json
import posixpath
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from pathlib import PurePosixPath

from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.artifacts import Presentation
from deerflow_web.services.files.markdown_render import ImageResolver
from deerflow_web.services.files.markdown_render import MarkdownNotRendered
from deerflow_web.services.files.markdown_render import render_markdown
from deerflow_web.storage.sniff import is_binary_head

PREVIEW_BYTES = 1024 * 1024
CSV_ROWS = 200

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd"})
JSON_SUFFIXES = frozenset({".json", ".geojson", ".ipynb"})
CSV_DELIMITERS = {".csv": ",", ".tsv": "\t"}


class PreviewKind(enum.StrEnum):
    """How the page presents a file."""

    TEXT = "text"
    MARKDOWN = "markdown"
    JSON = "json"
    CSV = "csv"
    SOURCE = "source"  # active content (HTML, SVG): text only, never rendered
    IMAGE = "image"
    PDF = "pdf"
    AUDIO = "audio"
    VIDEO = "video"
    EMPTY = "empty"
    DOWNLOAD = "download"  # binary the browser cannot show: a card with size and type


@dataclass(frozen=True)
class Preview:
    """Everything the preview template needs; text fields are raw (the template escapes)."""

    kind: PreviewKind
    name: str
    size: int
    content_type: str
    text: str = ""
    html: str = ""  # sanitised Markdown, safe to insert as is
    unrendered: str = ""  # Markdown shown as source: "size" (too large) or "time" (too slow)
    rows: list[list[str]] = field(default_factory=list)
    more_rows: bool = False
    truncated: bool = False
    shown_bytes: int = 0
    encoding: str | None = None
    invalid_json: bool = False


def _decode(data: bytes, complete: bool) -> tuple[str, str]:
    """Text and encoding: UTF-8 (BOM allowed), else GB18030 (common for Chinese files).

    A multi-byte character cut at the 1 MiB boundary is dropped instead of garbled.
    """
    for encoding in ("utf-8-sig", "gb18030"):
        decoder = codecs.getincrementaldecoder(encoding)("strict")
        try:
            return decoder.decode(data, final=complete), encoding.removesuffix("-sig")
        except UnicodeDecodeError:
            continue
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(data, final=complete), "utf-8"


def _read_head(path: Path, size: int) -> tuple[bytes, bool]:
    with open(path, "rb") as handle:
        data = handle.read(PREVIEW_BYTES)
    return data, size > len(data)


def _csv_rows(text: str, delimiter: str, truncated: bool) -> tuple[list[list[str]], bool] | None:
    """The first rows of a table, or None if the text is not readable as one."""
    if truncated and "\n" in text:
        text = text[: text.rindex("\n")]  # the last line may be cut in half
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=False)
    rows: list[list[str]] = []
    try:  # a field over csv's 128 KiB limit raises: such a file reads better as text
        for row in reader:
            if len(rows) == CSV_ROWS:
                return rows, True
            rows.append(row)
    except csv.Error:
        return None
    return rows, truncated


MEDIA_KINDS = {
    Presentation.IMAGE: PreviewKind.IMAGE,
    Presentation.PDF: PreviewKind.PDF,
    Presentation.AUDIO: PreviewKind.AUDIO,
    Presentation.VIDEO: PreviewKind.VIDEO,
}


def build_preview(
    artifact: Artifact, *, user_data_path: str, image_url: ImageResolver | None = None
) -> Preview:
    """Decide how to show one resolved file and read what that needs (at most 1 MiB).

    Args:
        artifact: The file, resolved and checked by `resolve_artifact`.
        user_data_path: Its path relative to user-data (`uploads/a.md`); relative images in
            Markdown are resolved from its folder.
        image_url: Maps a user-data path to a same-origin URL for Markdown images.
    """
    base = Preview(PreviewKind.DOWNLOAD, artifact.name, artifact.size, artifact.content_type)
    media = MEDIA_KINDS.get(artifact.presentation) if artifact.presentation else None
    if media is not None:
        return replace(base, kind=media)
    if artifact.size == 0:
        return replace(base, kind=PreviewKind.EMPTY)
    data, truncated = _read_head(artifact.path, artifact.size)
    if is_binary_head(data):
        return base
    text, encoding = _decode(data, complete=not truncated)
    shown = replace(base, text=text, truncated=truncated, shown_bytes=len(data), encoding=encoding)
    suffix = PurePosixPath(artifact.name).suffix.lower()
    if artifact.active:
        return replace(shown, kind=PreviewKind.SOURCE)
    if suffix in MARKDOWN_SUFFIXES or artifact.content_type == "text/markdown":
        folder = posixpath.dirname(user_data_path)
        try:
            html = render_markdown(text, base_dir=folder, image_url=image_url)
        except MarkdownNotRendered as refused:
            return replace(shown, kind=PreviewKind.MARKDOWN, unrendered=refused.reason)
        return replace(shown, kind=PreviewKind.MARKDOWN, html=html)
    if suffix in JSON_SUFFIXES or artifact.content_type == "application/json":
        return _json_preview(shown)
    if suffix in CSV_DELIMITERS:
        table = _csv_rows(text, CSV_DELIMITERS[suffix], truncated)
        if table is not None:
            rows, more = table
            return replace(shown, kind=PreviewKind.CSV, rows=rows, more_rows=more)
    return replace(shown, kind=PreviewKind.TEXT)


def _json_preview(shown: Preview) -> Preview:
    """Pretty-printed when the whole file was read and parses; raw text otherwise."""
    if shown.truncated:
        return replace(shown, kind=PreviewKind.JSON)
    try:
        value = json.loads(shown.text)
    except ValueError:
        return replace(shown, kind=PreviewKind.JSON, invalid_json=True)
    pretty = json.dumps(value, indent=2, ensure_ascii=False)
    return replace(shown, kind=PreviewKind.JSON, text=pretty)
