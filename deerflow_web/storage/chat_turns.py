"""The chat preview's per-thread history of turns, in the shared database.

Each server process (and instance) serves preview requests, and the incremental mode needs
the previous turn's `shown_uploads`, so the history cannot live in memory. It has its own
table, apart from the upload records: it is disposable tooling data, and clearing it must
never touch a record. Turns are stored as JSON documents, because their shape is the
preview service's business, not storage's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy import select

from deerflow_web.storage.database import preview_turns
from deerflow_web.storage.database import write_transaction

MAX_TURNS_PER_SCOPE = 100  # older turns are dropped: a preview history, not an archive


@dataclass(frozen=True)
class StoredTurn:
    """One saved turn: its id (increasing per database), when it was made, its document."""

    turn_id: int
    created_at: float
    data: dict[str, Any]


class PreviewHistory(Protocol):
    """Append-only turns per thread scope, readable in order, clearable."""

    def append(self, scope: str, data: Mapping[str, Any]) -> StoredTurn: ...
    def turns(self, scope: str) -> list[StoredTurn]: ...
    def clear(self, scope: str) -> int: ...


class DatabasePreviewHistory:
    """`PreviewHistory` in the shared database's `preview_turns` table."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_turns: int = MAX_TURNS_PER_SCOPE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self._max_turns = max_turns
        self._clock = clock

    def append(self, scope: str, data: Mapping[str, Any]) -> StoredTurn:
        """Save a turn at the end of the scope's history; the oldest beyond the cap go."""
        created_at = self._clock()
        document = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        with write_transaction(self.engine) as db:
            turn_id = db.execute(
                insert(preview_turns)
                .values(scope=scope, created_at=created_at, data=document)
                .returning(preview_turns.c.id)
            ).scalar_one()
            keep = (
                select(preview_turns.c.id)
                .where(preview_turns.c.scope == scope)
                .order_by(preview_turns.c.id.desc())
                .limit(self._max_turns)
            )
            db.execute(
                delete(preview_turns).where(
                    preview_turns.c.scope == scope,
                    preview_turns.c.id.not_in(keep.scalar_subquery()),
                )
            )
        return StoredTurn(int(turn_id), created_at, json.loads(document))

    def turns(self, scope: str) -> list[StoredTurn]:
        """The scope's turns, oldest first."""
        with self.engine.connect() as db:
            rows = db.execute(
                select(preview_turns.c.id, preview_turns.c.created_at, preview_turns.c.data)
                .where(preview_turns.c.scope == scope)
                .order_by(preview_turns.c.id)
            ).all()
        return [StoredTurn(turn_id, created, json.loads(data)) for turn_id, created, data in rows]

    def clear(self, scope: str) -> int:
        """Forget the scope's turns; return how many there were."""
        with write_transaction(self.engine) as db:
            result = db.execute(delete(preview_turns).where(preview_turns.c.scope == scope))
        return result.rowcount

    def close(self) -> None:
        """Nothing to release: the engine belongs to whoever made it."""
