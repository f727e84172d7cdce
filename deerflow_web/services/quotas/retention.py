"""Retention: threads nobody touched for `retention.thread_days` are removed by a sweeper.

One instance at a time sweeps: a sweep runs while it holds the `retention` lease of
`job_leases` (renewed as it goes), and the time of the last sweep is kept in that row, so
the instances that all try every `sweep_interval_minutes` sweep once per interval between
them. `flask --app app files sweep` runs one sweep now (still under the lease).

A thread is untouched when the newest of these is older than the cut-off: its row's
`updated_at` (created, renamed, metadata), the newest upload record (committed or
converted), and the mtime of its folders (any file added, removed or renamed there by the
app or an agent's sandbox). A thread with an upload in progress is never removed:

- an unfinished resumable upload of the thread on record (not committed, not expired):
  it can resume at any time, from any instance;
- a staging file in its uploads folder: a multipart upload streaming on some instance
  (or a tus upload's bytes). Instances share only the database and the data volume, and
  the staging file is what a streaming upload leaves on the volume from its first byte.
  Creating it also moves the folder's mtime, so such a thread is also "touched".
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING

from sqlalchemy import func
from sqlalchemy import select

from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import ThreadNotFound
from deerflow_web.errors import UnsafeFolder
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ThreadRef
from deerflow_web.services.periodic import PeriodicJob
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.threads.catalog import folder_time
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import uploads
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.paths import is_staging_name

if TYPE_CHECKING:
    from deerflow_web.services.history.trash import Trash

logger = logging.getLogger(__name__)

LEASE_NAME = "retention"
LEASE_SECONDS = 300.0  # a sweep renews it after every thread; a dead sweeper's lapses
CHECK_SECONDS = 300.0  # how often each instance asks whether a sweep is due


@dataclass
class SweepReport:
    """What one sweep did, for the log and the command line."""

    removed: list[ThreadRef] = field(default_factory=list)
    trashed: list[ThreadRef] = field(default_factory=list)
    kept_in_progress: list[ThreadRef] = field(default_factory=list)
    checked: int = 0

    def summary(self) -> str:
        return (
            f"retention sweep: {len(self.trashed)} thread(s) moved to the trash, "
            f"{len(self.removed)} removed, "
            f"{len(self.kept_in_progress)} kept for an upload in progress, "
            f"{self.checked} checked"
        )


def retire_thread(catalog: ThreadCatalog, ref: ThreadRef, trash: Trash | None) -> bool:
    """Take an expired thread away from its owner; True once it is deleted for good.

    With a trash, in two steps, so nothing goes without the trash's grace: its files
    move into the thread's trash (restorable for `trash.days`, as after any delete; the
    thread stays, empty), and a later sweep, once the trash's own expiry has emptied it
    and the thread is untouched again, deletes the thread (`ThreadCatalog.delete`: its
    folder, records, unfinished uploads and row). Without one it is deleted at once.
    """
    if trash is None or not trash.enabled:
        catalog.delete(ref)
        return True
    uploads = trash.uploads
    records = uploads.list_uploads(ref)
    if records:
        # Originals first: a companion goes into the trash with its original.
        for record in sorted(records, key=lambda r: r.converted_from is not None):
            try:
                uploads.delete_upload(ref, record.filename)
            except UploadNotFound:
                continue  # a companion that went with its original
        return False
    if trash.list(ref):
        return False  # its trash expires first
    catalog.delete(ref)
    return True


class RetentionSweeper:
    """Removes the threads untouched for longer than `thread_days`."""

    def __init__(
        self,
        catalog: ThreadCatalog,
        leases: JobLeases,
        thread_days: float | None,
        *,
        interval_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        trash: Trash | None = None,
    ) -> None:
        """`trash`: where an expired thread's files go first (None: deleted at once); its
        expired entries are purged in every sweep, under the same lease."""
        self.catalog = catalog
        self.engine = catalog.engine
        self.leases = leases
        self.thread_days = thread_days
        self.interval_seconds = interval_seconds
        self.trash = trash
        self._clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._job = PeriodicJob(
            LEASE_NAME,
            min(interval_seconds, CHECK_SECONDS),
            self.sweep_if_due,
            what="retention sweep",
            log=logger,
        )

    @property
    def enabled(self) -> bool:
        return self.thread_days is not None

    # --- the schedule -------------------------------------------------------------------

    def start(self) -> None:
        """Try a sweep every few minutes in the background (`sweep_if_due` decides)."""
        if self.enabled:
            self._job.start()

    def stop(self) -> None:
        """Stop the periodic sweeps (tests, shutdown)."""
        self._job.stop()

    @property
    def is_running(self) -> bool:
        """Whether the periodic sweeps are on in this process."""
        return self._job.is_running

    def sweep_if_due(self) -> SweepReport | None:
        """A sweep when none ran within the interval and no other instance is sweeping."""
        if not self.enabled:
            return None
        if self.leases.last_run(LEASE_NAME) > self._clock() - self.interval_seconds:
            return None
        return self.sweep()

    # --- one sweep ----------------------------------------------------------------------

    def sweep(self) -> SweepReport | None:
        """One sweep now, if this process takes the lease; None while another holds it."""
        now = self._clock()
        if not self.leases.take(LEASE_NAME, self.owner, now, now + LEASE_SECONDS):
            logger.info("retention sweep skipped: another instance is sweeping")
            return None
        report = SweepReport()
        try:
            if self.trash is not None:  # first: a thread whose trash empties can go now
                self.trash.purge_expired_trash(now)
            if self.thread_days is not None:
                self._sweep_threads(now - self.thread_days * 86400, report)
            self.leases.remember_run(LEASE_NAME, now)
        finally:
            self.leases.release(LEASE_NAME, self.owner)
        logger.info("%s", report.summary())
        return report

    def _sweep_threads(self, cutoff: float, report: SweepReport) -> None:
        for ref in self._candidates(cutoff):
            report.checked += 1
            if self._last_touched(ref) >= cutoff:
                continue
            if self._upload_in_progress(ref):  # looked at last: right before the removal
                logger.info(
                    "retention: kept %s of %s, an upload is in progress",
                    ref.thread_id,
                    ref.owner or "the single user",
                )
                report.kept_in_progress.append(ref)
                continue
            try:
                deleted = retire_thread(self.catalog, ref, self.trash)
            except (ThreadNotFound, UnsafeFolder):
                continue  # deleted meanwhile, or a folder it will not touch
            logger.info(
                "retention: %s thread %s of %s, untouched for %g days",
                "removed" if deleted else "moved to the trash the files of",
                ref.thread_id,
                ref.owner or "the single user",
                self.thread_days,
            )
            (report.removed if deleted else report.trashed).append(ref)
            now = self._clock()
            self.leases.take(LEASE_NAME, self.owner, now, now + LEASE_SECONDS)  # renew

    def _candidates(self, cutoff: float) -> list[ThreadRef]:
        """Threads whose row was not updated since `cutoff`, folders adopted first (a
        folder without a row is dated by the folder)."""
        for owner in self._owners():
            try:
                self.catalog.all(owner)  # adopts folders made without a row
            except (InvalidUserId, UnsafeFolder):
                continue  # a folder no account can own, or one reached through a link
        with self.engine.connect() as db:
            rows = db.execute(
                select(threads.c.user_id, threads.c.thread_id).where(threads.c.updated_at < cutoff)
            ).all()
        found = []
        for user_id, thread_id in rows:
            try:
                found.append(ThreadRef(thread_id, user_id))
            except ValueError:
                continue  # an id no folder can have
        return found

    def _owners(self) -> set[str]:
        paths = self.catalog.paths
        owners: set[str] = set()
        with self.engine.connect() as db:
            owners.update(row[0] for row in db.execute(select(threads.c.user_id).distinct()))
        if (paths.base_dir / "threads").is_dir():
            owners.add(SINGLE_USER)
        users_dir = paths.base_dir / "users"
        if users_dir.is_dir():
            with os.scandir(users_dir) as entries:
                owners.update(e.name for e in entries if e.is_dir(follow_symlinks=False))
        return owners

    def _upload_in_progress(self, ref: ThreadRef) -> bool:
        """An unfinished resumable upload on record, or a staging file in the folder."""
        mine = (
            resumable_uploads.c.user_id.is_(None)
            if ref.is_single_user
            else resumable_uploads.c.user_id == ref.user_id
        )
        with self.engine.connect() as db:
            pending = db.execute(
                select(func.count()).where(
                    mine,
                    resumable_uploads.c.thread_id == ref.thread_id,
                    resumable_uploads.c.committed_name.is_(None),
                    resumable_uploads.c.expires_at > self._clock(),
                )
            ).scalar_one()
        if pending:
            return True
        try:
            folder = self.catalog.paths.uploads_dir(ref)
            with os.scandir(folder) as entries:
                return any(is_staging_name(entry.name) for entry in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except UnsafeFolder:
            return True  # never touched by the sweeper

    def _last_touched(self, ref: ThreadRef) -> float:
        """The newest of the row's update, the records' newest upload and the folders."""
        scope = self.catalog.paths.scope(ref)
        with self.engine.connect() as db:
            updated = db.execute(
                select(threads.c.updated_at).where(
                    threads.c.user_id == ref.user_id, threads.c.thread_id == ref.thread_id
                )
            ).scalar_one_or_none()
            uploaded, mtime_ns = db.execute(
                select(func.max(uploads.c.uploaded_at), func.max(uploads.c.mtime_ns)).where(
                    uploads.c.scope == scope
                )
            ).one()
        return max(
            updated or 0.0,
            uploaded or 0.0,
            (mtime_ns or 0) / 1e9,
            folder_time(self.catalog.paths, ref),
        )
