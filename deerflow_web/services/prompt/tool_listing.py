"""The result of `list_uploaded_files` (SPEC 4.6 with D12), from upload records.

Pure apart from reading the uploads folder (does it exist, Markdown companions for
outlines): the LangChain tool finds the thread, the records and the current run's names,
and this module decides what the model sees. The chat preview page calls the same
`list_uploaded_files_result`, so it shows exactly what the tool would return. Every string
in the result is neutralised, so the serialised JSON never carries a raw blocked tag or
boundary marker (SPEC 4.6 step 12).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from pathlib import PurePosixPath
from typing import Any

from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import UploadRecord
from deerflow_web.services.prompt.context_block import format_omitted_summary
from deerflow_web.services.prompt.outline import outline_for_file
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize

logger = logging.getLogger(__name__)

DEFAULT_MAX_RESULTS = 20
MAX_RESULTS_CAP = 100
NO_HISTORY = "No historical uploaded files in this thread."
NO_FILTER_MATCH = "No uploaded files matched the given filters."
NO_UPLOADS_DIR = "No uploads directory for this thread."
READ_FAILED = f"Failed to read uploads directory: {VIRTUAL_UPLOADS_DIR}"


def clamp_max_results(value: int) -> int:
    """Keep `max_results` within [1, 100] (0 or negative → 1, 999 → 100)."""
    return min(max(value, 1), MAX_RESULTS_CAP)


def normalize_extensions(extensions: Iterable[Any] | str | None) -> set[str]:
    """`"pdf"`, `".PDF"` → `.pdf`; blank or invalid entries are dropped (no filter if none)."""
    if extensions is None:
        return set()
    items = [extensions] if isinstance(extensions, str) else list(extensions)
    normalized = set()
    for item in items:
        if not isinstance(item, str):
            continue
        value = item.strip().lower()
        if not value:
            continue
        value = value if value.startswith(".") else f".{value}"
        if value == "." or "/" in value or any(char.isspace() for char in value):
            continue
        normalized.add(value)
    return normalized


def _companions(records: Sequence[UploadRecord]) -> dict[str, str]:
    names = {record.filename for record in records}
    companions: dict[str, str] = {}
    for record in records:
        if record.converted_from and record.converted_from in names:
            companions.setdefault(record.converted_from, record.filename)
    return companions


def _neutral_outline(outline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**entry, "title": neutralize(str(entry["title"]))} if "title" in entry else dict(entry)
        for entry in outline
    ]


def _wants_outline(include_outline: bool | Collection[str], name: str) -> bool:
    if isinstance(include_outline, bool):
        return include_outline
    return name in include_outline


def _file_result(
    record: UploadRecord,
    uploads_dir: Path,
    companion: str | None,
    include_outline: bool | Collection[str],
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "filename": neutralize(record.filename),
        "size": int(record.size),
        "path": neutralize(record.virtual_path),
        "extension": neutralize(record.extension),
    }
    if _wants_outline(include_outline, record.filename):
        companion_path = uploads_dir / companion if companion else None
        outline, preview = outline_for_file(uploads_dir / record.filename, companion_path)
        if outline:
            entry["outline"] = _neutral_outline(outline)
        if preview:
            entry["outline_preview"] = [neutralize(line) for line in preview]
    return entry


def historical_uploads(
    records: Sequence[UploadRecord],
    uploads_dir: Path,
    *,
    current_names: Collection[str] = (),
    include_outline: bool | Collection[str] = False,
    max_results: int = DEFAULT_MAX_RESULTS,
    query: str | None = None,
    extensions: Iterable[Any] | str | None = None,
) -> dict[str, Any]:
    """List the uploads of earlier turns, newest first, filtered, capped and neutralised.

    Args:
        records: The thread's upload records (companions carry `converted_from`).
        uploads_dir: The thread's uploads folder, for reading outlines.
        current_names: This run's files (state `uploaded_files`); already in the prompt.
        include_outline: True for every listed file, or the exact names that want one.
        max_results: Cap on listed files, clamped to [1, 100].
        query: Case-insensitive part of a filename; blank means no filter.
        extensions: Extensions to keep (`"pdf"` or `".PDF"`); none valid means no filter.

    Returns:
        `{"files", "total_count", "message"}` plus `truncated`/`omitted_summary` when capped,
        or `{"files": [], "message"}` when nothing is left.
    """
    companions = _companions(records)
    hidden = set(companions.values())
    candidates = [
        record
        for record in records
        if record.filename not in current_names and record.filename not in hidden
    ]
    if not candidates:
        return {"files": [], "message": NO_HISTORY}
    needle = (query or "").strip().casefold()
    wanted = normalize_extensions(extensions)
    filtered = [
        record
        for record in candidates
        if (not needle or needle in record.filename.casefold())
        and (not wanted or PurePosixPath(record.filename).suffix.lower() in wanted)
    ]
    if not filtered:
        return {"files": [], "message": NO_FILTER_MATCH}
    filtered.sort(key=lambda record: (-record.modified, record.filename))
    limit = clamp_max_results(max_results)
    visible, omitted = filtered[:limit], filtered[limit:]
    result: dict[str, Any] = {
        "files": [
            _file_result(record, uploads_dir, companions.get(record.filename), include_outline)
            for record in visible
        ],
        "total_count": len(filtered),
        "message": f"Found {len(filtered)} historical file(s).",
    }
    if omitted:
        result["truncated"] = True
        result["omitted_summary"] = format_omitted_summary(record.filename for record in omitted)
    return result


def list_uploaded_files_result(
    uploads_dir: Path,
    load_records: Callable[[], Sequence[UploadRecord]],
    *,
    current_names: Collection[str] = (),
    include_outline: bool | Collection[str] = False,
    max_results: int = DEFAULT_MAX_RESULTS,
    query: str | None = None,
    extensions: Iterable[Any] | str | None = None,
    withheld: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What `list_uploaded_files` returns for a thread whose folder and records are known.

    The tool and the chat preview both call this, so the missing-folder and unreadable-folder
    answers (SPEC 4.6 steps 3 and 7) are the same on both sides, not only the listing.

    Args:
        uploads_dir: The thread's uploads folder on the host.
        load_records: Reads the thread's records; called only when the folder exists, and
            an `OSError` from it becomes the "failed to read" answer instead of an error.
        current_names: This run's files (state `uploaded_files`).
        include_outline: As `historical_uploads`.
        max_results: As `historical_uploads`.
        query: As `historical_uploads`.
        extensions: As `historical_uploads`.
        withheld: Files held back by virus scanning (name -> why), left out of the list
            and named under `withheld`, so the model can say why it cannot use them.

    Returns:
        The tool's result dict.
    """
    if not uploads_dir.is_dir():
        return {"files": [], "message": NO_UPLOADS_DIR}
    try:
        records = load_records()
    except OSError:
        logger.warning("cannot read the uploads in %s", uploads_dir, exc_info=True)
        return {"files": [], "message": READ_FAILED}
    result = historical_uploads(
        records,
        uploads_dir,
        current_names=current_names,
        include_outline=include_outline,
        max_results=max_results,
        query=query,
        extensions=extensions,
    )
    if withheld:
        result["withheld"] = [
            {"filename": neutralize(name), "reason": reason} for name, reason in withheld.items()
        ]
    return result
