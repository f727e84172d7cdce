"""Telling of what the scanner refused: a log line and a `scan_events` row for each.

The log line carries the user, the thread, the name and the SHA-256, so an operator can
find the event without the database; the row feeds the admin page.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Iterable

from deerflow_web.storage.scan_events import QUARANTINED
from deerflow_web.storage.scan_events import REFUSED
from deerflow_web.storage.scan_events import ScanEvent
from deerflow_web.storage.scan_events import ScanEvents

logger = logging.getLogger(__name__)


class RefusalLog:
    """Records refused uploads."""

    def __init__(self, events: ScanEvents, *, clock: Callable[[], float] = time.time) -> None:
        self.events = events
        self._clock = clock

    def refused(
        self,
        *,
        user_id: str | None,
        thread_id: str,
        scope: str,
        refusals: Iterable[tuple[str, str | None, int | None, str]],
    ) -> None:
        """Log and keep each (filename, sha256, size, signature) refused in one request."""
        for filename, sha256, size, signature in refusals:
            logger.warning(
                "refused infected upload: user=%s thread=%s name=%r sha256=%s signature=%s",
                user_id or "-",
                thread_id,
                filename,
                sha256,
                signature,
            )
            self.events.add(
                ScanEvent(
                    REFUSED,
                    self._clock(),
                    user_id,
                    thread_id,
                    scope,
                    filename,
                    sha256,
                    size,
                    signature,
                )
            )


def quarantined_in(events: ScanEvents, scope: str, limit: int = 50) -> list[ScanEvent]:
    """The files of one thread a rescan found infected and took away, newest first."""
    return [event for event in events.recent(limit, scope) if event.kind == QUARANTINED]


def refusals_and_quarantine(events: ScanEvents, limit: int = 200) -> list[ScanEvent]:
    """Everything the scanner kept out, newest first (the admin page)."""
    return events.recent(limit)
