"""Human-readable byte sizes, in the one format every page and script uses (SPEC 2.7).

`static/common.js` formats sizes the same way in the browser; both round halves up (as
JavaScript's `toFixed` does on these exact binary fractions) so a size never reads
differently in a message than in the list.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP
from decimal import Decimal

_UNITS = ("KiB", "MiB", "GiB")


def human_size(size: int) -> str:
    """`1023` → `1023 B`, `1536` → `1.5 KiB`, `2048` → `2 KiB`; GiB is the largest unit."""
    if size < 1024:
        return f"{size} B"
    value = Decimal(size) / 1024
    index = 0
    while value >= 1024 and index < len(_UNITS) - 1:
        value /= 1024
        index += 1
    text = str(value.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))
    return f"{text.removesuffix('.0')} {_UNITS[index]}"
