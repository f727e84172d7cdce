"""Scan stored files again: those never scanned clean, and all of them when the scanner's
signature version changes. A file found infected now is quarantined: moved out of its
thread into `{base}/quarantine/`, hidden from every listing, kept for the admin for
`scanning.quarantine_days`, and named to the thread's owner on the file manager.

`flask --app app files rescan` runs one pass; with `scanning.rescan_interval_seconds`
each server process also tries every interval, and the one that takes the database lease
(`job_leases`) runs the pass, so one instance at a time does.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import ScannerUnavailable
from deerflow_web.errors import TooLargeToScan
from deerflow_web.models import ScanState
from deerflow_web.models import ScanVerdict
from deerflow_web.models import UploadRecord
from deerflow_web.services.periodic import PeriodicJob
from deerflow_web.services.scanning.scanner import Scanner
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import make_dirs_with_mode
from deerflow_web.storage.scan_events import QUARANTINED
from deerflow_web.storage.scan_events import ScanEvent
from deerflow_web.storage.scan_events import ScanEvents

logger = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
LEASE_NAME = "rescan"


@dataclass
class RescanReport:
    """What one pass did."""

    signatures: str | None = None
    scanned: int = 0
    clean: int = 0
    quarantined: int = 0
    unscanned: int = 0
    purged: int = 0

    def summary(self) -> str:
        """One line for the command and the log."""
        return (
            f"signatures {self.signatures}: scanned {self.scanned}, clean {self.clean}, "
            f"quarantined {self.quarantined}, still unscanned {self.unscanned}, "
            f"purged {self.purged} expired quarantined file(s)"
        )


def is_due(record: UploadRecord, signatures: str) -> bool:
    """Whether a file needs a scan now: never scanned clean, or scanned clean with other
    signatures than those clamd runs now."""
    if record.scan_state is ScanState.CLEAN:
        return record.scan_signatures != signatures
    return record.scan_state is not ScanState.INFECTED


class Rescanner:
    """One pass over every thread's uploads (`run`), and the periodic job around it."""

    def __init__(
        self,
        uploads: UploadService,
        scanner: Scanner,
        events: ScanEvents,
        leases: JobLeases,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.uploads = uploads
        self.scanner = scanner
        self.events = events
        self.leases = leases
        self.quarantine_dir = uploads.paths.base_dir / QUARANTINE_DIR
        self._clock = clock
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._job: PeriodicJob | None = None

    def run(self, *, everything: bool = False) -> RescanReport:
        """Scan what is due (`everything`: every file) and purge expired quarantine.

        Raises:
            ScannerUnavailable: clamd does not answer; files scanned so far keep their
                new state, the rest are scanned by the next pass.
        """
        report = RescanReport(purged=self._purge_expired())
        signatures = self.scanner.signatures(fresh=True)
        if signatures is None:
            raise ScannerUnavailable(self.scanner.settings.retry_after_seconds)
        report.signatures = signatures
        for summary in self.uploads.records.summaries():
            try:
                thread = self.uploads.paths.folders(self.uploads.paths.parse_scope(summary.scope))
                records = self.uploads.list_uploads(thread)
            except (ValueError, DeerFlowError):
                continue  # not a thread's key, or a folder behind a link: nothing to read
            for record in records:
                if everything or is_due(record, signatures):
                    self._scan_one(thread, record, report)
        logger.info("rescan: %s", report.summary())
        return report

    def _scan_one(self, thread: ThreadFolders, record: UploadRecord, report: RescanReport) -> None:
        path = thread.uploads_dir() / record.filename
        try:
            verdict = self.scanner.scan_file(path, record.filename)
        except TooLargeToScan:
            verdict = ScanVerdict(ScanState.UNSCANNED, reason="larger than the scanner accepts")
        except OSError:
            return  # removed or replaced meanwhile: its next listing and pass see it
        report.scanned += 1
        if verdict.state is ScanState.INFECTED:
            if self._quarantine(thread, record, verdict):
                report.quarantined += 1
            return
        if verdict.state is ScanState.UNSCANNED:
            report.unscanned += 1
        else:
            report.clean += 1
        self.uploads.records.set_scan(
            thread.scope, record.filename, record.sha256, verdict.state, verdict.signatures
        )

    def _quarantine(
        self, thread: ThreadFolders, record: UploadRecord, verdict: ScanVerdict
    ) -> bool:
        make_dirs_with_mode(self.quarantine_dir)
        destination = self.quarantine_dir / f"{secrets.token_hex(8)}.quarantined"
        moved = self.uploads.quarantine_upload(thread, record.filename, record.sha256, destination)
        if not moved:
            return False
        os.chmod(destination, 0o600)
        now = self._clock()
        found = verdict.found or "unknown"
        logger.warning(
            "quarantined upload: user=%s thread=%s name=%r sha256=%s signature=%s",
            thread.ref.owner or "-",
            thread.thread_id,
            record.filename,
            record.sha256,
            found,
        )
        self.events.add(
            ScanEvent(
                QUARANTINED,
                now,
                thread.ref.owner,
                thread.thread_id,
                thread.scope,
                record.filename,
                record.sha256,
                record.size,
                found,
                quarantine_path=str(destination),
                purge_after=now + self.scanner.settings.quarantine_days * 86400,
            )
        )
        return True

    def _purge_expired(self) -> int:
        purged = 0
        for event in self.events.expired_quarantine(self._clock()):
            if event.quarantine_path is not None:
                Path(event.quarantine_path).unlink(missing_ok=True)
            if event.event_id is not None:
                self.events.forget_bytes(event.event_id)
            purged += 1
        return purged

    # The periodic job -------------------------------------------------------------------

    def start(self, interval: float) -> None:
        """Try a pass every `interval` seconds in the background (one instance runs it)."""
        if interval <= 0 or self.is_running:
            return
        self._job = PeriodicJob(
            LEASE_NAME,
            interval,
            lambda: self.run_if_leased(interval),
            skips={ScannerUnavailable: "the virus scanner is unavailable"},
            log=logger,
        )
        self._job.start()

    def stop(self) -> None:
        """Stop the periodic job (tests, shutdown)."""
        if self._job is not None:
            self._job.stop()

    @property
    def is_running(self) -> bool:
        """Whether the periodic passes are on in this process."""
        return self._job is not None and self._job.is_running

    def run_if_leased(self, interval: float) -> RescanReport | None:
        """One pass if this process takes the lease; else None.

        The lease is kept for the interval after the pass started, so the other instances'
        attempts within it find it taken; the holder takes it again at its next attempt.
        """
        now = self._clock()
        if not self.leases.take(LEASE_NAME, self._owner, now, now + max(interval, 60.0)):
            return None
        return self.run()
