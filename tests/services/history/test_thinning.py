"""Which versions thinning keeps (services/history/thinning.py), on one documented set.

`NOW` is a whole number of weeks after the epoch, so the hour, day and week slots start
at round offsets from it. The set, by age, each of 10 bytes:

| id | age           | slot                | kept with keep_last=1 |
|----|---------------|---------------------|-----------------------|
| a  | 1 min         | the last hour       | yes (the newest)      |
| b  | 10 min        | the last hour       | no: a holds the slot  |
| c  | 20 min        | the last hour       | no                    |
| d  | 1 h 30 min    | the hour before     | yes                   |
| e  | 1 h 40 min    | the hour before     | no: d is newer        |
| f  | 2 d 22 h      | three days back     | yes                   |
| g  | 2 d 23 h      | three days back     | no                    |
| h  | 40 d          | week 94             | yes                   |
| i  | 41 d          | week 94             | no                    |
| j  | 60 d          | week 91             | yes                   |
"""

from __future__ import annotations

import pytest

from deerflow_web.services.history.thinning import DAY
from deerflow_web.services.history.thinning import HOUR
from deerflow_web.services.history.thinning import WEEK
from deerflow_web.services.history.thinning import Aged
from deerflow_web.services.history.thinning import versions_to_keep

pytestmark = pytest.mark.same_in_both_modes  # pure arithmetic: no mode to read

NOW = 100 * WEEK
AGES = {
    "a": 60,
    "b": 600,
    "c": 1200,
    "d": 1.5 * HOUR,
    "e": 1 * HOUR + 40 * 60,
    "f": 3 * DAY - 2 * HOUR,
    "g": 3 * DAY - 1 * HOUR,
    "h": 40 * DAY,
    "i": 41 * DAY,
    "j": 60 * DAY,
}
SET = [Aged(name, NOW - age, 10) for name, age in AGES.items()]


def test_the_documented_set() -> None:
    assert versions_to_keep(SET, NOW, keep_last=1) == {"a", "d", "f", "h", "j"}


def test_the_last_n_are_always_kept() -> None:
    assert versions_to_keep(SET, NOW, keep_last=3) == {"a", "b", "c", "d", "f", "h", "j"}
    assert versions_to_keep(SET, NOW, keep_last=10) == set(AGES)
    assert versions_to_keep(SET, NOW, keep_last=0) == {"a", "d", "f", "h", "j"}


def test_the_order_given_does_not_matter() -> None:
    assert versions_to_keep(list(reversed(SET)), NOW, keep_last=1) == {"a", "d", "f", "h", "j"}


@pytest.mark.parametrize(
    ("budget", "kept"),
    [
        (None, {"a", "d", "f", "h", "j"}),
        (50, {"a", "d", "f", "h", "j"}),
        (35, {"a", "d", "f"}),  # the oldest go first
        (10, {"a"}),
        (5, set()),  # even the newest, when it alone is over the budget
        (0, set()),
    ],
)
def test_a_byte_budget_drops_the_oldest_first(budget: int | None, kept: set[str]) -> None:
    assert versions_to_keep(SET, NOW, keep_last=1, budget_bytes=budget) == kept


def test_slots_are_fixed_in_time_so_a_kept_version_stays_kept() -> None:
    # An hour later nothing new arrived: what was kept is still kept (d's slot is now
    # two hours back, and still its own).
    first = versions_to_keep(SET, NOW, keep_last=1)
    later = versions_to_keep([v for v in SET if v.version_id in first], NOW + HOUR, keep_last=1)
    assert later == first


def test_a_day_later_the_hours_fold_into_days() -> None:
    # a and d (hours 1 and 2 back) fall into the same day once both are a day old.
    kept = versions_to_keep(SET, NOW + DAY + 2 * HOUR, keep_last=0)
    assert "a" in kept and "d" not in kept


def test_nothing_to_thin() -> None:
    assert versions_to_keep([], NOW, keep_last=10) == set()
