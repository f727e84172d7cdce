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

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from sqlalchemy import func
from sqlalchemy import select

from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import ThreadNotFound
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ThreadRef
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.threads.catalog import folder_time
from deerflow_web.storage.database import job_leases
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import uploads
from deerflow_web.storage.database import write_transaction
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.paths import is_staging_name

logger = logging.getLogger(__name__)

LEASE_NAME = "retention"
LEASE_SECONDS = 300.0  # a sweep renews it after every thread; a dead sweeper's lapses
CHECK_SECONDS = 300.0  # how often each instance asks whether a sweep is due


@dataclass
class SweepReport:
    """What one sweep did, for the log and the command line."""

    removed: list[ThreadRef] = field(default_factory=list)
    kept_in_progress: list[ThreadRef] = field(default_factory=list)
    checked: int = 0

    def summary(self) -> str:
        return (
            f"retention sweep: {len(self.removed)} thread(s) removed, "
            f"{len(self.kept_in_progress)} kept for an upload in progress, "
            f"{self.checked} checked"
        )


def retire_thread(catalog: ThreadCatalog, ref: ThreadRef) -> None:
    """Take an expired thread away from its owner.

    For now it is deleted for good (`ThreadCatalog.delete`: its folder, records,
    unfinished uploads and row). Once the trash lands this becomes a move to the trash,
    whose own expiry then purges it: this function is the one place that changes.
    """
    catalog.delete(ref)


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
        purge_trash: Callable[[float], int] | None = None,
    ) -> None:
        """`purge_trash(now)` empties what the trash holds past its expiry, once there is
        a trash (None until then); it runs in every sweep, under the same lease."""
        self.catalog = catalog
        self.engine = catalog.engine
        self.leases = leases
        self.thread_days = thread_days
        self.interval_seconds = interval_seconds
        self.purge_trash = purge_trash
        self._clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.thread_days is not None

    # --- the schedule -------------------------------------------------------------------

    def start(self) -> None:
        """Try a sweep every few minutes in the background (`sweep_if_due` decides)."""
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic sweeps (tests, shutdown)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(min(self.interval_seconds, CHECK_SECONDS)):
            try:
                self.sweep_if_due()
            except Exception:
                logger.exception("retention sweep failed")

    def sweep_if_due(self) -> SweepReport | None:
        """A sweep when none ran within the interval and no other instance is sweeping."""
        if not self.enabled or self._last_sweep() > self._clock() - self.interval_seconds:
            return None
        return self.sweep()

    def _last_sweep(self) -> float:
        with self.engine.connect() as db:
            state = db.execute(
                select(job_leases.c.state).where(job_leases.c.name == LEASE_NAME)
            ).scalar_one_or_none()
        try:
            return float(json.loads(state or "{}").get("last_sweep", 0.0))
        except (ValueError, AttributeError, TypeError):
            return 0.0

    # --- one sweep ----------------------------------------------------------------------

    def sweep(self) -> SweepReport | None:
        """One sweep now, if this process takes the lease; None while another holds it."""
        now = self._clock()
        if not self.leases.take(LEASE_NAME, self.owner, now, now + LEASE_SECONDS):
            logger.info("retention sweep skipped: another instance is sweeping")
            return None
        report = SweepReport()
        try:
            if self.thread_days is not None:
                self._sweep_threads(now - self.thread_days * 86400, report)
            if self.purge_trash is not None:
                self.purge_trash(now)
            self._remember(now)
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
                retire_thread(self.catalog, ref)
            except (ThreadNotFound, UnsafeFolder):
                continue  # deleted meanwhile, or a folder it will not touch
            logger.info(
                "retention: removed thread %s of %s, untouched for %g days",
                ref.thread_id,
                ref.owner or "the single user",
                self.thread_days,
            )
            report.removed.append(ref)
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

    def _remember(self, now: float) -> None:
        with write_transaction(self.engine) as db:
            db.execute(
                job_leases.update()
                .where(job_leases.c.name == LEASE_NAME)
                .values(state=json.dumps({"last_sweep": now}))
            )
