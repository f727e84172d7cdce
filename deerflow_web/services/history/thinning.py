"""Which versions of a file are kept: the last few, then fewer the older they get.

A pure function, so the rule can be read and tested on its own. The rule, after
Nextcloud's version expiry:

1. The newest `keep_last` versions are always kept (a burst of saves can be undone step
   by step).
2. Older ones are thinned by age (measured from `now`): of those younger than a day, one
   per clock hour; younger than 30 days, one per day (UTC); older, one per week (counted
   from the Unix epoch). In each of these slots the newest version is the one kept. The
   slots are fixed in time, not moving with `now`, so a version kept once as its hour's
   stays kept until its day or week holds a newer one.
3. With `budget_bytes`, the kept versions together never hold more bytes than that: the
   oldest are dropped first, the protected newest ones too if they alone are over it.
   (The budget is a share of the user's quota, `versions.max_quota_share`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
MONTH = 30 * DAY


@dataclass(frozen=True)
class Aged:
    """What thinning needs to know of a version."""

    version_id: str
    created_at: float
    size: int


def _slot(created_at: float, now: float) -> tuple[str, int]:
    age = now - created_at
    if age < DAY:
        return "hour", int(created_at // HOUR)
    if age < MONTH:
        return "day", int(created_at // DAY)
    return "week", int(created_at // WEEK)


def versions_to_keep(
    versions: Sequence[Aged],
    now: float,
    keep_last: int,
    budget_bytes: int | None = None,
) -> set[str]:
    """The ids of `versions` to keep by the rule above; the others may be removed."""
    newest_first = sorted(versions, key=lambda v: (v.created_at, v.version_id), reverse=True)
    kept: list[Aged] = list(newest_first[: max(keep_last, 0)])
    slots_taken: set[tuple[str, int]] = {_slot(v.created_at, now) for v in kept}
    for version in newest_first[max(keep_last, 0) :]:
        slot = _slot(version.created_at, now)
        if slot in slots_taken:
            continue
        slots_taken.add(slot)
        kept.append(version)
    if budget_bytes is not None:
        total = sum(v.size for v in kept)
        while kept and total > budget_bytes:
            total -= kept.pop().size  # `kept` runs newest to oldest
    return {v.version_id for v in kept}
