"""Heading outlines and short previews of Markdown companions (SPEC 4.2).

An outline with line numbers lets the model jump straight to a section with `read_file`
instead of reading a long converted document from the top. The middleware, the listing
tool and the chat preview all call `outline_for_file`, so they describe a file the same way.
Standard library only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deerflow_web.models import UploadRecord
from deerflow_web.services.conversion.page_marks import parse_mark
from deerflow_web.storage.filenames import companion_name

logger = logging.getLogger(__name__)

MAX_OUTLINE_ENTRIES = 50
MAX_PREVIEW_LINES = 5
TRUNCATED_SENTINEL: dict[str, Any] = {"truncated": True}

_BOLD_GAP = re.compile(r"\*\*\s*\*\*")
_WHOLE_BOLD = re.compile(r"\*\*(.*)\*\*", re.DOTALL)
# Filings converted from PDF mark their structure with bold keywords instead of `#`.
_BOLD_KEYWORD = re.compile(
    r"^\*\*((ITEM|PART|SECTION|SCHEDULE|EXHIBIT|APPENDIX|ANNEX|CHAPTER)\b[A-Z0-9 .,\-]*)\*\*\s*$"
)
# Papers put the section number and the title in two bold runs: **3.1** **Encoder**.
# The lookahead refuses rows of bold numbers (year columns of a table).
_SPLIT_BOLD = re.compile(
    r"^\*\*[\dA-Z][\d\.]*\*\*\s+\*\*(?!\d[\d\s.,\-–—/:()%]*\*\*)[^*]+\*\*"
    r"(?:\s+\*\*[^*]+\*\*){0,2}\s*$"
)
_BOLD_RUN = re.compile(r"\*\*([^*]+)\*\*")


def _clean_bold(title: str) -> str:
    cleaned = _BOLD_GAP.sub(" ", title).strip()
    whole = _WHOLE_BOLD.fullmatch(cleaned)
    if whole is not None:
        cleaned = whole.group(1).strip()
    return cleaned


def _heading_title(stripped: str) -> str | None:
    if stripped.startswith("#"):
        return _clean_bold(stripped.lstrip("#").strip()) or None
    keyword = _BOLD_KEYWORD.match(stripped)
    if keyword is not None:
        return keyword.group(1).strip()
    if _SPLIT_BOLD.match(stripped):
        return " ".join(run.strip() for run in _BOLD_RUN.findall(stripped))
    return None


def extract_outline(md_path: Path) -> list[dict[str, Any]]:
    """Return `{"title", "line"}` entries for the headings of a Markdown file.

    At most 50 entries; a 51st heading adds the `{"truncated": True}` sentinel instead, so
    the reader knows there is more. A file that cannot be read or decoded gives `[]` as a
    whole: a partial outline would look complete.

    Args:
        md_path: The Markdown file to scan.

    Returns:
        Entries with 1-based line numbers, possibly ending with the sentinel.
    """
    outline: list[dict[str, Any]] = []
    try:
        with md_path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                stripped = line.strip()
                if not stripped:
                    continue
                title = _heading_title(stripped)
                if title is None:
                    continue
                if len(outline) == MAX_OUTLINE_ENTRIES:
                    outline.append(dict(TRUNCATED_SENTINEL))
                    break
                outline.append({"title": title, "line": number})
    except (OSError, UnicodeDecodeError, ValueError):
        logger.debug("cannot read an outline from %s", md_path, exc_info=True)
        return []
    return outline


def _preview(md_path: Path) -> list[str]:
    lines: list[str] = []
    try:
        with md_path.open(encoding="utf-8") as handle:
            for line in handle:
                stripped = line.strip()
                if stripped and parse_mark(stripped) is None:  # page markers are not text
                    lines.append(stripped)
                    if len(lines) == MAX_PREVIEW_LINES:
                        break
    except (OSError, UnicodeDecodeError, ValueError):
        logger.debug("cannot read a preview from %s", md_path, exc_info=True)
        return []
    return lines


def companion_path(path: Path) -> Path:
    """The sibling `{stem}.md` (the file itself for a `.md`, `README.md` for `README`)."""
    return path.with_name(companion_name(path.name))


def outline_for_file(
    path: Path, companion: Path | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Describe an upload through its Markdown companion: an outline, else a preview.

    A symlinked companion is ignored: the uploads folder never follows links (SPEC D7), and
    reading through one could show the model a file from outside the thread.

    Args:
        path: The uploaded file.
        companion: The companion to read when the upload records know it (a conversion may
            have produced `a_1.md`); defaults to the sibling `{stem}.md`.

    Returns:
        `(outline, [])` when the companion has headings, `([], preview)` with its first up
        to 5 non-empty lines otherwise, and `([], [])` when there is no companion.
    """
    md_path = companion if companion is not None else companion_path(path)
    if md_path.is_symlink() or not md_path.is_file():
        return [], []
    outline = extract_outline(md_path)
    if outline:
        return outline, []
    return [], _preview(md_path)


def upload_outline(
    folder: Path, record: UploadRecord, records: Sequence[UploadRecord]
) -> tuple[str | None, list[dict[str, Any]]]:
    """The outline a person sees next to an upload: the one the agent is given.

    It comes from the companion that conversion recorded for the file (SPEC D8), or from the
    file itself when it is Markdown. Returns the name of the Markdown file read (None when
    there is none) and its headings.
    """
    if record.extension.lower() == ".md":
        source = record.filename
    else:
        companion = next((r for r in records if r.converted_from == record.filename), None)
        if companion is None:
            return None, []
        source = companion.filename
    outline, _ = outline_for_file(folder / record.filename, folder / source)
    return source, outline
