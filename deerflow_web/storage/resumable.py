"""Resumable uploads in progress (tus, SPEC 8): their state in the records database, their
bytes in a staging file of the thread's uploads folder.

Any server process may take the next request of an upload, so nothing about it lives in
one process's memory: the offset, length, metadata, owner and expiry are rows of the same
SQLite file as the upload records, and the one writer at a time is whoever holds the
staging file's `flock` (released by the kernel when a killed process goes away, so a dead
request never blocks the upload for good).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path
from typing import Protocol

from deerflow_web.models import ResumableUpload
from deerflow_web.storage.sqlite import ThreadConnections

STAGING_PREFIX = ".upload-tus-"
STAGING_SUFFIX = ".part"

SCHEMA = """
CREATE TABLE IF NOT EXISTS resumable_uploads (
    upload_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    user_id TEXT,
    filename TEXT NOT NULL,
    on_conflict TEXT NOT NULL,
    metadata TEXT NOT NULL,
    length INTEGER NOT NULL,
    upload_offset INTEGER NOT NULL,
    pending_from INTEGER,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    staging_path TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS resumable_uploads_expiry ON resumable_uploads (expires_at);
CREATE INDEX IF NOT EXISTS resumable_uploads_staging ON resumable_uploads (staging_path);
"""

_COLUMNS = (
    "upload_id, thread_id, user_id, filename, on_conflict, metadata, length, upload_offset, "
    "pending_from, created_at, expires_at, staging_path"
)


def staging_name(upload_id: str) -> str:
    """The staging file of an upload: hidden, never listed, shaped like every staging file."""
    return f"{STAGING_PREFIX}{upload_id}{STAGING_SUFFIX}"


class ResumableStore(Protocol):
    """Where the state of unfinished resumable uploads lives; shared by every process."""

    def add(self, upload: ResumableUpload) -> None: ...
    def get(self, upload_id: str) -> ResumableUpload | None: ...
    def update(
        self,
        upload_id: str,
        *,
        offset: int,
        pending_from: int | None,
        expires_at: float | None = None,
    ) -> None: ...
    def remove(self, upload_id: str) -> None: ...
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
    )


class SQLiteResumableStore:
    """`ResumableStore` in the records database file (its own table, WAL like the records)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._connections = ThreadConnections(db_path, SCHEMA)
        self._connections.prepare()

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (sqlite3 connections are not shared across threads)."""
        return self._connections.get()

    def add(self, upload: ResumableUpload) -> None:
        """Record a new upload."""
        self._db().execute(
            f"INSERT INTO resumable_uploads ({_COLUMNS}) VALUES ({', '.join('?' * 12)})",
            (
                upload.upload_id,
                upload.thread_id,
                upload.user_id,
                upload.filename,
                upload.on_conflict,
                upload.metadata,
                upload.length,
                upload.offset,
                upload.pending_from,
                upload.created_at,
                upload.expires_at,
                str(upload.staging_path),
            ),
        )

    def get(self, upload_id: str) -> ResumableUpload | None:
        """One upload, or None."""
        row = (
            self._db()
            .execute(f"SELECT {_COLUMNS} FROM resumable_uploads WHERE upload_id = ?", (upload_id,))
            .fetchone()
        )
        return _to_upload(row) if row else None

    def update(
        self,
        upload_id: str,
        *,
        offset: int,
        pending_from: int | None,
        expires_at: float | None = None,
    ) -> None:
        """Store the confirmed offset and whether unverified bytes follow it."""
        self._db().execute(
            "UPDATE resumable_uploads SET upload_offset = ?, pending_from = ?, "
            "expires_at = COALESCE(?, expires_at) WHERE upload_id = ?",
            (offset, pending_from, expires_at, upload_id),
        )

    def remove(self, upload_id: str) -> None:
        """Forget an upload (finished, terminated or expired)."""
        self._db().execute("DELETE FROM resumable_uploads WHERE upload_id = ?", (upload_id,))

    def expired(self, now: float) -> list[ResumableUpload]:
        """Every upload whose expiry has passed."""
        rows = (
            self._db()
            .execute(f"SELECT {_COLUMNS} FROM resumable_uploads WHERE expires_at <= ?", (now,))
            .fetchall()
        )
        return [_to_upload(row) for row in rows]

    def has_staging(self, path: Path) -> bool:
        """Whether `path` is the staging file of an upload still on record."""
        row = (
            self._db()
            .execute("SELECT 1 FROM resumable_uploads WHERE staging_path = ?", (str(path),))
            .fetchone()
        )
        return row is not None

    def close(self) -> None:
        """Close this thread's connection (tests open many stores)."""
        self._connections.close()


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
        """Committed files are readable by a sandbox user, like multipart ones."""
        os.fchmod(self._fd, 0o644)

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
