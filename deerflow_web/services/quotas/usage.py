"""What one owner stores, in bytes: the one sum every quota decision and display uses.

Counted: every upload record of every thread of the owner (their files and the Markdown
companions conversion made, as recorded sizes), and the declared `Upload-Length` of their
unfinished, unexpired resumable uploads (the bytes those may still bring). Files an agent
writes to workspace/ and outputs/ are not counted: they come from the agent's sandbox,
not through the app's writes, so no write of the app could be refused for them.

Kept as one function on purpose: another stored kind (file versions, a trash) adds its
own sum here and every check, the header and `/auth/me` follow.
"""

from __future__ import annotations

from sqlalchemy import and_
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from deerflow_web.models import SINGLE_USER
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import uploads


def owner_scope_prefix(owner: str) -> str:
    """The start every records key of the owner's threads has (`ThreadPaths.scope`)."""
    return "threads/" if owner == SINGLE_USER else f"users/{owner}/threads/"


def _scope_under(db: Connection, prefix: str) -> ColumnElement[bool]:
    """`scope` starts with `prefix`, as a range (the prefix ends with "/", the next code
    point is "0"), compared byte by byte: SQLite's own order, which reads the primary key;
    on PostgreSQL the "C" collation, so the database's locale cannot reorder "/"."""
    column = uploads.c.scope
    if db.dialect.name == "postgresql":
        column = column.collate("C")  # type: ignore[assignment]
    return and_(column >= prefix, column < prefix[:-1] + "0")


def stored_bytes(db: Connection, owner: str, now: float) -> int:
    """Every byte the owner stores or has declared, read on `db` (inside a write
    transaction: as that transaction sees it)."""
    records = db.execute(
        select(func.coalesce(func.sum(uploads.c.size), 0)).where(
            _scope_under(db, owner_scope_prefix(owner))
        )
    ).scalar_one()
    mine = (
        resumable_uploads.c.user_id.is_(None)
        if owner == SINGLE_USER
        else resumable_uploads.c.user_id == owner
    )
    pending = db.execute(
        select(func.coalesce(func.sum(resumable_uploads.c.length), 0)).where(
            mine,
            resumable_uploads.c.committed_name.is_(None),
            resumable_uploads.c.expires_at > now,
        )
    ).scalar_one()
    return int(records) + int(pending)
