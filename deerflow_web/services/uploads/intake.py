"""Where every upload lands: the files are saved, then converted when the settings say so.

The JSON API, the file manager's form, the chat preview's form and finished resumable
uploads all hand their files here, so `auto_convert_documents` applies the same way
whichever page or client sent them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import UploadRecord
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import AlsoInCommit
from deerflow_web.services.uploads.service import Staging
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.paths import Thread


@dataclass(frozen=True)
class AcceptedUploads:
    """What was saved, and the companions made within the conversion wait, by original."""

    result: UploadResult
    companions: dict[str, UploadRecord] = field(default_factory=dict)


class UploadIntake:
    """Save a request's files and start their automatic conversion."""

    def __init__(self, uploads: UploadService, conversions: ConversionJobs) -> None:
        self.uploads = uploads
        self.conversions = conversions

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
        companions = self.conversions.convert_after_upload(folders, result)
        return AcceptedUploads(result, companions)

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
    ) -> AcceptedUploads:
        """Commit a file staged elsewhere (a finished resumable upload) exactly as a
        multipart part (see `UploadService.commit_staged`), then convert."""
        folders = self.uploads.folders(thread)
        result = self.uploads.commit_staged(
            folders,
            name,
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=on_conflict,
            then=then,
        )
        companions = self.conversions.convert_after_upload(folders, result)
        return AcceptedUploads(result, companions)
