"""Who may store how much, and the check that admits a write.

An owner's quota is the admin's override for their account when there is one, else
`quotas.default_bytes` (None: unlimited); the single-user mode has one owner and the same
rule. A write is admitted when, in the transaction that makes it, the owner's usage after
it is within the quota, or the write did not make the usage grow (a smaller replacement,
a finished resumable upload whose length was reserved: nobody is stopped from shrinking).
The owner's lock is taken first (`storage/quotas.py`), so two writers for one owner, on
any instances, read and check one after the other and cannot together go over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from deerflow_web.errors import InvalidQuota
from deerflow_web.errors import QuotaExceeded
from deerflow_web.models import SINGLE_USER
from deerflow_web.services.files.sizes import human_size
from deerflow_web.services.quotas.usage import ThreadSums
from deerflow_web.services.quotas.usage import scope_bytes
from deerflow_web.services.quotas.usage import scope_version
from deerflow_web.services.quotas.usage import stored_bytes
from deerflow_web.storage.quotas import QuotaOverrides
from deerflow_web.storage.quotas import lock_owner

# The largest quota accepted: 8 PiB, the largest whole number every JSON client reads
# exactly (2**53); more is certainly a mistake.
MAX_QUOTA_BYTES = 2**53


def parse_quota(value: object) -> int | None:
    """An admin's quota: a whole number of bytes (`1024.0` is one); 0 or None means
    unlimited (None back).

    Raises:
        InvalidQuota: Not a whole number (a string, a fraction, a boolean), negative, or
            over `MAX_QUOTA_BYTES`.
    """
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 1024.0 is the integer 1024 (JSON Schema agrees)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQuota(
            f"quota_bytes must be a whole number of bytes (0 or null: unlimited), not {value!r}"
        )
    if value < 0:
        raise InvalidQuota(f"quota_bytes cannot be negative: {value}")
    if value > MAX_QUOTA_BYTES:
        raise InvalidQuota(f"quota_bytes is too large: at most {MAX_QUOTA_BYTES} bytes (8 PiB)")
    return value or None


@dataclass(frozen=True)
class Usage:
    """What `/auth/me` and the page header show: bytes stored, and the quota (None:
    unlimited)."""

    bytes: int
    quota_bytes: int | None

    def as_dict(self) -> dict[str, int | None]:
        return {"bytes": self.bytes, "quota_bytes": self.quota_bytes}


def refusal(used: int, quota: int, needed: int) -> QuotaExceeded:
    """The 413's error, its sentence naming the quota and the usage."""
    return QuotaExceeded(
        f"Storage quota exceeded: {human_size(used)} of {human_size(quota)} used, "
        f"this upload needs {human_size(needed)}",
        used,
        quota,
        needed,
    )


class Admission:
    """One write's check, inside its transaction, under the owner's lock: `check` reads
    the usage once the write is in (uncommitted) and refuses what went over.

    `scope` is the thread whose records the transaction writes (None: none, a resumable
    upload's creation). Its sum before the write is the one kept for the version before
    the transaction's own bump, when there is one; the write's own change is then added
    to it, so a commit never sums its whole thread (and `committed` keeps the result).
    """

    def __init__(
        self,
        db: Connection,
        owner: str,
        quota: int,
        now: float,
        sums: ThreadSums,
        scope: str | None = None,
    ) -> None:
        self._db = db
        self._owner = owner
        self._now = now
        self._sums = sums
        self._scope = scope
        self.quota = quota
        lock_owner(db, owner)
        self._version: int | None = None
        self._before: int | None = None
        if scope is not None:
            # The transaction bumped the version once (`records.locked`), after the
            # version whose sum may be kept.
            self._version = scope_version(db, scope)
            if self._version is not None:
                self._before = sums.get(scope, self._version - 1)
        self._after: int | None = None

    def check(self, added: int, released: int = 0, reserved: int = 0) -> None:
        """Refuse (raise, so the transaction rolls back) when the usage is now over the
        quota and the write made it grow. The write `added` bytes to its thread's records
        and `released` others there (the files it replaced, their companions); `reserved`
        is the resumable upload's declared length it used up (not in the records).

        Raises:
            QuotaExceeded
        """
        own = None
        if self._scope is not None:
            if self._before is not None:
                mine = self._before + added - released
            else:
                mine = scope_bytes(self._db, self._scope)
            self._after = mine
            own = (self._scope, mine)
        after = stored_bytes(self._db, self._owner, self._now, sums=self._sums, own=own)
        grew = added - released - reserved
        if after > self.quota and grew > 0:
            raise refusal(after - grew, self.quota, added)

    def committed(self) -> None:
        """The transaction committed: keep the thread's sum for its new version."""
        if self._scope is not None and self._version is not None and self._after is not None:
            self._sums.put(self._scope, self._version, self._after)


class QuotaPolicy:
    """The quotas of every owner over the shared database."""

    def __init__(
        self,
        engine: Engine,
        default_bytes: int | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.default_bytes = default_bytes
        self.overrides = QuotaOverrides(engine)
        self.sums = ThreadSums()
        self._clock = clock

    def quota_on(self, db: Connection, owner: str) -> int | None:
        """The owner's quota in bytes, None when unlimited, read on `db`."""
        if owner != SINGLE_USER:
            has_own, own = QuotaOverrides.read(db, owner)
            if has_own:
                return own
        return self.default_bytes

    def quota_of(self, owner: str) -> int | None:
        """`quota_on` on a connection of its own."""
        with self.engine.connect() as db:
            return self.quota_on(db, owner)

    def usage(self, owner: str) -> Usage:
        """What the owner stores now, and their quota."""
        with self.engine.connect() as db:
            stored = stored_bytes(db, owner, self._clock(), sums=self.sums)
            quota = self.quota_on(db, owner)
            db.commit()  # end the read's transaction before the connection goes back
        return Usage(stored, quota)

    def admit(self, db: Connection, owner: str, scope: str | None = None) -> Admission | None:
        """Start admitting a write made in `db`'s (write) transaction, which writes the
        records of `scope` (if any): lock the owner; None when the owner has no quota
        (nothing locked, nothing read)."""
        quota = self.quota_on(db, owner)
        if quota is None:
            return None
        return Admission(db, owner, quota, self._clock(), self.sums, scope)

    def refuse_early(
        self, owner: str, needed: int, may_free: Callable[[], int] | None = None
    ) -> None:
        """Refuse a write that cannot fit even now (a request's declared length), before
        its bytes are read. Only a first answer for the clear cases: the commit checks
        exactly. `may_free` tells, when asked, how many stored bytes the write could
        replace (a same-name upload frees what it replaces).

        Raises:
            QuotaExceeded
        """
        if needed <= 0:
            return
        usage = self.usage(owner)
        quota = usage.quota_bytes
        if quota is None or usage.bytes + needed <= quota:
            return
        if may_free is not None and usage.bytes - may_free() + needed <= quota:
            return
        raise refusal(usage.bytes, quota, needed)
