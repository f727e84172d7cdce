"""The `UploadedFileInfo` shape of DeerFlow's gateway (SPEC 2.1.6, D4, D5), built from records.

One function shapes both the upload and the list response, so the two can never drift
apart; the few fields that differ between them follow SPEC's table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deerflow_web.models import UploadRecord
from deerflow_web.services.artifacts import artifact_url


def display_path(path: Path) -> str:
    """Host path relative to the working dir when the data lies inside it (SPEC D4)."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def companions_by_original(records: Sequence[UploadRecord]) -> dict[str, UploadRecord]:
    """Map each original's name to the companion conversion produced from it."""
    return {r.converted_from: r for r in records if r.converted_from is not None}


def upload_info(
    record: UploadRecord,
    *,
    thread_id: str,
    folder: Path,
    companion: UploadRecord | None = None,
    in_upload_response: bool = False,
    duplicate_of: str | None = None,
) -> dict[str, Any]:
    """One file as DeerFlow's clients expect it, plus our own keys (never fewer)."""
    shown_folder = display_path(folder)
    info: dict[str, Any] = {
        "filename": record.filename,
        "size": record.size,
        "path": f"{shown_folder}{os.sep}{record.filename}",
        "virtual_path": record.virtual_path,
        "artifact_url": artifact_url(thread_id, record.virtual_path),
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
        "conversion_state": record.conversion_state.value if record.conversion_state else None,
        "conversion_error": record.conversion_error,
    }
    if companion is not None:
        info.update(
            markdown_file=companion.filename,
            markdown_path=f"{shown_folder}{os.sep}{companion.filename}",
            markdown_virtual_path=companion.virtual_path,
            markdown_artifact_url=artifact_url(thread_id, companion.virtual_path),
        )
    return info
