"""What one owner stores, in bytes: the one sum every quota decision and display uses.

Counted: every upload record of every thread of the owner (their files and the Markdown
companions conversion made, as recorded sizes), and the declared `Upload-Length` of their
unfinished, unexpired resumable uploads (the bytes those may still bring). Files an agent
writes to workspace/ and outputs/ are not counted: they come from the agent's sandbox,
not through the app's writes, so no write of the app could be refused for them.

Versions of uploads and the trash count too: they are the owner's bytes, kept on their
behalf. They are kept per thread and written under the thread's records lock (which bumps
its version), so `scope_bytes` sums them with the records and the kept sums cover them; a
write tells `Admission.check` what it added and freed (a replaced file kept as a version
frees nothing, a version thinning drops frees its bytes). Versions of outputs files are
the agent's, as outputs/ is, and not counted. Kept as one function on purpose
(`stored_bytes`): every check, the header and `/auth/me` follow it.

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
from collections.abc import Callable

from sqlalchemy import Select
from sqlalchemy import and_
from sqlalchemy import bindparam
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from deerflow_web.models import SINGLE_USER
from deerflow_web.models import Area
from deerflow_web.storage.database import file_versions
from deerflow_web.storage.database import record_versions
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import trashed_files
from deerflow_web.storage.database import uploads

CACHED_THREADS = 65536  # thread sums one process keeps (a few MiB at most)


def owner_scope_prefix(owner: str) -> str:
    """The start every records key of the owner's threads has (`ThreadPaths.scope`)."""
    return "threads/" if owner == SINGLE_USER else f"users/{owner}/threads/"


def _under(column: ColumnElement[str], dialect: str) -> ColumnElement[bool]:
    """`column` starts with the bound `prefix`, as a range (a prefix ends with "/", the
    bound `past` is it with "0", the next code point, in its place), compared byte by
    byte: SQLite's own order, which reads the primary key; on PostgreSQL the "C"
    collation, so the database's locale cannot reorder "/"."""
    if dialect == "postgresql":
        column = column.collate("C")  # type: ignore[assignment]
    return and_(column >= bindparam("prefix"), column < bindparam("past"))


# Built once with bound parameters: the check runs on every commit, and building and
# cache-keying a statement per call cost more than running it (as records.py found).
_DIALECTS = ("sqlite", "postgresql")


def _sum_where(
    condition: Callable[[ColumnElement[str]], ColumnElement[bool]],
) -> Select[tuple[int]]:
    """The bytes of current files, kept versions of uploads and the trash whose scope
    meets `condition`, as one row."""
    parts = (
        select(func.coalesce(func.sum(uploads.c.size), 0)).where(condition(uploads.c.scope)),
        select(func.coalesce(func.sum(file_versions.c.size), 0)).where(
            condition(file_versions.c.scope), file_versions.c.area == Area.UPLOADS.value
        ),
        select(func.coalesce(func.sum(trashed_files.c.size), 0)).where(
            condition(trashed_files.c.scope)
        ),
    )
    first, second, third = (part.scalar_subquery() for part in parts)
    return select(first + second + third)


_RECORDS_UNDER = {d: _sum_where(lambda scope, d=d: _under(scope, d)) for d in _DIALECTS}
_VERSIONS_UNDER = {
    d: select(record_versions.c.scope, record_versions.c.version).where(
        _under(record_versions.c.scope, d)
    )
    for d in _DIALECTS
}
_SCOPE_BYTES = _sum_where(lambda scope: scope == bindparam("scope"))
_SCOPE_VERSION = select(record_versions.c.version).where(
    record_versions.c.scope == bindparam("scope")
)
_UNFINISHED = (
    resumable_uploads.c.committed_name.is_(None),
    resumable_uploads.c.expires_at > bindparam("now"),
)
_PENDING_OF_USER = select(func.coalesce(func.sum(resumable_uploads.c.length), 0)).where(
    resumable_uploads.c.user_id == bindparam("owner"), *_UNFINISHED
)
_PENDING_SINGLE_USER = select(func.coalesce(func.sum(resumable_uploads.c.length), 0)).where(
    resumable_uploads.c.user_id.is_(None), *_UNFINISHED
)


def owner_range(owner: str) -> dict[str, str]:
    """The bound parameters of an owner's range of scopes (`_under`)."""
    prefix = owner_scope_prefix(owner)
    return {"prefix": prefix, "past": prefix[:-1] + "0"}


def owner_versions_query(dialect: str) -> Select[tuple[str, int]]:
    """The versions of an owner's threads, as (scope, version) rows, for `owner_range`."""
    return _VERSIONS_UNDER[dialect]


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
    """The bytes one thread holds for its owner: records, versions and trash (each read by
    its scope's index)."""
    return int(db.execute(_SCOPE_BYTES, {"scope": scope}).scalar_one())


def scope_version(db: Connection, scope: str) -> int | None:
    """The thread's records version as `db` sees it."""
    return db.execute(_SCOPE_VERSION, {"scope": scope}).scalar_one_or_none()


def pending_bytes(db: Connection, owner: str, now: float) -> int:
    """The declared lengths of the owner's unfinished, unexpired resumable uploads."""
    if owner == SINGLE_USER:
        return int(db.execute(_PENDING_SINGLE_USER, {"now": now}).scalar_one())
    return int(db.execute(_PENDING_OF_USER, {"owner": owner, "now": now}).scalar_one())


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
    dialect = db.dialect.name
    if sums is None:
        records = db.execute(_RECORDS_UNDER[dialect], owner_range(owner)).scalar_one()
        return int(records) + pending_bytes(db, owner, now)
    versions = db.execute(_VERSIONS_UNDER[dialect], owner_range(owner)).all()
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
