"""Share links: one file of a thread (or a selection) handed to someone without an account.

The owner picks the files, how long the link lives (an hour to thirty days) and, if they
like, a password; the link can be revoked at any time and is listed on the thread's page.
The link's secret is shown once, in the URL, and only its SHA-256 is stored, so a copy of
the database opens nothing. An expired, revoked or unknown link answers exactly alike
(`ShareLinkNotFound`), so a visitor learns nothing about which it is. A password is kept as
an argon2id hash (the accounts' own hasher).

Opening links is rate limited per address, in the database (as login lockouts are), so the
limit holds across every worker: `OPEN_LIMIT` opens in `WINDOW_SECONDS`, and fewer wrong
passwords (`PASSWORD_LIMIT`), after which the address waits for the window to pass.

What a link serves is resolved when it is opened, as the owner's own download would be
(the upload service's `resolve_artifact` for the link's `thread`), so a
file deleted since is gone from the link too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy import and_
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import update

from deerflow_web.errors import InvalidInput
from deerflow_web.errors import ShareLinkNotFound
from deerflow_web.errors import ShareLinkRateLimited
from deerflow_web.models import ThreadRef
from deerflow_web.services.accounts.passwords import Passwords
from deerflow_web.storage.database import share_link_hits
from deerflow_web.storage.database import share_links
from deerflow_web.storage.database import write_transaction

MIN_HOURS = 1
MAX_HOURS = 30 * 24
MAX_PATHS = 1000
MAX_PASSWORD_LENGTH = 256
WINDOW_SECONDS = 300
OPEN_LIMIT = 120  # requests to links (pages and files) per address per window
PASSWORD_LIMIT = 10  # wrong passwords per address per window


@dataclass(frozen=True)
class ShareLink:
    """A link as its owner sees it (never with its secret, which only the URL holds)."""

    id: str  # noqa: A003 - the link's name on its owner's pages
    thread: ThreadRef  # whose thread: the owner's, as their own requests reach it
    paths: tuple[str, ...]  # user-data paths: `uploads/a.txt`
    has_password: bool
    created_at: float
    expires_at: float
    revoked_at: float | None

    def live(self, now: float) -> bool:
        return self.revoked_at is None and now < self.expires_at


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _link(row: object) -> ShareLink:
    return ShareLink(
        id=row.id,  # type: ignore[attr-defined]
        thread=ThreadRef(row.thread_id, row.user_id),  # type: ignore[attr-defined]
        paths=tuple(json.loads(row.paths)),  # type: ignore[attr-defined]
        has_password=row.password_hash is not None,  # type: ignore[attr-defined]
        created_at=row.created_at,  # type: ignore[attr-defined]
        expires_at=row.expires_at,  # type: ignore[attr-defined]
        revoked_at=row.revoked_at,  # type: ignore[attr-defined]
    )


def parse_hours(raw: object) -> int:
    """The lifetime a form or a request asked for, in whole hours.

    Raises:
        InvalidInput: Not a whole number from an hour to thirty days.
    """
    try:
        hours = int(str(raw).strip())
    except ValueError:
        hours = 0
    if not MIN_HOURS <= hours <= MAX_HOURS:
        raise InvalidInput(
            f"A share link lives from {MIN_HOURS} hour to {MAX_HOURS // 24} days.",
            ("form", "hours"),
            raw,
        )
    return hours


class ShareLinks:
    """Create, list, revoke and open share links over the shared database."""

    def __init__(
        self,
        engine: Engine,
        *,
        passwords: Passwords | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._passwords = passwords or Passwords()
        self._clock = clock

    def now(self) -> float:
        """The service's clock (links expire by it)."""
        return self._clock()

    # -- the owner's side -----------------------------------------------------------------

    def create(
        self,
        thread: ThreadRef,
        paths: list[str],
        *,
        hours: int,
        password: str | None = None,
    ) -> tuple[ShareLink, str]:
        """A new link and its secret (shown once: only its hash is kept).

        Raises:
            InvalidInput: No path, too many, or a password too long.
        """
        cleaned = list(dict.fromkeys(path.strip("/") for path in paths if path.strip("/")))
        if not cleaned:
            raise InvalidInput("Select at least one file to share.", ("form", "paths"))
        if len(cleaned) > MAX_PATHS:
            raise InvalidInput(
                f"At most {MAX_PATHS} files can be shared in one link.", ("form", "paths")
            )
        if password is not None and len(password) > MAX_PASSWORD_LENGTH:
            raise InvalidInput("The password is too long.", ("form", "password"))
        token = secrets.token_urlsafe(24)
        now = self._clock()
        row = {
            "id": secrets.token_hex(8),
            "token_hash": _digest(token),
            "user_id": thread.user_id,
            "thread_id": thread.thread_id,
            "paths": json.dumps(cleaned, ensure_ascii=False),
            "password_hash": self._passwords.hash(password) if password else None,
            "created_at": now,
            "expires_at": now + hours * 3600,
            "revoked_at": None,
        }
        with write_transaction(self._engine) as db:
            db.execute(insert(share_links).values(**row))
        return _link(_Row(row)), token

    def list_for_thread(self, thread: ThreadRef) -> list[ShareLink]:
        """The thread's links, newest first; ended ones only for a day after they ended, so
        the owner sees that a link stopped working without the list growing for ever."""
        since = self._clock() - 86400
        with self._engine.connect() as db:
            rows = db.execute(
                select(share_links)
                .where(
                    share_links.c.user_id == thread.user_id,
                    share_links.c.thread_id == thread.thread_id,
                    share_links.c.expires_at > since,
                    (share_links.c.revoked_at.is_(None)) | (share_links.c.revoked_at > since),
                )
                .order_by(share_links.c.created_at.desc())
            ).all()
        return [_link(row) for row in rows]

    def revoke(self, thread: ThreadRef, link_id: str) -> None:
        """End a link now (revoking one already ended changes nothing).

        Raises:
            ShareLinkNotFound: The caller has no such link on this thread.
        """
        with write_transaction(self._engine) as db:
            found = db.execute(
                update(share_links)
                .where(
                    share_links.c.id == link_id,
                    share_links.c.user_id == thread.user_id,
                    share_links.c.thread_id == thread.thread_id,
                )
                .values(revoked_at=func.coalesce(share_links.c.revoked_at, self._clock()))
            )
        if found.rowcount == 0:
            raise ShareLinkNotFound()

    def forget_thread(self, thread: ThreadRef) -> None:
        """Drop a deleted thread's links (a new thread of the same id shares nothing)."""
        with write_transaction(self._engine) as db:
            db.execute(
                delete(share_links).where(
                    share_links.c.user_id == thread.user_id,
                    share_links.c.thread_id == thread.thread_id,
                )
            )

    # -- the visitor's side ---------------------------------------------------------------

    def open(self, token: str, address: str) -> ShareLink:
        """The live link of that secret, counted against the address's rate limit.

        Raises:
            ShareLinkRateLimited: The address made too many requests lately.
            ShareLinkNotFound: Unknown, expired or revoked.
        """
        self._count(address, "open", OPEN_LIMIT)
        return self._live(token)

    def check_password(self, link_id: str, password: str, address: str) -> bool:
        """Whether `password` opens the link; a wrong one counts against the address.

        Raises:
            ShareLinkRateLimited: Too many wrong passwords from the address lately.
        """
        self._refuse_if_over(address, "password", PASSWORD_LIMIT)
        with self._engine.connect() as db:
            stored = db.execute(
                select(share_links.c.password_hash).where(share_links.c.id == link_id)
            ).scalar_one_or_none()
        if stored is None:
            return True
        if self._passwords.verify(stored, password[:MAX_PASSWORD_LENGTH]):
            return True
        self._record(address, "password")
        return False

    def unlock_proof(self, link_id: str, key: str) -> str:
        """What the visitor's cookie holds once the password was right: an HMAC of the link
        and its password hash, so changing nothing but a new link or hash invalidates it."""
        with self._engine.connect() as db:
            stored = db.execute(
                select(share_links.c.password_hash).where(share_links.c.id == link_id)
            ).scalar_one_or_none()
        message = f"{link_id}:{stored or ''}".encode()
        return hmac.new(key.encode("utf-8"), message, hashlib.sha256).hexdigest()

    def _live(self, token: str) -> ShareLink:
        now = self._clock()
        with self._engine.connect() as db:
            row = db.execute(
                select(share_links).where(
                    and_(
                        share_links.c.token_hash == _digest(token),
                        share_links.c.revoked_at.is_(None),
                        share_links.c.expires_at > now,
                    )
                )
            ).one_or_none()
        if row is None:
            raise ShareLinkNotFound()
        return _link(row)

    # -- rate limit -----------------------------------------------------------------------

    def _retry_after(self, db: object, kind: str, subject: str, limit: int) -> int | None:
        since = self._clock() - WINDOW_SECONDS
        times = (
            db.execute(  # type: ignore[attr-defined]
                select(share_link_hits.c.at)
                .where(
                    share_link_hits.c.kind == kind,
                    share_link_hits.c.subject == subject,
                    share_link_hits.c.at > since,
                )
                .order_by(share_link_hits.c.at.desc())
                .limit(limit)
            )
            .scalars()
            .all()
        )
        if len(times) < limit:
            return None
        return max(1, int(times[-1] + WINDOW_SECONDS - self._clock()) + 1)

    def _refuse_if_over(self, address: str, kind: str, limit: int) -> None:
        with self._engine.connect() as db:
            wait = self._retry_after(db, kind, address, limit)
        if wait is not None:
            raise ShareLinkRateLimited(wait)

    def _count(self, address: str, kind: str, limit: int) -> None:
        with write_transaction(self._engine) as db:
            wait = self._retry_after(db, kind, address, limit)
            if wait is not None:
                raise ShareLinkRateLimited(wait)
            now = self._clock()
            db.execute(insert(share_link_hits).values(kind=kind, subject=address, at=now))
            db.execute(delete(share_link_hits).where(share_link_hits.c.at < now - WINDOW_SECONDS))

    def _record(self, address: str, kind: str) -> None:
        with write_transaction(self._engine) as db:
            db.execute(insert(share_link_hits).values(kind=kind, subject=address, at=self._clock()))


class _Row:
    """A freshly inserted row read back as the database would return it."""

    def __init__(self, values: dict[str, object]) -> None:
        self.__dict__.update(values)
