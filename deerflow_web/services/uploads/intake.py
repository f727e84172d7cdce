"""Where every upload lands: the files are saved, then converted when the settings say so.

The JSON API, the file manager's form, the chat preview's form and finished resumable
uploads all hand their files here, so `auto_convert_documents` and `extract_archives`
apply the same way whichever page or client sent them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.errors import ArchiveError
from deerflow_web.errors import NameConflict
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import UploadRecord
from deerflow_web.models import is_archive_name
from deerflow_web.services.archives.extract import ArchiveExtractor
from deerflow_web.services.archives.extract import Extraction
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import AlsoInCommit
from deerflow_web.services.uploads.service import Staging
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.services.uploads.service import UploadService


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
    ) -> None:
        """`extractor` extracts every stored archive; None leaves archives as they are."""
        self.uploads = uploads
        self.conversions = conversions
        self.extractor = extractor

    def _extract(
        self, thread_id: str, result: UploadResult, user_id: str | None
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
                done.append(self.extractor.extract(thread_id, name, user_id=user_id))
            except (ArchiveError, NameConflict) as error:
                done.append((name, str(error)))
        return done

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
        companions = self.conversions.convert_after_upload(thread_id, result, user_id=user_id)
        return AcceptedUploads(result, companions, self._extract(thread_id, result, user_id))

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
        multipart part (see `UploadService.commit_staged`), then convert."""
        result = self.uploads.commit_staged(
            thread_id,
            name,
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=on_conflict,
            user_id=user_id,
            then=then,
        )
        companions = self.conversions.convert_after_upload(thread_id, result, user_id=user_id)
        return AcceptedUploads(result, companions, self._extract(thread_id, result, user_id))
