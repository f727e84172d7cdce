"""The sweep of unfinished S3 multipart uploads (`storage.backend: s3`).

A file larger than one part goes to the bucket as a multipart upload. A process killed
while pushing one (SIGKILL, an OOM kill, a lost machine) leaves it unfinished: invisible
to readers, but its parts stay stored, and billed, until someone aborts it. Nothing else
ever will, so every instance tries a sweep now and then, and `flask --app app files
sweep` runs one now.

An upload streams into the bucket at an incoming key (`keys.incoming_key`) while its
body arrives; once its SHA-256 is known it is copied to the thread's blob and the incoming
object deleted. A process killed between the two (or between completing the upload and
committing it) leaves an incoming object nothing will ever name: the sweep deletes those
too, by the same age rule.

S3 cannot tell an upload a live instance is still sending from a dead one's, so the age
is the whole rule (`storage.s3.stale_upload_hours`, longer than any push may take). One
instance at a time sweeps: a sweep runs while it holds the `stale-uploads` lease of
`job_leases`, and the time of the last one is kept in that row, so instances that all try
every `CHECK_SECONDS` sweep about once per interval between them.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from collections.abc import Collection

from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.services.periodic import PeriodicJob
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.objects.base import ObjectStore
from deerflow_web.storage.objects.base import sweep_stale_uploads
from deerflow_web.storage.objects.keys import INCOMING_FOLDER
from deerflow_web.storage.resumable import DatabaseResumableStore

logger = logging.getLogger(__name__)

LEASE_NAME = "stale-uploads"
LEASE_SECONDS = 300.0  # one listing and a few aborts; a dead sweeper's lease lapses
CHECK_SECONDS = 3600.0  # how often each instance asks whether a sweep is due


class StaleUploadSweeper:
    """Aborts the multipart uploads in the bucket older than `older_than_seconds`."""

    def __init__(
        self,
        store: ObjectStore,
        leases: JobLeases,
        older_than_seconds: float,
        *,
        interval_seconds: float = CHECK_SECONDS,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.leases = leases
        self.engine = leases.engine
        self.older_than_seconds = older_than_seconds
        self.interval_seconds = interval_seconds
        self._clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._job = PeriodicJob(
            LEASE_NAME,
            interval_seconds,
            self.sweep_if_due,
            what="stale upload sweep",
            skips={ObjectStoreUnavailable: "the object store is unavailable"},
            log=logger,
        )

    def describe(self) -> str:
        """What the periodic job does, for the start-up log line."""
        return (
            f"stale upload sweeps every {self.interval_seconds / 60:g} min "
            f"(older than {self.older_than_seconds / 3600:g} h)"
        )

    # --- the schedule -------------------------------------------------------------------

    def start(self) -> None:
        """Try a sweep every `interval_seconds` in the background (`sweep_if_due` decides)."""
        self._job.start()

    def stop(self) -> None:
        """Stop the periodic sweeps (shutdown, tests)."""
        self._job.stop()

    @property
    def is_running(self) -> bool:
        """Whether the periodic sweeps are on in this process."""
        return self._job.is_running

    def sweep_if_due(self) -> int | None:
        """A sweep when none ran within the interval and no other instance is sweeping."""
        if self.leases.last_run(LEASE_NAME) > self._clock() - self.interval_seconds:
            return None
        return self.sweep()

    # --- one sweep ----------------------------------------------------------------------

    def sweep(self) -> int | None:
        """One sweep now if this process takes the lease: how many uploads were aborted;
        None while another instance holds it.

        Raises:
            ObjectStoreUnavailable: The bucket cannot be reached (nothing is lost: the
                next sweep finds the same uploads).
        """
        now = self._clock()
        if not self.leases.take(LEASE_NAME, self.owner, now, now + LEASE_SECONDS):
            logger.info("stale upload sweep skipped: another instance is sweeping")
            return None
        try:
            resumable = DatabaseResumableStore(self.engine)  # live tus uploads are spared
            aborted = sweep_stale_uploads(
                self.store,
                older_than=self.older_than_seconds,
                keep=resumable.live_multipart_uploads,
            )
            aborted += remove_stale_incoming(
                self.store, now - self.older_than_seconds, keep=resumable.live_upload_ids
            )
            self.leases.remember_run(LEASE_NAME, now)
        finally:
            self.leases.release(LEASE_NAME, self.owner)
        if aborted:
            logger.warning(
                "stale upload sweep: %d unfinished upload(s) older than %g h aborted "
                "(left by processes that died while storing a file)",
                aborted,
                self.older_than_seconds / 3600,
            )
        else:
            logger.info("stale upload sweep: no unfinished upload to abort")
        return aborted


def remove_stale_incoming(
    store: ObjectStore, cutoff: float, keep: Callable[[], Collection[str]] | None = None
) -> int:
    """Delete every incoming object (`{scope}/incoming/{name}`) last written before
    `cutoff`; return how many went. `keep` names resumable uploads on record, whose
    incoming objects (`{upload_id}`, `{upload_id}.{offset}`) are spared whatever their age.

    Incoming keys sit inside each thread's prefix, and a thread that never committed a file
    has no row to find it by, so the bucket's keys are listed (one request per thousand
    keys, once per sweep interval by one instance) and the incoming ones picked out.
    """
    removed = 0
    spared: set[str] | None = None
    for info in list(store.list_keys()):
        if not _is_incoming(info.key):
            continue
        if info.modified is not None and info.modified > cutoff:
            continue  # an upload on its way, or just adopted
        if keep is not None:
            spared = set(keep()) if spared is None else spared
            if info.key.rsplit("/", 1)[-1].split(".", 1)[0] in spared:
                continue  # a resumable upload's, which its own end removes
        store.delete(info.key)
        removed += 1
    return removed


def _is_incoming(key: str) -> bool:
    parts = key.split("/")
    return len(parts) >= 3 and parts[-2] == INCOMING_FOLDER
