"""Storage quotas in the shared database: one owner's writers admitted one at a time, and
an admin's per-account override (`user_quotas`).

A quota holds across instances only if the check and the write that it admits are one
step for everybody who writes for the same owner. On SQLite every write transaction holds
the database's write lock already. On PostgreSQL the records' lock is per thread
(`records.locked`), so two uploads to two threads of one owner would both read the usage
before either wrote; `lock_owner` queues them on a transaction-scoped advisory lock keyed
by the owner. Lock order, to never wait in a cycle: a thread's records lock (if any),
then the pending-uploads lock (`storage/resumable.py`, if any), then this one, which
nothing holds while it waits for another.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine
from sqlalchemy import bindparam
from sqlalchemy import delete
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from deerflow_web.storage.database import user_quotas
from deerflow_web.storage.database import write_transaction

# The first key of the owners' quota locks (PostgreSQL); 7001 queues resumable creations.
_QUOTA_LOCK_SPACE = 7002
_LOCK_OWNER = text("SELECT pg_advisory_xact_lock(:space, hashtext(:owner))")
_READ_OVERRIDE = select(user_quotas.c.quota_bytes).where(
    user_quotas.c.user_id == bindparam("user_id")
)


def lock_owner(db: Connection, owner: str) -> None:
    """Hold the owner's quota lock until `db`'s transaction ends (PostgreSQL; SQLite's
    write transaction is the lock already). `owner` is a user id, "" in the single-user
    layout."""
    if db.dialect.name == "postgresql":
        db.execute(_LOCK_OWNER, {"space": _QUOTA_LOCK_SPACE, "owner": owner})


class QuotaOverrides:
    """The admins' per-account quotas: absent (the default applies), a number of bytes,
    or unlimited (a row whose `quota_bytes` is NULL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @staticmethod
    def read(db: Connection, user_id: str) -> tuple[bool, int | None]:
        """(whether the account has an override, its bytes or None for unlimited)."""
        row = db.execute(_READ_OVERRIDE, {"user_id": user_id}).first()
        return (False, None) if row is None else (True, row[0])

    def get(self, user_id: str) -> tuple[bool, int | None]:
        """`read` on a connection of its own."""
        with self.engine.connect() as db:
            return self.read(db, user_id)

    def set(self, user_id: str, quota_bytes: int | None) -> None:
        """Give the account its own quota (None: unlimited)."""
        dialect_insert = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert
        statement = dialect_insert(user_quotas).values(
            user_id=user_id, quota_bytes=quota_bytes, updated_at=time.time()
        )
        statement = statement.on_conflict_do_update(
            index_elements=["user_id"],
            set_={"quota_bytes": statement.excluded.quota_bytes, "updated_at": time.time()},
        )
        with write_transaction(self.engine) as db:
            db.execute(statement)

    def clear(self, user_id: str) -> None:
        """Let the configured default apply to the account again."""
        with write_transaction(self.engine) as db:
            db.execute(delete(user_quotas).where(user_quotas.c.user_id == user_id))
