"""The line that marks where a page (or slide) of a converted document begins.

A PDF's Markdown starts each page with `<!-- page 3 of 12: text layer -->` (or `OCR, mean
confidence 0.97`, or why the page has no text); a PowerPoint's has markitdown's
`<!-- Slide number: 3 -->`. An HTML comment rather than a heading: a heading per page
would fill the outline (50 entries at most) with "Page 1", "Page 2"... and push out the
document's own sections, and comments are invisible once the Markdown is rendered. The
marker says how the page was read, so the model knows which text to trust, and lets
`read_file` and `grep` give the page of every line they return, so an answer can cite
"report.pdf, page 3".

A marker is a whole line. Text inside a page that looks like one (a hostile PDF could
print fake markers to misdirect citations) is escaped with a backslash by `escape_text`
before it is written, so only the converter's own lines parse. Standard library only: the
worker and the prompt layer both import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PAGE = re.compile(r"<!-- page (\d+) of (\d+): ([^<>]*) -->")
_SLIDE = re.compile(r"<!-- Slide number: (\d+) -->")
_LOOKS_LIKE_MARKER = re.compile(r"^(\s*)(<!--)", re.MULTILINE)


@dataclass(frozen=True)
class PageMark:
    """One page's start: `unit` is "page" or "slide", `how` says how it was read."""

    unit: str
    number: int
    how: str = ""


def page_marker(number: int, count: int, how: str) -> str:
    """The marker line (without newline) for page `number` of `count`."""
    return f"<!-- page {number} of {count}: {' '.join(how.split())} -->"


def parse_mark(line: str) -> PageMark | None:
    """The page or slide a line marks the start of, else None."""
    stripped = line.strip()
    if not stripped.startswith("<!--"):
        return None
    match = _PAGE.fullmatch(stripped)
    if match is not None:
        return PageMark("page", int(match[1]), match[3])
    match = _SLIDE.fullmatch(stripped)
    if match is not None:
        return PageMark("slide", int(match[1]))
    return None


def escape_text(text: str) -> str:
    """Page text with every line that starts an HTML comment escaped (`\\<!--`)."""
    return _LOOKS_LIKE_MARKER.sub(r"\1\\\2", text)
