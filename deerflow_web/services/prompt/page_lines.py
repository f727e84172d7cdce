"""The page of every line `read_file` and `grep` return from a converted PDF or slide deck.

A converted PDF's Markdown starts each page with a marker line (`conversion/page_marks`).
A model reading lines 300-340, or given one grep match, would otherwise have to find the
marker above by itself before it could cite "report.pdf, page 3"; so the tools follow the
markers from the top of the file and put the page next to each line: `p.3` in `read_file`'s
numbered lines, `"page": 3` in a grep match (`slide` for a PowerPoint's slides). Only the
Markdown of a document the tools read through conversion is followed: in a `.md` someone
wrote, such a comment is just text.
"""

from __future__ import annotations

from deerflow_web.services.conversion.page_marks import PageMark
from deerflow_web.services.conversion.page_marks import parse_mark

READ_NOTE = "p.N / s.N before a line: the page / slide it is on"


class PageTracker:
    """Follows a document's page markers, one line at a time, from its first line."""

    def __init__(self) -> None:
        self.mark: PageMark | None = None
        self.seen = False  # whether any marker was met

    def line(self, raw: str) -> PageMark | None:
        """The page (or slide) this line is on, given every line before it was fed."""
        found = parse_mark(raw)
        if found is not None:
            self.mark = found
            self.seen = True
        return self.mark


def line_label(mark: PageMark | None) -> str:
    """`p.3` for a page, `s.3` for a slide, empty before the first marker."""
    if mark is None:
        return ""
    return f"{'s' if mark.unit == 'slide' else 'p'}.{mark.number}"


def match_fields(mark: PageMark | None) -> dict[str, int]:
    """What a grep match of a paged document adds: `{"page": 3}` or `{"slide": 3}`."""
    return {} if mark is None else {mark.unit: mark.number}
