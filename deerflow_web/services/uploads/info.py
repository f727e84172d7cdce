"""The `UploadedFileInfo` shape of DeerFlow's gateway (SPEC 2.1.6, D4, D5), built from records.

One formatter shapes the upload (`upload_response`), list, rename and convert responses,
so they can never drift apart; the few fields that differ between an upload and a listing
follow SPEC's table.
Everything that depends only on the folder is worked out once per response, because a
listing of a thousand files must stay fast.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import Area
from deerflow_web.models import UploadRecord
from deerflow_web.services.archives.extract import Extraction
from deerflow_web.services.files.artifacts import artifact_url
from deerflow_web.services.files.record_cache import RecordCache
from deerflow_web.services.uploads.service import RejectedFile
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.storage.paths import ThreadFolders

CACHED_LISTINGS = 32  # folders whose formatted listing each process keeps
_URL_SAFE = re.compile(r"[A-Za-z0-9_.~-]+")  # what quote(name, safe="") leaves unchanged


_listings: RecordCache[list[dict[str, Any]]] = RecordCache(CACHED_LISTINGS)


def display_path(path: Path) -> str:
    """Host path relative to the working dir when the data lies inside it (SPEC D4)."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


class UploadInfoFormatter:
    """Shapes the records of one thread's uploads folder for the JSON API."""

    def __init__(self, thread_id: str, folder: Path) -> None:
        self._folder = display_path(folder) + os.sep
        self._url_prefix = artifact_url(thread_id, VIRTUAL_UPLOADS_DIR) + "/"
        self._virtual_prefix = VIRTUAL_UPLOADS_DIR + "/"

    @classmethod
    def for_thread(cls, folders: ThreadFolders) -> UploadInfoFormatter:
        """For the thread of a handle. Its folder is named, not opened: answering from
        the records reads no file (on the S3 backend, fetches none)."""
        return cls(folders.thread_id, folders.area_location(Area.UPLOADS))

    def _url(self, filename: str) -> str:
        if _URL_SAFE.fullmatch(filename):
            return self._url_prefix + filename
        return self._url_prefix + quote(filename, safe="")

    def __call__(
        self,
        record: UploadRecord,
        *,
        companion: UploadRecord | None = None,
        in_upload_response: bool = False,
        duplicate_of: str | None = None,
    ) -> dict[str, Any]:
        """One file as DeerFlow's clients expect it, plus our own keys (never fewer)."""
        state = record.conversion_state
        info: dict[str, Any] = {
            "filename": record.filename,
            "size": record.size,
            "path": self._folder + record.filename,
            "virtual_path": self._virtual_prefix + record.filename,
            "artifact_url": self._url(record.filename),
            "extension": None if in_upload_response else record.extension,
            "modified": None if in_upload_response else record.modified,
            "original_filename": record.original_filename if in_upload_response else None,
            "markdown_file": None,
            "markdown_path": None,
            "markdown_virtual_path": None,
            "markdown_artifact_url": None,
            "sha256": record.sha256,
            "content_type": record.content_type,
            "uploaded_at": record.uploaded_at,
            "duplicate_of": duplicate_of,
            "converted_from": record.converted_from,
            "conversion_state": state.value if state else None,
            "conversion_error": record.conversion_error,
            "scan_state": record.scan_state.value if record.scan_state else None,
            "scan_signatures": record.scan_signatures,
        }
        if companion is not None:
            info["markdown_file"] = companion.filename
            info["markdown_path"] = self._folder + companion.filename
            info["markdown_virtual_path"] = companion.virtual_path
            info["markdown_artifact_url"] = self._url(companion.filename)
        return info

    def upload_response(
        self,
        result: UploadResult,
        companions: Mapping[str, UploadRecord],
        extractions: Sequence[Extraction | tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """DeerFlow's UploadResponse for one request: its files (with the companions made
        within the conversion wait), what was skipped and what was rejected; with
        `uploads.extract_archives`, each archive's extraction. When the virus scanner is
        why nothing was stored, a `detail` for DeerFlow's clients too (the view answers
        422 then)."""
        body: dict[str, Any] = {
            "success": result.success,
            "files": [
                self(
                    saved.record,
                    companion=companions.get(saved.record.filename),
                    in_upload_response=True,
                    duplicate_of=saved.duplicate_of,
                )
                for saved in result.files
            ],
            "message": result.message,
            "skipped_files": result.skipped_files,
            "rejected_files": [_rejection(rejected) for rejected in result.rejected_files],
        }
        if extractions:
            body["extracted"] = [_extraction(extraction) for extraction in extractions]
        if result.infected and not result.files:
            body["detail"] = "; ".join(
                f"{r.filename}: the virus scanner found {r.found}" for r in result.infected
            )
        return body

    def listing(self, records: Sequence[UploadRecord]) -> list[dict[str, Any]]:
        """A whole folder, each original pointing at the companion converted from it.

        The result may be shared with other requests for the same unchanged folder:
        serialise it, never modify it.
        """
        key = (self._url_prefix, self._folder)
        cached = _listings.get(key, records)
        if cached is not None:
            return cached
        companions = {r.converted_from: r for r in records if r.converted_from is not None}
        files = [self(record, companion=companions.get(record.filename)) for record in records]
        _listings.put(key, records, files)
        return files


def _rejection(rejected: RejectedFile) -> dict[str, str]:
    """A refused part; `found` (the signature) only when the virus scanner refused it."""
    entry = {"filename": rejected.filename, "reason": rejected.reason}
    if rejected.found is not None:
        entry["found"] = rejected.found
    return entry


def _extraction(extraction: Extraction | tuple[str, str]) -> dict[str, Any]:
    """One archive of an upload answer: what was extracted, or why it was not."""
    if isinstance(extraction, tuple):
        archive, reason = extraction
        return {"archive": archive, "folder": None, "files": [], "refused": [], "error": reason}
    return extraction.as_dict()
