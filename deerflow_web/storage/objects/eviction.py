"""A working copy within a size: what the bucket holds leaves the data dir once unused.

With `storage.backend: s3` each instance's data dir is a working copy of the bucket
(`working_copy`): a thread's uploads, and the kept bytes of its versions and trash, are
fetched the first time a request or tool call reads them, and then stay. Left alone,
every instance would end up holding the whole bucket. `storage.s3.working_copy_max_gb`
bounds it: when the copies pass the bound, the threads used longest ago lose their
fetched files until the copies are under 80% of it (so an eviction is not due again at
the next upload). Only bytes the bucket holds go: an upload the records name (pushed
before it was recorded), the kept bytes of an upload's version or trash entry. What the
bucket does not hold stays: workspace/, outputs/ and their versions, files in progress,
derived files (conversions, thumbnails are recorded uploads or caches of their own).

A thread in use is never evicted under a request. "Used" is the mtime of a marker in its
folder, touched whenever a request or tool call brings the thread up to date
(`mark_used`, one `utime`), so all the processes of an instance share it; a thread used
within `idle_seconds` is spared. An evicted file is fetched again, checked against its
record, the next time anything reads the thread.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from deerflow_web.models import Area
from deerflow_web.storage.history import versions_in
from deerflow_web.storage.paths import HISTORY_FOLDER
from deerflow_web.storage.paths import TRASH_FOLDER
from deerflow_web.storage.paths import VERSIONS_FOLDER
from deerflow_web.storage.paths import is_staging_name

if TYPE_CHECKING:
    from deerflow_web.storage.records import DatabaseUploadRecords

logger = logging.getLogger(__name__)

USED_MARKER = ".working-copy-used"
ROUND_LOCK = ".working-copy-eviction.lock"
_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
# Evicting down to this share of the bound, not just under it, leaves room for a while.
LOW_WATER = 0.8
# A thread read this recently may be in the middle of a request: its files stay.
DEFAULT_IDLE_SECONDS = 600.0
# How often each instance looks at its size (one walk of its thread folders).
EVICTION_INTERVAL_SECONDS = 60.0


def mark_used(thread_dir: Path) -> None:
    """Note that the thread's working copy is being read now (its marker's mtime)."""
    marker = thread_dir / USED_MARKER
    try:
        os.utime(marker, follow_symlinks=False)
    except FileNotFoundError:
        try:
            fd = os.open(marker, _CREATE_FLAGS, 0o600)
        except OSError:  # the thread's folder is not there (yet): nothing to mark
            return
        os.close(fd)


@dataclass(frozen=True)
class Eviction:
    """What one round did: the threads that lost their fetched files, the bytes freed,
    and what the working copies hold after."""

    threads: int
    freed_bytes: int
    held_bytes: int


@dataclass
class _ThreadCopy:
    scope: str
    folder: Path
    last_used: float
    size: int


class WorkingCopyBudget:
    """Keeps one data dir's working copies under `max_bytes` (see the module docstring)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        records: DatabaseUploadRecords,
        max_bytes: int,
        *,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.records = records
        self.max_bytes = max_bytes
        self.idle_seconds = idle_seconds
        self._clock = clock

    def evict(self) -> Eviction | None:
        """One round: nothing when the copies are within the bound; otherwise the threads
        used longest ago (and not within `idle_seconds`) lose their fetched files until
        the copies are under `LOW_WATER` of it. None when another process of this data
        dir is at it (one round at a time per data dir: every worker process of an
        instance schedules it, one does the work)."""
        try:
            fd = os.open(self.base_dir / ROUND_LOCK, _CREATE_FLAGS, 0o600)
        except FileNotFoundError:
            return Eviction(0, 0, 0)  # no data dir yet: nothing held
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            return self._round()
        finally:
            os.close(fd)  # and with it the lock

    def _round(self) -> Eviction:
        copies = list(self._thread_copies())
        held = sum(copy.size for copy in copies)
        if held <= self.max_bytes:
            return Eviction(0, 0, held)
        target = self.max_bytes * LOW_WATER
        idle_before = self._clock() - self.idle_seconds
        threads = freed = 0
        for copy in sorted(copies, key=lambda c: c.last_used):
            if held <= target or copy.last_used > idle_before:
                break
            gone = self._evict_thread(copy, idle_before)
            if gone:
                threads += 1
                freed += gone
                held -= gone
        if threads:
            logger.info(
                "working copy over %d bytes: %d bytes of %d thread(s) left it, %d held",
                self.max_bytes,
                freed,
                threads,
                held,
            )
        return Eviction(threads, freed, held)

    def _thread_copies(self) -> Iterator[_ThreadCopy]:
        """Every thread folder of the data dir (both layouts), never through a link."""
        for parent in (self.base_dir / "threads", *self._user_thread_folders()):
            for entry in _folders_in(parent):
                folder = Path(entry.path)
                yield _ThreadCopy(
                    folder.relative_to(self.base_dir).as_posix(),
                    folder,
                    _last_used(folder, entry),
                    sum(size for _, size in _bucket_backed(folder)),
                )

    def _user_thread_folders(self) -> Iterator[Path]:
        for user in _folders_in(self.base_dir / "users"):
            yield Path(user.path) / "threads"

    def _evict_thread(self, copy: _ThreadCopy, idle_before: float) -> int:
        """Remove the thread's bucket-backed files under its lock; the bytes freed."""
        freed = 0
        with self.records.locked_here(copy.scope) as txn:
            if _last_used(copy.folder) > idle_before:
                return 0  # read again since the round began
            for path, size in _bucket_backed(copy.folder, txn.connection, copy.scope):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                freed += size
        return freed


def _folders_in(parent: Path) -> Iterator[os.DirEntry[str]]:
    try:
        entries = os.scandir(parent)
    except (FileNotFoundError, NotADirectoryError):
        return
    with entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield entry


def _last_used(folder: Path, entry: os.DirEntry[str] | None = None) -> float:
    """When the thread was last read: its marker's mtime, else its folder's (a copy
    made before markers existed counts as used when it was made)."""
    try:
        return os.lstat(folder / USED_MARKER).st_mtime
    except FileNotFoundError:
        info = entry.stat(follow_symlinks=False) if entry is not None else os.lstat(folder)
        return info.st_mtime


def _bucket_backed(
    folder: Path, db: Connection | None = None, scope: str = ""
) -> Iterator[tuple[Path, int]]:
    """(path, size) of the thread's files whose bytes the bucket holds.

    Without a connection (sizing a thread), every regular file of the versions folder
    counts: close enough to decide who goes. With one (evicting, under the thread's
    lock), the versions of outputs/, which only this instance holds, are told apart by
    their rows and kept. The trash holds uploads only.
    """
    uploads = folder / "user-data" / Area.UPLOADS.value
    for name, size in _regular_files(uploads):
        yield uploads / name, size
    history = folder / HISTORY_FOLDER
    for entry in _folders_in(history / TRASH_FOLDER):
        for name, size in _regular_files(Path(entry.path)):
            yield Path(entry.path) / name, size
    versions = history / VERSIONS_FOLDER
    of_uploads = None
    if db is not None:
        of_uploads = {v.version_id for v in versions_in(db, scope) if v.area == Area.UPLOADS.value}
    for name, size in _regular_files(versions):
        if of_uploads is None or name in of_uploads:
            yield versions / name, size


def _regular_files(folder: Path) -> Iterator[tuple[str, int]]:
    try:
        entries = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    with entries:
        for entry in entries:
            if is_staging_name(entry.name):
                continue  # bytes on their way in: not in the bucket yet
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                yield entry.name, info.st_size
