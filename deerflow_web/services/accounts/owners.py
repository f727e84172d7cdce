"""Who owns which thread (SPEC 7.4): thread ids are global, the first writer claims one.

The claim is a single insert against the primary key, so of two users writing to the same
new id at the same moment exactly one wins, in whichever server process; the other is told
the thread does not exist and nothing of theirs is written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import Engine
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from deerflow_web.errors import ThreadNotFound
from deerflow_web.storage.database import thread_owners
from deerflow_web.storage.database import write_transaction


class ThreadOwners:
    """The thread_owners table behind three questions: whose, claim, mine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def owner(self, thread_id: str) -> str | None:
        with self.engine.connect() as db:
            return db.execute(
                select(thread_owners.c.user_id).where(thread_owners.c.thread_id == thread_id)
            ).scalar_one_or_none()

    def check(self, thread_id: str, user_id: str) -> None:
        """Raise ThreadNotFound when another user owns the thread (unowned ids pass)."""
        owner = self.owner(thread_id)
        if owner is not None and owner != user_id:
            raise ThreadNotFound(thread_id)

    def claim(self, thread_id: str, user_id: str) -> None:
        """Make the thread the user's if nobody owns it; ThreadNotFound if someone else does."""
        owner = self.owner(thread_id)
        if owner == user_id:
            return
        if owner is None:
            try:
                with write_transaction(self.engine) as db:
                    db.execute(
                        insert(thread_owners).values(
                            thread_id=thread_id, user_id=user_id, created_at=time.time()
                        )
                    )
                return
            except IntegrityError:
                owner = self.owner(thread_id)  # lost the race: whoever won owns it now
        if owner != user_id:
            raise ThreadNotFound(thread_id)

    def owned(self, user_id: str) -> list[str]:
        """The user's thread ids, oldest claim first."""
        with self.engine.connect() as db:
            rows = db.execute(
                select(thread_owners.c.thread_id)
                .where(thread_owners.c.user_id == user_id)
                .order_by(thread_owners.c.created_at, thread_owners.c.thread_id)
            ).all()
        return [row[0] for row in rows]

    def owners_of(self, thread_ids: Iterable[str]) -> dict[str, str]:
        ids = list(thread_ids)
        if not ids:
            return {}
        with self.engine.connect() as db:
            rows = db.execute(
                select(thread_owners.c.thread_id, thread_owners.c.user_id).where(
                    thread_owners.c.thread_id.in_(ids)
                )
            ).all()
        return {row[0]: row[1] for row in rows}
