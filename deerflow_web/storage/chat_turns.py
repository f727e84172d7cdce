"""The chat preview's per-thread history of turns, in its own SQLite file.

Each server process (gunicorn runs several) serves preview requests, and the incremental
mode needs the previous turn's `shown_uploads`, so the history cannot live in memory. It
has its own database file, apart from the upload records: it is disposable tooling data,
and clearing it must never touch a record. Turns are stored as JSON documents, because
their shape is the preview service's business, not storage's.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Protocol

from deerflow_web.storage.sqlite import ThreadConnections

SCHEMA = """
CREATE TABLE IF NOT EXISTS preview_turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    created_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS preview_turns_scope ON preview_turns (scope, id);
"""

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


class SQLitePreviewHistory:
    """`PreviewHistory` in one SQLite file (WAL), opened on first use.

    The file appears only once somebody previews, so apps that never use the page leave
    no trace in the data dir.
    """

    def __init__(
        self,
        db_path: Path,
        *,
        max_turns: int = MAX_TURNS_PER_SCOPE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db_path = db_path
        self._max_turns = max_turns
        self._clock = clock
        self._connections = ThreadConnections(db_path, SCHEMA)  # no file until first used

    def _db(self) -> sqlite3.Connection:
        return self._connections.get()

    def append(self, scope: str, data: Mapping[str, Any]) -> StoredTurn:
        """Save a turn at the end of the scope's history; the oldest beyond the cap go."""
        created_at = self._clock()
        document = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            cursor = db.execute(
                "INSERT INTO preview_turns (scope, created_at, data) VALUES (?, ?, ?)",
                (scope, created_at, document),
            )
            turn_id = int(cursor.lastrowid or 0)
            db.execute(
                "DELETE FROM preview_turns WHERE scope = ? AND id NOT IN "
                "(SELECT id FROM preview_turns WHERE scope = ? ORDER BY id DESC LIMIT ?)",
                (scope, scope, self._max_turns),
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return StoredTurn(turn_id, created_at, json.loads(document))

    def turns(self, scope: str) -> list[StoredTurn]:
        """The scope's turns, oldest first."""
        rows = (
            self._db()
            .execute(
                "SELECT id, created_at, data FROM preview_turns WHERE scope = ? ORDER BY id",
                (scope,),
            )
            .fetchall()
        )
        return [StoredTurn(turn_id, created, json.loads(data)) for turn_id, created, data in rows]

    def clear(self, scope: str) -> int:
        """Forget the scope's turns; return how many there were."""
        cursor = self._db().execute("DELETE FROM preview_turns WHERE scope = ?", (scope,))
        return cursor.rowcount

    def close(self) -> None:
        """Close this thread's connection (tests open many stores)."""
        self._connections.close()
