"""The text an agent reads for an uploaded document (SPEC D17).

The upload block prints a document's path and an outline whose line numbers come from its
Markdown companion. So `read_file` and `grep` on that path must read the same Markdown: the
recorded companion when it was made from the document's current bytes (same SHA-256), else
a conversion requested through the same background jobs the Convert button uses (same
limits, records and companion naming, D8), waited for up to a budget. Whether a file is a
document is decided by its name and its sniffed type, never by whether its bytes happen to
look like text: a small PDF is mostly ASCII, and its raw syntax is no use to a model.

No Flask, no LangChain: the tools and the chat preview page both read through here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from deerflow_web.errors import ConversionQueueFull
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import CONVERTIBLE_EXTENSIONS
from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.models import suffix_of
from deerflow_web.services.conversion.jobs import INTERRUPTED
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.files.freshness import checked_upload
from deerflow_web.storage.filenames import companion_name
from deerflow_web.storage.local import is_safe_destination
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.sniff import sniff_content_type

DEFAULT_WAIT_SECONDS = 20.0

# Sniffed types of documents; a file of one of them under another name is not read as text.
DOCUMENT_TYPES = {
    "application/pdf": ".pdf",
    "application/msword": ".doc",
    "application/vnd.ms-excel": ".xls",
    "application/vnd.ms-powerpoint": ".ppt",
    "application/x-ole-storage": ".doc, .xls or .ppt",
}


class DocumentNotReadable(DeerFlowError):
    """A document's text cannot be given (yet); the message is written for the model."""


class DocumentStillConverting(DocumentNotReadable):
    """The conversion runs longer than the caller's budget; calling again will find it."""


def is_document_name(name: str) -> bool:
    """Whether the name claims a format that is read through conversion."""
    return suffix_of(name).lower() in CONVERTIBLE_EXTENSIONS


def misnamed_document(name: str, head: bytes) -> str | None:
    """The extension a file's bytes call for when they are a document its name hides."""
    if is_document_name(name):
        return None
    return DOCUMENT_TYPES.get(sniff_content_type(head, name))


def current_companion(
    record: UploadRecord, records: list[UploadRecord] | tuple[UploadRecord, ...]
) -> UploadRecord | None:
    """The companion that describes the document's bytes as they are now, if any.

    A companion records the SHA-256 of the document it was made from. One made before that
    was recorded counts while the document's conversion is marked done; a `.md` found on
    disk under DeerFlow's companion name (its own converter writes `X.md` next to `X.pdf`)
    counts as the outline counts it, so the outline and `read_file` read the same text.
    """
    for other in records:
        if other.converted_from != record.filename:
            continue
        if other.source_sha256 == record.sha256:
            return other
        if other.source_sha256 is None and (
            record.conversion_state is ConversionState.DONE or other.source is RecordSource.DISK
        ):
            return other
    by_name = companion_name(record.filename)
    for other in records:
        if (
            other.filename == by_name
            and other.source is RecordSource.DISK
            and other.converted_from is None
        ):
            return other
    return None


@dataclass(frozen=True)
class DocumentTexts:
    """One thread's documents, read as Markdown through the conversion jobs."""

    jobs: ConversionJobs
    thread: ThreadFolders
    wait_seconds: float = DEFAULT_WAIT_SECONDS

    @property
    def uploads_dir(self) -> Path:
        """The folder whose documents have companions (records cover uploads only)."""
        return self.thread.uploads_dir()

    def _records(self) -> list[UploadRecord]:
        return self.jobs.uploads.list_uploads(self.thread)

    def companions(self) -> dict[str, str]:
        """Current companion name → its document's name, for searches that read documents."""
        records = self._records()
        found = {}
        for record in records:
            if is_document_name(record.filename):
                companion = current_companion(record, records)
                if companion is not None:
                    found[companion.filename] = record.filename
        return found

    def request(self, filename: str) -> None:
        """Start converting a document that has no current companion, without waiting."""
        try:
            self.markdown_path(filename, wait=0.0)
        except DocumentNotReadable:
            pass

    def markdown_path(self, filename: str, *, wait: float | None = None) -> Path:
        """The Markdown file holding the document's current text, converting it if needed.

        Args:
            filename: A document in the thread's uploads folder.
            wait: Seconds to wait for a conversion; None uses `wait_seconds`.

        Raises:
            DocumentStillConverting: The conversion did not finish within `wait`.
            DocumentNotReadable: It failed (legacy format, password, corrupt, no text...).
            UploadNotFound: No such upload.
        """
        records = self._records()
        record = next((r for r in records if r.filename == filename), None)
        if record is None:
            raise UploadNotFound(filename)
        # The document as it is now: an edit in place since the last listing gives it a new
        # SHA-256, so the old companion no longer counts and the new bytes are converted.
        checked = checked_upload(self.jobs.uploads, self.thread, filename)
        if checked is not None and checked.sha256 != record.sha256:
            record = checked
            records = [checked if r.filename == filename else r for r in records]
        companion = current_companion(record, records)
        if companion is None and _failed_before(record):
            # The same bytes failed already; converting them again would fail the same way.
            raise DocumentNotReadable(record.conversion_error or "The conversion failed")
        if companion is None:
            budget = self.wait_seconds if wait is None else wait
            try:
                status = self.jobs.convert(self.thread, filename, wait=budget)
            except ConversionQueueFull as error:
                raise DocumentStillConverting(
                    f"{filename} waits for a free converter ({error}); call again later"
                ) from error
            if status.error is not None:
                raise DocumentNotReadable(str(status.error))
            if not status.finished:
                raise DocumentStillConverting(f"{filename} is still converting")
            companion = current_companion(status.record, self._records())
            if companion is None:  # replaced while it was converted: the next call starts over
                raise DocumentStillConverting(f"{filename} changed while it was converted")
        path = self.uploads_dir / companion.filename
        if not is_safe_destination(path) or not path.is_file():
            raise DocumentStillConverting(f"The Markdown of {filename} is being replaced")
        return path

    def deadline_wait(self, deadline: float) -> float:
        """What is left of a shared budget (a search converting several documents)."""
        return max(deadline - time.monotonic(), 0.0)


def _failed_before(record: UploadRecord) -> bool:
    return (
        record.conversion_state is ConversionState.FAILED and record.conversion_error != INTERRUPTED
    )
