"""Resumable uploads in progress (tus, SPEC 8): their state in the records database, their
bytes in a staging file of the thread's uploads folder.

Any server process may take the next request of an upload, so nothing about it lives in
one process's memory: the offset, length, metadata, owner and expiry are rows of the
shared database (`resumable_uploads`), and the one writer at a time is whoever holds the
staging file's `flock` (released by the kernel when a killed process goes away, so a dead
request never blocks the upload for good).

On the S3 backend instances share no disk: the bytes go to the bucket as the parts of one
multipart upload, whose id and parts (`resumable_parts`) are rows here too, with the
object holding the bytes after the last full part (the tail). The one writer is whoever
holds the row's lease (`take_lease`: a compare-and-set UPDATE with an expiry, so a killed
writer blocks the upload for `uploads.resumable_lease_seconds` at most).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy import update
from sqlalchemy.engine import Connection

from deerflow_web.errors import PendingUploadsCap
from deerflow_web.models import ResumableUpload
from deerflow_web.storage.database import insert_missing_threads
from deerflow_web.storage.database import resumable_parts
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import write_transaction
from deerflow_web.storage.paths import storage_modes

# The first key of the advisory locks that queue one user's creations (PostgreSQL); the
# records' locks use the one-key form, a space of their own.
_PENDING_LOCK_SPACE = 7001
STAGING_PREFIX = ".upload-tus-"
STAGING_SUFFIX = ".part"

_COLUMNS = tuple(
    resumable_uploads.c[name]
    for name in (
        "upload_id",
        "thread_id",
        "user_id",
        "filename",
        "on_conflict",
        "metadata",
        "length",
        "upload_offset",
        "pending_from",
        "created_at",
        "expires_at",
        "staging_path",
        "committed_name",
    )
)


@dataclass(frozen=True)
class SentPart:
    """One part of an upload's S3 multipart upload, as S3 confirmed it."""

    number: int
    etag: str
    checksum_sha256: str  # base64, as S3 checks it
    size: int


@dataclass(frozen=True)
class S3Progress:
    """Where an upload's bytes stand in the bucket: the parts sent to `s3_upload_id`, then
    the tail object (None: no tail). With `sha256` set they are the thread's blob of it."""

    s3_upload_id: str | None
    parts: tuple[SentPart, ...]
    tail_key: str | None
    sha256: str | None

    @property
    def parts_size(self) -> int:
        return sum(part.size for part in self.parts)


def staging_name(upload_id: str) -> str:
    """The staging file of an upload: hidden, never listed, shaped like every staging file."""
    return f"{STAGING_PREFIX}{upload_id}{STAGING_SUFFIX}"


@dataclass(frozen=True)
class PendingCaps:
    """How many unfinished uploads one user may hold, and their declared bytes in all
    (None: no cap)."""

    count: int | None
    total_bytes: int | None


class WriteCheck(Protocol):
    """One write's quota check, made once the write is in its transaction."""

    def check(self, added: int, released: int = 0, reserved: int = 0) -> None: ...


class QuotaGate(Protocol):
    """Admits writes against owners' quotas (services/quotas/policy.py)."""

    def admit(self, db: Connection, owner: str) -> WriteCheck | None: ...


class ResumableStore(Protocol):
    """Where the state of unfinished resumable uploads lives; shared by every process."""

    def add(
        self,
        upload: ResumableUpload,
        caps: PendingCaps | None = None,
        quotas: QuotaGate | None = None,
        thread_row: bool = False,
    ) -> None: ...
    def get(self, upload_id: str) -> ResumableUpload | None: ...
    def update(
        self,
        upload_id: str,
        *,
        offset: int,
        pending_from: int | None,
        expires_at: float | None = None,
    ) -> None: ...
    def remove(self, upload_id: str, *, only_pending: bool = False) -> None: ...
    def mark_committed(self, upload_id: str, name: str, within: Connection) -> None: ...
    def expired(self, now: float) -> list[ResumableUpload]: ...
    def has_staging(self, path: Path) -> bool: ...


def _to_upload(row: tuple) -> ResumableUpload:
    (
        upload_id,
        thread_id,
        user_id,
        filename,
        on_conflict,
        metadata,
        length,
        offset,
        pending_from,
        created_at,
        expires_at,
        staging_path,
        committed_name,
    ) = row
    return ResumableUpload(
        upload_id=upload_id,
        thread_id=thread_id,
        user_id=user_id,
        filename=filename,
        on_conflict=on_conflict,
        metadata=metadata,
        length=length,
        offset=offset,
        pending_from=pending_from,
        created_at=created_at,
        expires_at=expires_at,
        staging_path=Path(staging_path),
        committed_name=committed_name,
    )


class DatabaseResumableStore:
    """`ResumableStore` in the shared database's `resumable_uploads` table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(
        self,
        upload: ResumableUpload,
        caps: PendingCaps | None = None,
        quotas: QuotaGate | None = None,
        thread_row: bool = False,
    ) -> None:
        """Record a new upload, unless its user's unfinished ones would go over `caps`,
        or its declared length would take its owner over their storage quota. With
        `thread_row`, the thread's row is made with it if it has none (the S3 backend,
        where no instance's folder marks a thread).

        The count and the insert are one write transaction, and each user's creations
        queue on one lock (SQLite: the write lock; PostgreSQL: an advisory lock keyed by
        the user), so creations racing on several processes or instances cannot all slip
        under a cap; the quota's check is made in the same transaction, under the owner's
        quota lock, once the row (the reservation of `Upload-Length`) is in.

        Raises:
            PendingUploadsCap: Over the count or the declared bytes.
            QuotaExceeded: Over the owner's quota; nothing is recorded.
        """
        values: dict[str, Any] = {
            "upload_id": upload.upload_id,
            "thread_id": upload.thread_id,
            "user_id": upload.user_id,
            "filename": upload.filename,
            "on_conflict": upload.on_conflict,
            "metadata": upload.metadata,
            "length": upload.length,
            "upload_offset": upload.offset,
            "pending_from": upload.pending_from,
            "created_at": upload.created_at,
            "expires_at": upload.expires_at,
            "staging_path": str(upload.staging_path),
        }
        with write_transaction(self.engine) as db:
            if caps is not None:
                self._check_caps(db, upload, caps)
            admission = quotas.admit(db, upload.ref.user_id) if quotas is not None else None
            db.execute(insert(resumable_uploads).values(values))
            if thread_row:
                now = upload.created_at
                row = {"user_id": upload.ref.user_id, "thread_id": upload.thread_id}
                row.update(title=None, metadata="{}", created_at=now, updated_at=now)
                insert_missing_threads(db, [row])
            if admission is not None:
                admission.check(upload.length)

    @staticmethod
    def _check_caps(db: Connection, upload: ResumableUpload, caps: PendingCaps) -> None:
        user = upload.user_id
        if db.dialect.name == "postgresql":
            db.execute(
                text("SELECT pg_advisory_xact_lock(:space, hashtext(:user))"),
                {"space": _PENDING_LOCK_SPACE, "user": user or ""},
            )
        mine = (
            resumable_uploads.c.user_id.is_(None)
            if user is None
            else resumable_uploads.c.user_id == user
        )
        count, total = db.execute(
            select(func.count(), func.coalesce(func.sum(resumable_uploads.c.length), 0)).where(
                mine,
                resumable_uploads.c.committed_name.is_(None),
                resumable_uploads.c.expires_at > upload.created_at,
            )
        ).one()
        if caps.count is not None and count + 1 > caps.count:
            raise PendingUploadsCap(
                "resumable_max_pending", caps.count, f"{count} are open already"
            )
        if caps.total_bytes is not None and total + upload.length > caps.total_bytes:
            raise PendingUploadsCap(
                "resumable_max_pending_bytes",
                caps.total_bytes,
                f"{total + upload.length} bytes declared with this one",
            )

    def get(self, upload_id: str) -> ResumableUpload | None:
        """One upload, or None."""
        with self.engine.connect() as db:
            row = db.execute(
                select(*_COLUMNS).where(resumable_uploads.c.upload_id == upload_id)
            ).first()
        return _to_upload(tuple(row)) if row else None

    def update(
        self,
        upload_id: str,
        *,
        offset: int,
        pending_from: int | None,
        expires_at: float | None = None,
    ) -> None:
        """Store the confirmed offset and whether unverified bytes follow it."""
        values: dict[str, Any] = {"upload_offset": offset, "pending_from": pending_from}
        if expires_at is not None:
            values["expires_at"] = expires_at
        with write_transaction(self.engine) as db:
            db.execute(
                update(resumable_uploads)
                .where(resumable_uploads.c.upload_id == upload_id)
                .values(values)
            )

    def remove(self, upload_id: str, *, only_pending: bool = False) -> None:
        """Forget an upload (refused, terminated or expired); with `only_pending`, only
        while it is not committed (a commit in another process may just have landed)."""
        statement = delete(resumable_uploads).where(resumable_uploads.c.upload_id == upload_id)
        if only_pending:
            statement = statement.where(resumable_uploads.c.committed_name.is_(None))
        with write_transaction(self.engine) as db:
            if db.execute(statement).rowcount:
                db.execute(delete(resumable_parts).where(resumable_parts.c.upload_id == upload_id))

    def mark_committed(self, upload_id: str, name: str, within: Connection) -> None:
        """Record, in the transaction that commits the file (`within`), that the upload is
        complete and stored as `name`: both hold, or neither."""
        within.execute(
            update(resumable_uploads)
            .where(resumable_uploads.c.upload_id == upload_id)
            .values(committed_name=name, pending_from=None)
        )

    def expired(self, now: float) -> list[ResumableUpload]:
        """Every upload whose expiry has passed."""
        with self.engine.connect() as db:
            rows = db.execute(select(*_COLUMNS).where(resumable_uploads.c.expires_at <= now)).all()
        return [_to_upload(tuple(row)) for row in rows]

    def has_staging(self, path: Path) -> bool:
        """Whether `path` is the staging file of an upload still on record."""
        with self.engine.connect() as db:
            count = db.execute(
                select(func.count())
                .select_from(resumable_uploads)
                .where(resumable_uploads.c.staging_path == str(path))
            ).scalar_one()
        return count > 0

    def close(self) -> None:
        """Nothing to release: the engine belongs to whoever made it."""

    # -- the S3 backend: leases and parts ------------------------------------------------

    def take_lease(self, upload_id: str, owner: str, now: float, until: float) -> bool:
        """Make `owner` the upload's one writer until `until`, unless another holds an
        unexpired lease: one compare-and-set UPDATE, so of two instances asking at once
        exactly one gets it."""
        table = resumable_uploads.c
        with write_transaction(self.engine) as db:
            taken = db.execute(
                update(resumable_uploads)
                .where(
                    table.upload_id == upload_id,
                    (table.lease_owner.is_(None))
                    | (table.lease_expires <= now)
                    | (table.lease_owner == owner),
                )
                .values(lease_owner=owner, lease_expires=until)
            ).rowcount
        return taken == 1

    def renew_lease(self, upload_id: str, owner: str, until: float) -> bool:
        """Keep the lease (before each part is sent); False when it was lost meanwhile."""
        table = resumable_uploads.c
        with write_transaction(self.engine) as db:
            kept = db.execute(
                update(resumable_uploads)
                .where(table.upload_id == upload_id, table.lease_owner == owner)
                .values(lease_expires=until)
            ).rowcount
        return kept == 1

    def release_lease(self, upload_id: str, owner: str) -> None:
        """Let the next writer in at once."""
        table = resumable_uploads.c
        with write_transaction(self.engine) as db:
            db.execute(
                update(resumable_uploads)
                .where(table.upload_id == upload_id, table.lease_owner == owner)
                .values(lease_owner=None, lease_expires=None)
            )

    def s3_progress(self, upload_id: str) -> S3Progress:
        """The upload's multipart upload, parts and tail as stored."""
        table = resumable_uploads.c
        with self.engine.connect() as db:
            row = db.execute(
                select(table.s3_upload_id, table.tail_key, table.sha256).where(
                    table.upload_id == upload_id
                )
            ).first()
            parts = db.execute(
                select(
                    resumable_parts.c.part_number,
                    resumable_parts.c.etag,
                    resumable_parts.c.checksum_sha256,
                    resumable_parts.c.size,
                )
                .where(resumable_parts.c.upload_id == upload_id)
                .order_by(resumable_parts.c.part_number)
            ).all()
        if row is None:
            return S3Progress(None, (), None, None)
        return S3Progress(row[0], tuple(SentPart(*part) for part in parts), row[1], row[2])

    def set_s3_upload_id(self, upload_id: str, owner: str, s3_upload_id: str) -> bool:
        """Name the multipart upload just started (before any part goes, so a DELETE or
        the expiry can abort it); False when `owner` lost the lease."""
        table = resumable_uploads.c
        with write_transaction(self.engine) as db:
            done = db.execute(
                update(resumable_uploads)
                .where(table.upload_id == upload_id, table.lease_owner == owner)
                .values(s3_upload_id=s3_upload_id)
            ).rowcount
        return done == 1

    def advance(
        self,
        upload_id: str,
        owner: str,
        *,
        offset: int,
        parts: list[SentPart],
        tail_key: str | None,
        expires_at: float | None = None,
        s3_upload_id: str | None = None,
        clear_parts: bool = False,
        sha256: str | None = None,
    ) -> bool:
        """Store where a PATCH left the upload, in one transaction and only while `owner`
        holds the lease: the new offset, the parts it sent (replacing any of the same
        number), its tail. With `clear_parts` the multipart upload was completed (or is
        gone) and the tail holds every byte. False when the lease was lost (nothing
        stored)."""
        table = resumable_uploads.c
        values: dict[str, Any] = {"upload_offset": offset, "pending_from": None}
        values["tail_key"] = tail_key
        if expires_at is not None:
            values["expires_at"] = expires_at
        if clear_parts:
            values["s3_upload_id"] = None
        elif s3_upload_id is not None:
            values["s3_upload_id"] = s3_upload_id
        if sha256 is not None:
            values["sha256"] = sha256
        with write_transaction(self.engine) as db:
            done = db.execute(
                update(resumable_uploads)
                .where(table.upload_id == upload_id, table.lease_owner == owner)
                .values(values)
            ).rowcount
            if done != 1:
                return False
            numbers = [part.number for part in parts]
            if clear_parts or numbers:
                stale = delete(resumable_parts).where(resumable_parts.c.upload_id == upload_id)
                if not clear_parts:
                    stale = stale.where(resumable_parts.c.part_number.in_(numbers))
                db.execute(stale)
            if parts and not clear_parts:
                db.execute(
                    insert(resumable_parts),
                    [
                        {
                            "upload_id": upload_id,
                            "part_number": part.number,
                            "etag": part.etag,
                            "checksum_sha256": part.checksum_sha256,
                            "size": part.size,
                        }
                        for part in parts
                    ],
                )
        return True

    def live_upload_ids(self) -> set[str]:
        """Every resumable upload on record: the stale-upload sweep spares their incoming
        objects (parts' tails, the assembled object) whatever their age."""
        with self.engine.connect() as db:
            rows = db.execute(select(resumable_uploads.c.upload_id))
            return {row[0] for row in rows}

    def live_multipart_uploads(self) -> set[str]:
        """The S3 multipart uploads that unfinished resumable uploads still name: the
        stale-upload sweep spares them whatever their age (their own expiry ends them)."""
        table = resumable_uploads.c
        with self.engine.connect() as db:
            rows = db.execute(select(table.s3_upload_id).where(table.s3_upload_id.is_not(None)))
            return {row[0] for row in rows}


class ResumableStaging:
    """The staging file of one resumable upload, opened and locked for one request.

    The lock is an exclusive `flock` taken without waiting: a second request for the same
    upload finds it held and is refused instead of interleaving its bytes. Bytes are
    written at explicit offsets, so what the file holds never depends on a shared position.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def create(cls, path: Path) -> ResumableStaging:
        """Create the empty, private staging file, locked; the folder must exist."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, fd)

    @classmethod
    def acquire(cls, path: Path) -> ResumableStaging | None:
        """Open and lock an existing staging file; None while another request holds it.

        Raises:
            FileNotFoundError: The staging file is gone.
        """
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def size(self) -> int:
        """The bytes on disk."""
        return os.fstat(self._fd).st_size

    def write_at(self, data: memoryview, offset: int) -> None:
        """Write all of `data` at `offset`."""
        while data:
            written = os.pwrite(self._fd, data, offset)
            data = data[written:]
            offset += written

    def truncate(self, size: int) -> None:
        """Cut the file back to `size` bytes (a refused chunk leaves no trace)."""
        os.ftruncate(self._fd, size)

    def make_readable(self) -> None:
        """Committed files get the data dir's file mode, like multipart ones."""
        os.fchmod(self._fd, storage_modes().file)

    def close(self) -> None:
        """Release the lock; safe to call twice."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Delete the file and release the lock; safe to call twice."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self.close()
