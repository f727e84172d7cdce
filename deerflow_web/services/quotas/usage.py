"""What one owner stores, in bytes: the one sum every quota decision and display uses.

Counted: every upload record of every thread of the owner (their files and the Markdown
companions conversion made, as recorded sizes), and the declared `Upload-Length` of their
unfinished, unexpired resumable uploads (the bytes those may still bring). Files an agent
writes to workspace/ and outputs/ are not counted: they come from the agent's sandbox,
not through the app's writes, so no write of the app could be refused for them.

Kept as one function on purpose (`stored_bytes`): another stored kind (file versions, a
trash) adds its own sum here and every check, the header and `/auth/me` follow. A kind kept
per thread and written under the thread's records lock (which bumps its version) belongs
in `scope_bytes`, so the kept sums cover it; its writes then tell `Admission.check` what
they added and freed (a replaced file kept as a version frees nothing).

A commit checks the quota, so the sum is on the upload path. Summed from the records each
time, it grew with everything the owner stores (10,000 files: 1.3x the latency of a small
upload, bench/bench_quotas.py). So each thread's sum is kept per process, keyed by the
thread's `record_versions` version, which every write to its records bumps in its own
transaction (storage/records.py): a sum is reused only while its thread's version is the
one it was read at, whichever process or instance wrote last. The owner's total is then
one read of their threads' versions and a sum per thread that changed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sqlalchemy import and_
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from deerflow_web.models import SINGLE_USER
from deerflow_web.storage.database import record_versions
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import uploads

CACHED_THREADS = 65536  # thread sums one process keeps (a few MiB at most)


def owner_scope_prefix(owner: str) -> str:
    """The start every records key of the owner's threads has (`ThreadPaths.scope`)."""
    return "threads/" if owner == SINGLE_USER else f"users/{owner}/threads/"


def _under(db: Connection, column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
    """`column` starts with `prefix`, as a range (the prefix ends with "/", the next code
    point is "0"), compared byte by byte: SQLite's own order, which reads the primary key;
    on PostgreSQL the "C" collation, so the database's locale cannot reorder "/"."""
    if db.dialect.name == "postgresql":
        column = column.collate("C")  # type: ignore[assignment]
    return and_(column >= prefix, column < prefix[:-1] + "0")


class ThreadSums:
    """Each thread's recorded bytes as last read, by (scope, version); per process."""

    def __init__(self, size: int = CACHED_THREADS) -> None:
        self._sums: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, scope: str, version: int) -> int | None:
        with self._lock:
            hit = self._sums.get(scope)
            if hit is None or hit[0] != version:
                return None
            self._sums.move_to_end(scope)
            return hit[1]

    def put(self, scope: str, version: int, total: int) -> None:
        with self._lock:
            self._sums[scope] = (version, total)
            self._sums.move_to_end(scope)
            while len(self._sums) > self._size:
                self._sums.popitem(last=False)


def scope_bytes(db: Connection, scope: str) -> int:
    """The recorded bytes of one thread (read by its primary key)."""
    total = db.execute(
        select(func.coalesce(func.sum(uploads.c.size), 0)).where(uploads.c.scope == scope)
    ).scalar_one()
    return int(total)


def scope_version(db: Connection, scope: str) -> int | None:
    """The thread's records version as `db` sees it."""
    return db.execute(
        select(record_versions.c.version).where(record_versions.c.scope == scope)
    ).scalar_one_or_none()


def pending_bytes(db: Connection, owner: str, now: float) -> int:
    """The declared lengths of the owner's unfinished, unexpired resumable uploads."""
    mine = (
        resumable_uploads.c.user_id.is_(None)
        if owner == SINGLE_USER
        else resumable_uploads.c.user_id == owner
    )
    total = db.execute(
        select(func.coalesce(func.sum(resumable_uploads.c.length), 0)).where(
            mine,
            resumable_uploads.c.committed_name.is_(None),
            resumable_uploads.c.expires_at > now,
        )
    ).scalar_one()
    return int(total)


def stored_bytes(
    db: Connection,
    owner: str,
    now: float,
    *,
    sums: ThreadSums | None = None,
    own: tuple[str, int] | None = None,
) -> int:
    """Every byte the owner stores or has declared, read on `db` (inside a write
    transaction: as that transaction sees it).

    With `sums`, each thread's sum is reused while its version holds, and stored when
    read afresh. `own` is (scope, bytes) of a thread the caller's transaction is writing:
    its total is the caller's, and its uncommitted sum is never stored.
    """
    if sums is None:
        records = db.execute(
            select(func.coalesce(func.sum(uploads.c.size), 0)).where(
                _under(db, uploads.c.scope, owner_scope_prefix(owner))
            )
        ).scalar_one()
        return int(records) + pending_bytes(db, owner, now)
    versions = db.execute(
        select(record_versions.c.scope, record_versions.c.version).where(
            _under(db, record_versions.c.scope, owner_scope_prefix(owner))
        )
    ).all()
    total = 0
    for scope, version in versions:
        if own is not None and scope == own[0]:
            continue
        known = sums.get(scope, version)
        if known is None:
            # Read after its version: a write landing in between makes the stored pair
            # look older than it is (a later read sums it again), never newer.
            known = scope_bytes(db, scope)
            sums.put(scope, version, known)
        total += known
    if own is not None:
        total += own[1]
    return total + pending_bytes(db, owner, now)
