"""Where every upload lands: the files are saved, then converted when the settings say so.

The JSON API, the file manager's form, the chat preview's form and finished resumable
uploads all hand their files here, so `auto_convert_documents` applies the same way
whichever page or client sent them. With scanning on, a multipart part is scanned while
it streams (`UploadService.save_uploads`) and a finished resumable upload from its staging
file before its commit (its bytes came over many requests, which one INSTREAM connection
cannot span); what the scanner refused is logged here (`RefusalLog`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.errors import InfectedFile
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ScanState
from deerflow_web.models import UploadRecord
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.scanning.events import RefusalLog
from deerflow_web.services.scanning.scanner import Scanner
from deerflow_web.services.uploads.service import AlsoInCommit
from deerflow_web.services.uploads.service import Staging
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.services.uploads.service import UploadService


@dataclass(frozen=True)
class AcceptedUploads:
    """What was saved, and the companions made within the conversion wait, by original."""

    result: UploadResult
    companions: dict[str, UploadRecord] = field(default_factory=dict)


class UploadIntake:
    """Save a request's files and start their automatic conversion."""

    def __init__(
        self,
        uploads: UploadService,
        conversions: ConversionJobs,
        scanner: Scanner | None = None,
        refusals: RefusalLog | None = None,
    ) -> None:
        self.uploads = uploads
        self.conversions = conversions
        self.scanner = scanner
        self.refusals = refusals

    def accept(
        self,
        thread_id: str,
        files: Iterable[IncomingFile],
        *,
        on_conflict: OnConflict,
        user_id: str | None = None,
    ) -> AcceptedUploads:
        """Save `files` (all or nothing, see `UploadService.save_uploads`), then convert."""
        result = self.uploads.save_uploads(
            thread_id, files, on_conflict=on_conflict, user_id=user_id
        )
        self._report(
            thread_id,
            user_id,
            [(r.filename, r.sha256, r.size, r.found or "") for r in result.infected],
        )
        companions = self.conversions.convert_after_upload(thread_id, result, user_id=user_id)
        return AcceptedUploads(result, companions)

    def accept_staged(
        self,
        thread_id: str,
        name: str,
        staging: Staging,
        *,
        sha256: str,
        content_type: str,
        on_conflict: OnConflict,
        user_id: str | None = None,
        then: AlsoInCommit | None = None,
    ) -> AcceptedUploads:
        """Commit a file staged elsewhere (a finished resumable upload) exactly as a
        multipart part (see `UploadService.commit_staged`), then convert.

        Raises:
            InfectedFile: The scanner found something; nothing was committed (the caller
                discards the staging file).
            ScannerUnavailable, TooLargeToScan: Not scanned, and the policy refuses; the
                staging file stays, for a later retry.
        """
        verdict = None
        if self.scanner is not None:
            verdict = self.scanner.scan_file(staging.path, name)
            if verdict.state is ScanState.INFECTED:
                found = verdict.found or "unknown"
                size = staging.path.stat().st_size
                self._report(thread_id, user_id, [(name, sha256, size, found)])
                raise InfectedFile(name, found)
        result = self.uploads.commit_staged(
            thread_id,
            name,
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=on_conflict,
            user_id=user_id,
            then=then,
            verdict=verdict,
        )
        companions = self.conversions.convert_after_upload(thread_id, result, user_id=user_id)
        return AcceptedUploads(result, companions)

    def _report(
        self,
        thread_id: str,
        user_id: str | None,
        refusals: list[tuple[str, str | None, int | None, str]],
    ) -> None:
        if refusals and self.refusals is not None:
            scope = self.uploads.paths.scope(thread_id, user_id)
            self.refusals.refused(
                user_id=user_id, thread_id=thread_id, scope=scope, refusals=refusals
            )
