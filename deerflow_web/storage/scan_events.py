"""What the virus scanner kept out: refused uploads and quarantined files (`scan_events`).

The admin page lists them; a thread's owner sees the ones of their thread. A quarantined
file's bytes live under `{base}/quarantine/` until `purge_after`, outside every thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy import select

from deerflow_web.storage.database import scan_events
from deerflow_web.storage.database import write_transaction

REFUSED = "refused"
QUARANTINED = "quarantined"


@dataclass(frozen=True)
class ScanEvent:
    """One refused upload or quarantined file."""

    kind: str
    at: float
    user_id: str | None
    thread_id: str
    scope: str
    filename: str
    sha256: str | None
    size: int | None
    signature: str
    quarantine_path: str | None = None
    purge_after: float | None = None
    event_id: int | None = None


class ScanEvents:
    """The `scan_events` table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, event: ScanEvent) -> None:
        """Keep one event."""
        values = {
            "kind": event.kind,
            "at": event.at,
            "user_id": event.user_id,
            "thread_id": event.thread_id,
            "scope": event.scope,
            "filename": event.filename,
            "sha256": event.sha256,
            "size": event.size,
            "signature": event.signature,
            "quarantine_path": event.quarantine_path,
            "purge_after": event.purge_after,
        }
        with write_transaction(self.engine) as db:
            db.execute(insert(scan_events).values(values))

    def recent(self, limit: int = 200, scope: str | None = None) -> list[ScanEvent]:
        """The newest events first, all threads' or one thread's."""
        query = select(scan_events).order_by(scan_events.c.at.desc(), scan_events.c.id.desc())
        if scope is not None:
            query = query.where(scan_events.c.scope == scope)
        with self.engine.connect() as db:
            rows = db.execute(query.limit(limit)).mappings().all()
        return [_event(row) for row in rows]

    def expired_quarantine(self, now: float) -> list[ScanEvent]:
        """Quarantined files whose keeping time is over."""
        query = select(scan_events).where(
            scan_events.c.quarantine_path.is_not(None), scan_events.c.purge_after < now
        )
        with self.engine.connect() as db:
            rows = db.execute(query).mappings().all()
        return [_event(row) for row in rows]

    def forget_bytes(self, event_id: int) -> None:
        """The file of a quarantine event was deleted; the event itself stays listed."""
        with write_transaction(self.engine) as db:
            db.execute(
                scan_events.update()
                .where(scan_events.c.id == event_id)
                .values(quarantine_path=None, purge_after=None)
            )

    def clear(self) -> None:
        """Drop every event (tests)."""
        with write_transaction(self.engine) as db:
            db.execute(delete(scan_events))


def _event(row: object) -> ScanEvent:
    data = dict(row)  # type: ignore[call-overload]
    return ScanEvent(
        kind=data["kind"],
        at=data["at"],
        user_id=data["user_id"],
        thread_id=data["thread_id"],
        scope=data["scope"],
        filename=data["filename"],
        sha256=data["sha256"],
        size=data["size"],
        signature=data["signature"],
        quarantine_path=data["quarantine_path"],
        purge_after=data["purge_after"],
        event_id=data["id"],
    )
