"""Which stored files the agent, its tools and the converter may use, and why not.

While scanning is on, only a `clean` file is used; anything else (waiting for its first
scan, stored unscanned while the scanner was out, never scanned because it was stored
before scanning was turned on) is held back, with a reason the agent can pass on. While
scanning is off every file is used as before, except one a scan found infected.
"""

from __future__ import annotations

from collections.abc import Iterable

from deerflow_web.models import ScanState
from deerflow_web.models import UploadRecord

WAITING = "it is waiting for its virus scan"
UNSCANNED = "it could not be virus-scanned yet (the scanner was unavailable)"
INFECTED = "the virus scanner found a threat in it"


def withheld_reason(record: UploadRecord, scanning_on: bool) -> str | None:
    """Why the agent may not use the file, or None when it may."""
    state = record.scan_state
    if state is ScanState.INFECTED:
        return INFECTED
    if not scanning_on or state is ScanState.CLEAN:
        return None
    if state is ScanState.UNSCANNED:
        return UNSCANNED
    return WAITING


def split_usable(
    records: Iterable[UploadRecord], scanning_on: bool
) -> tuple[list[UploadRecord], dict[str, str]]:
    """The records the agent may use, and the others' names with the reason."""
    usable: list[UploadRecord] = []
    withheld: dict[str, str] = {}
    for record in records:
        reason = withheld_reason(record, scanning_on)
        if reason is None:
            usable.append(record)
        else:
            withheld[record.filename] = reason
    return usable, withheld
