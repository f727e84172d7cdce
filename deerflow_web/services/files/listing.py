"""The uploads list as a person sees it: grouped, marked, filtered and sorted.

The records stay the source of truth; this module only arranges them. A conversion
companion (`record.converted_from`) is shown under its original instead of as a stranger
in the list, and files with the same content (same SHA-256) are marked as duplicates, so a
person can spot a re-upload at a glance.
"""

from __future__ import annotations

import enum
import re
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from deerflow_web.models import ACTIVE_CONVERSION_STATES
from deerflow_web.models import UploadRecord
from deerflow_web.services.files.kinds import FileKind
from deerflow_web.services.files.kinds import file_kind
from deerflow_web.services.files.record_cache import RecordCache


class SortKey(enum.StrEnum):
    """The columns a list can be sorted by."""

    NAME = "name"
    SIZE = "size"
    TYPE = "type"
    UPLOADED = "uploaded"

    @classmethod
    def parse(cls, value: str | None) -> SortKey:
        """A sort key from a query string; anything unknown sorts by name."""
        try:
            return cls(value) if value else cls.NAME
        except ValueError:
            return cls.NAME


PAGE_SIZE = 100  # groups per page: a thread of 10,000 files renders one page at a time
CACHED_VIEWS = 16  # arranged lists (thread x filter x order) each process keeps


@dataclass(frozen=True)
class FileRow:
    """One file of the list with what the page marks on it."""

    record: UploadRecord
    kind: FileKind
    same_content_as: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        """The stored name (a shortcut the templates read often)."""
        return self.record.filename

    @property
    def conversion_pending(self) -> bool:
        """Whether a conversion of this file is waiting or running."""
        return self.record.conversion_state in ACTIVE_CONVERSION_STATES


@dataclass(frozen=True)
class FileGroup:
    """An original and the Markdown companions converted from it."""

    row: FileRow
    companions: tuple[FileRow, ...] = ()

    def rows(self) -> list[FileRow]:
        """The original first, then its companions."""
        return [self.row, *self.companions]


@dataclass(frozen=True)
class FileListing:
    """What the uploads tab shows, plus what it needs to say about the filter."""

    groups: list[FileGroup]
    total_count: int
    total_size: int
    kinds: list[FileKind] = field(default_factory=list)
    page: int = 1
    page_size: int = PAGE_SIZE
    pending: bool | None = None  # worked out once with the groups; None: look at them

    @property
    def page_count(self) -> int:
        """How many pages the matching groups fill (at least one)."""
        return max(1, -(-len(self.groups) // self.page_size))

    @property
    def page_groups(self) -> list[FileGroup]:
        """The groups shown on the current page."""
        start = (self.page - 1) * self.page_size
        return self.groups[start : start + self.page_size]

    @property
    def first_shown(self) -> int:
        """1-based position of the page's first group among the matching ones (0 if none)."""
        return (self.page - 1) * self.page_size + 1 if self.groups else 0

    @property
    def last_shown(self) -> int:
        """1-based position of the page's last group among the matching ones."""
        return min(self.page * self.page_size, len(self.groups))

    @property
    def shown_count(self) -> int:
        """How many files pass the filter (companions included)."""
        return sum(len(group.rows()) for group in self.groups)

    @property
    def any_pending(self) -> bool:
        """Whether a conversion is still queued or running (the page then polls)."""
        if self.pending is not None:
            return self.pending
        return any(row.conversion_pending for group in self.groups for row in group.rows())


_KIND_ORDER = {kind: index for index, kind in enumerate(FileKind)}

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str, str], ...]:
    """A name as people order it: digit runs by their value, so `bulk-2` comes before
    `bulk-10`, letters without regard to case (the exact spelling breaks ties)."""
    parts = []
    for index, part in enumerate(_DIGITS.split(name.casefold())):
        if index % 2:
            parts.append((0, int(part), part))  # "07" and "7": equal value, stable order
        elif part:
            parts.append((1, part, ""))
    return (*parts, (2, name, ""))


_SORT_KEYS: dict[SortKey, Callable[[FileRow], Any]] = {
    SortKey.NAME: lambda row: natural_key(row.filename),
    SortKey.SIZE: lambda row: (row.record.size, natural_key(row.filename)),
    SortKey.TYPE: lambda row: (
        _KIND_ORDER[row.kind],
        row.record.extension.lower(),
        natural_key(row.filename),
    ),
    SortKey.UPLOADED: lambda row: (row.record.uploaded_at, natural_key(row.filename)),
}


def _matches(group: FileGroup, query: str, kind: FileKind | None) -> bool:
    """A group shows when any of its files matches: a companion never hides its original."""
    needle = query.casefold()
    return any(
        needle in row.filename.casefold() and (kind is None or row.kind is kind)
        for row in group.rows()
    )


def _others(names: list[str], name: str) -> tuple[str, ...]:
    """The other files with the same content (almost always none)."""
    if len(names) == 1:
        return ()
    return tuple(other for other in names if other != name)


@dataclass(frozen=True)
class _View:
    """The records arranged for one filter and order, before paging."""

    groups: list[FileGroup]
    total_size: int
    kinds: list[FileKind]
    pending: bool


_views: RecordCache[_View] = RecordCache(CACHED_VIEWS)


def build_listing(
    records: Sequence[UploadRecord],
    *,
    query: str = "",
    kind: FileKind | None = None,
    sort: SortKey = SortKey.NAME,
    descending: bool = False,
    page: int = 1,
    page_size: int = PAGE_SIZE,
) -> FileListing:
    """Group companions under originals, mark duplicates, filter and sort the groups, and
    pick the page to show (a page past the end shows the last one).

    The arranged groups are kept per view (filter and order) while the records stay the
    same objects (see files/record_cache.py), so paging through 10,000 files sorts them once.
    """
    needle = query.strip()
    # the first record's identity tells threads apart; the cache checks them all anyway
    key = (id(records[0]) if records else 0, needle, kind, sort, descending)
    view = _views.get(key, records)
    if view is None:
        view = _arrange(records, needle, kind, sort, descending)
        _views.put(key, records, view)
    pages = max(1, -(-len(view.groups) // page_size))
    return FileListing(
        groups=view.groups,
        total_count=len(records),
        total_size=view.total_size,
        kinds=view.kinds,
        pending=view.pending,
        page=min(max(page, 1), pages),
        page_size=page_size,
    )


def _arrange(
    records: Sequence[UploadRecord],
    needle: str,
    kind: FileKind | None,
    sort: SortKey,
    descending: bool,
) -> _View:
    by_hash: dict[str, list[str]] = defaultdict(list)
    for record in records:
        by_hash[record.sha256].append(record.filename)
    rows = {
        record.filename: FileRow(
            record,
            file_kind(record.filename, record.content_type),
            _others(by_hash[record.sha256], record.filename),
        )
        for record in records
    }
    companions: dict[str, list[FileRow]] = defaultdict(list)
    for row in rows.values():
        original = row.record.converted_from
        if original is not None and original in rows and original != row.filename:
            companions[original].append(row)
    attached = {row.filename for group in companions.values() for row in group}
    by_name = _SORT_KEYS[SortKey.NAME]
    groups = [
        FileGroup(row, tuple(sorted(companions[name], key=by_name)) if name in companions else ())
        for name, row in rows.items()
        if name not in attached
    ]
    shown = (
        [group for group in groups if _matches(group, needle, kind)]
        if needle or kind is not None
        else groups
    )
    shown.sort(key=lambda group: _SORT_KEYS[sort](group.row), reverse=descending)
    return _View(
        groups=shown,
        total_size=sum(record.size for record in records),
        kinds=sorted({row.kind for row in rows.values()}, key=list(FileKind).index),
        pending=any(row.conversion_pending for group in shown for row in group.rows()),
    )
