"""How a person asked to see the uploads list: filter text, type, sort column and order.

Kept apart from the view so the same parsing serves links, forms and tests, and an odd
query string (a hand-edited URL) falls back to the defaults instead of failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import replace

from deerflow_web.services.files.kinds import FileKind
from deerflow_web.services.files.kinds import parse_kind
from deerflow_web.services.files.listing import SortKey

MAX_QUERY_LENGTH = 200


@dataclass(frozen=True)
class ListQuery:
    """The list's view state, as carried in the page's query string."""

    q: str = ""
    kind: FileKind | None = None  # the `type` query parameter
    sort: SortKey = SortKey.NAME
    order: str = "asc"
    page: int = 1
    view: str = "list"  # or "grid": thumbnails in cards

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> ListQuery:
        """Parse query parameters; unknown values mean the default."""
        return cls(
            q=(args.get("q") or "").strip()[:MAX_QUERY_LENGTH],
            kind=parse_kind(args.get("type")),
            sort=SortKey.parse(args.get("sort")),
            order="desc" if args.get("order") == "desc" else "asc",
            page=_page_number(args.get("page")),
            view="grid" if args.get("view") == "grid" else "list",
        )

    @classmethod
    def from_request(cls, args: Mapping[str, str], remembered: str | None) -> ListQuery:
        """Parse the query string; the sort, order and view it leaves out come from what the
        person chose last (`remembered()`'s text, from a cookie), so a reload keeps them."""
        merged = dict(args)
        if remembered and not any(key in args for key in REMEMBERED):
            for key, value in zip(
                REMEMBERED, remembered.split(".")[: len(REMEMBERED)], strict=False
            ):
                merged[key] = value
        return cls.from_args(merged)

    def remembered(self) -> str:
        """The choices kept across visits: sort, order and view."""
        return ".".join((self.sort.value, self.order, self.view))

    def choice_args(self) -> dict[str, str]:
        """`as_args` plus the sort, order and view even when they are the defaults: what a
        sort or view link carries, so choosing the default again is remembered too."""
        return {**self.as_args(), "sort": self.sort.value, "order": self.order, "view": self.view}

    def with_view(self, view: str) -> ListQuery:
        """The same list shown as a list or as a grid."""
        return replace(self, view=view)

    @property
    def descending(self) -> bool:
        """Whether the order is descending."""
        return self.order == "desc"

    def toggled(self, column: SortKey) -> ListQuery:
        """The query a column header links to: that column, flipping the order if current."""
        if column is self.sort:
            return replace(self, order="asc" if self.descending else "desc", page=1)
        return replace(self, sort=column, order="asc", page=1)

    def on_page(self, page: int) -> ListQuery:
        """The same view on another page (pager links)."""
        return replace(self, page=page)

    def as_args(self) -> dict[str, str]:
        """Query parameters that differ from the defaults (short, shareable URLs)."""
        defaults = asdict(ListQuery())
        return {
            _PARAMS.get(key, key): str(value)
            for key, value in asdict(self).items()
            if value != defaults[key] and value not in (None, "")
        }


_PARAMS = {"kind": "type"}
REMEMBERED = ("sort", "order", "view")


def _page_number(raw: str | None) -> int:
    """A positive page number; anything else is the first page."""
    try:
        return max(int(raw or 1), 1)
    except ValueError:
        return 1
