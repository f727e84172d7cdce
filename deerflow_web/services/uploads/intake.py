"""Where every upload lands: the files are saved, then converted when the settings say so.

The JSON API, the file manager's form, the chat preview's form and finished resumable
uploads all hand their files here, so `auto_convert_documents` and `extract_archives`
apply the same way whichever page or client sent them. With scanning on, a multipart part
is scanned while it streams (`UploadService.save_uploads`) and a finished resumable upload
from its staging file before its commit (its bytes came over many requests, which one
INSTREAM connection cannot span); what the scanner refused is logged here (`RefusalLog`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.errors import ArchiveError
from deerflow_web.errors import InfectedFile
from deerflow_web.errors import NameConflict
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ScanState
from deerflow_web.models import UploadRecord
from deerflow_web.models import is_archive_name
from deerflow_web.services.archives.extract import ArchiveExtractor
from deerflow_web.services.archives.extract import Extraction
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.scanning.events import RefusalLog
from deerflow_web.services.scanning.scanner import Scanner
from deerflow_web.services.uploads.service import AlsoInCommit
from deerflow_web.services.uploads.service import Staging
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders

# What one refusal reports: (filename, sha256, size, signature).
Refusal = tuple[str, str | None, int | None, str]


@dataclass(frozen=True)
class AcceptedUploads:
    """What was saved, and the companions made within the conversion wait, by original."""

    result: UploadResult
    companions: dict[str, UploadRecord] = field(default_factory=dict)
    # With `uploads.extract_archives`: each stored archive's extraction, or why it failed.
    extractions: list[Extraction | tuple[str, str]] = field(default_factory=list)


class UploadIntake:
    """Save a request's files and start their automatic conversion (and extraction)."""

    def __init__(
        self,
        uploads: UploadService,
        conversions: ConversionJobs,
        extractor: ArchiveExtractor | None = None,
        scanner: Scanner | None = None,
        refusals: RefusalLog | None = None,
    ) -> None:
        """`extractor` extracts every stored archive; None leaves archives as they are."""
        self.uploads = uploads
        self.conversions = conversions
        self.extractor = extractor
        self.scanner = scanner
        self.refusals = refusals

    def _extract(
        self, thread: ThreadFolders, result: UploadResult
    ) -> list[Extraction | tuple[str, str]]:
        """Extract each stored archive; a refused one stays stored, its refusal reported."""
        if self.extractor is None:
            return []
        done: list[Extraction | tuple[str, str]] = []
        for saved in result.files:
            name = saved.record.filename
            if not is_archive_name(name):
                continue
            try:
                done.append(self.extractor.extract(thread, name))
            except (ArchiveError, NameConflict) as error:
                done.append((name, str(error)))
        return done

    def accept(
        self,
        thread: Thread,
        files: Iterable[IncomingFile],
        *,
        on_conflict: OnConflict,
    ) -> AcceptedUploads:
        """Save `files` (all or nothing, see `UploadService.save_uploads`), then convert."""
        folders = self.uploads.folders(thread)
        result = self.uploads.save_uploads(folders, files, on_conflict=on_conflict)
        infected = [(r.filename, r.sha256, r.size, r.found or "") for r in result.infected]
        self._report(folders, infected)
        companions = self.conversions.convert_after_upload(folders, result)
        return AcceptedUploads(result, companions, self._extract(folders, result))

    def accept_staged(
        self,
        thread: Thread,
        name: str,
        staging: Staging,
        *,
        sha256: str,
        content_type: str,
        on_conflict: OnConflict,
        then: AlsoInCommit | None = None,
        reserved: int = 0,
    ) -> AcceptedUploads:
        """Commit a file staged elsewhere (a finished resumable upload) exactly as a
        multipart part (see `UploadService.commit_staged`), then convert.

        Raises:
            InfectedFile: The scanner found something; nothing was committed (the caller
                discards the staging file).
            ScannerUnavailable, TooLargeToScan: Not scanned, and the policy refuses; the
                staging file stays, for a later retry.
        """
        folders = self.uploads.folders(thread)
        verdict = None
        if self.scanner is not None:
            verdict = self.scanner.scan_file(staging.path, name)
            if verdict.state is ScanState.INFECTED:
                found = verdict.found or "unknown"
                self._report(folders, [(name, sha256, staging.path.stat().st_size, found)])
                raise InfectedFile(name, found)
        result = self.uploads.commit_staged(
            folders,
            name,
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=on_conflict,
            then=then,
            verdict=verdict,
            reserved=reserved,
        )
        companions = self.conversions.convert_after_upload(folders, result)
        return AcceptedUploads(result, companions, self._extract(folders, result))

    def _report(self, folders: ThreadFolders, refusals: list[Refusal]) -> None:
        if refusals and self.refusals is not None:
            self.refusals.refused(
                user_id=folders.ref.owner,
                thread_id=folders.thread_id,
                scope=folders.scope,
                refusals=refusals,
            )
