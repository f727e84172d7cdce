"""The leased background jobs of one process: conversions (OCR included), the periodic
rescans when scanning is configured, the retention sweeps, and on the S3 backend the
sweeps of multipart uploads that killed processes left unfinished in the bucket.

Conversion, OCR and scanning are CPU-heavy; at scale they run on machines of their own. So
one place starts them, for two kinds of process:

- a web instance with `jobs.run_in_web` on (the default: `make run` alone converts
  documents) starts them next to its HTTP server (`start`);
- `flask --app app worker` runs only them, with no HTTP server, until it is told to stop
  (`run_until`). It claims the jobs web instances with `jobs.run_in_web` off recorded in
  the database, as many as it has converters free, every `jobs.poll_seconds`.

Every job is leased in the database (conversions per file, the rescan and the sweep by
name), so any number of web instances and workers run them together, each job once. A
worker that stops hands back the conversions nobody started, lets the running ones finish
for `jobs.stop_grace_seconds`, and releases what is still running then: another worker
claims all of them at once instead of after their leases.
"""

from __future__ import annotations

import logging
import threading
import time

from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.quotas.retention import RetentionSweeper
from deerflow_web.services.scanning.rescan import Rescanner
from deerflow_web.services.uploads.stale_uploads import StaleUploadSweeper
from deerflow_web.settings import JobsSettings
from deerflow_web.storage.database import is_unavailable

logger = logging.getLogger(__name__)

STOP_POLL_SECONDS = 0.1  # how often a stopping worker looks whether its conversions ended


class BackgroundJobs:
    """Start, run and stop the leased jobs of this process."""

    def __init__(
        self,
        settings: JobsSettings,
        conversions: ConversionJobs,
        *,
        rescans: Rescanner | None = None,
        rescan_interval_seconds: float = 0.0,
        retention: RetentionSweeper | None = None,
        stale_uploads: StaleUploadSweeper | None = None,
    ) -> None:
        """`stale_uploads`: the bucket's sweep (None on the local backend)."""
        self.settings = settings
        self.conversions = conversions
        self.rescans = rescans
        self.rescan_interval_seconds = rescan_interval_seconds
        self.retention = retention
        self.stale_uploads = stale_uploads

    def describe(self) -> str:
        """What this process runs, in words, for its start-up log line."""
        parts = [f"conversions ({self.conversions.settings.workers} converters)"]
        if self.rescans is not None and self.rescan_interval_seconds > 0:
            parts.append(f"rescans every {self.rescan_interval_seconds:g} s")
        else:
            parts.append("no rescans (scanning off)")
        if self.retention is not None and self.retention.enabled:
            parts.append(f"retention sweeps every {self.retention.interval_seconds / 60:g} min")
        else:
            parts.append("no retention sweeps (retention off)")
        if self.stale_uploads is not None:
            parts.append(self.stale_uploads.describe())
        return ", ".join(parts)

    def start(self, *, keeper: bool = True) -> None:
        """Run the jobs in the background of this process: take over the conversions of a
        process of this host that died, renew leases and sweep for orphaned jobs (`keeper`),
        and start the periodic rescans and sweeps (each does nothing when it is not
        configured)."""
        self.conversions.reclaim_interrupted_jobs()
        if keeper:
            self.conversions.start_keeper()
        if self.rescans is not None:
            self.rescans.start(self.rescan_interval_seconds)
        if self.retention is not None:
            self.retention.start()
        if self.stale_uploads is not None:
            self.stale_uploads.start()

    def run_until(self, stop: threading.Event) -> int:
        """Be a worker until `stop` is set: claim queued conversions every
        `jobs.poll_seconds`, then stop cleanly; what `stop_cleanly` returns."""
        self.conversions.become_worker()
        self.start()
        while not stop.wait(self.settings.poll_seconds):
            try:
                self.conversions.claim_waiting_jobs()
            except Exception as error:  # an outage must not end the worker: it retries
                if is_unavailable(error):
                    logger.warning("worker: database unavailable, no jobs claimed")
                else:
                    logger.warning("worker: claiming jobs failed", exc_info=True)
        return self.stop_cleanly()

    def stop_cleanly(self) -> int:
        """Take no more jobs, hand back the queued ones, give running conversions up to
        `jobs.stop_grace_seconds` to finish, and release the rest; stop the periodic jobs.

        Returns how many conversions were still running when the grace ran out (their
        converters end with this process).
        """
        conversions = self.conversions
        try:
            handed_back = conversions.drain()
        except Exception:
            logger.warning("worker: handing back queued conversions failed", exc_info=True)
            handed_back = 0
        if handed_back:
            logger.info("worker: %d queued conversion(s) handed back", handed_back)
        deadline = time.monotonic() + self.settings.stop_grace_seconds
        while conversions.running and time.monotonic() < deadline:
            time.sleep(STOP_POLL_SECONDS)
        unfinished = conversions.running
        if unfinished:
            try:
                conversions.release_held_jobs()
            except Exception:  # their leases lapse instead: claimed a little later
                logger.warning("worker: releasing running conversions failed", exc_info=True)
            logger.info(
                "worker: %d conversion(s) still running after %g s released for another worker",
                unfinished,
                self.settings.stop_grace_seconds,
            )
        conversions.stop_keeper()
        if self.rescans is not None:
            self.rescans.stop()
        if self.retention is not None:
            self.retention.stop()
        if self.stale_uploads is not None:
            self.stale_uploads.stop()
        return unfinished
