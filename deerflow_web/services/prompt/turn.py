"""What the uploads middleware decides on each turn, as functions of plain values.

`agent/middleware.py` (LangChain) and `services/prompt/chat_preview.py` (the web preview) both
call these functions; neither decides anything about uploads itself. The middleware only
pulls the inputs out of the runtime and state and puts the result back into a message, and
the preview builds the same inputs from a form. That is what makes the preview page show,
byte for byte, what the model receives (SPEC D11). No Flask, no LangChain here.

Typical use (current mode, SPEC 4.4)::

    turn = current_turn(message_kwargs.get("files"), records, uploads_dir)
    content = compose_text(turn.block, text)     # string content, as the model gets it
    state_update = turn.state_update()           # uploaded_files, uploads
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import UploadRecord
from deerflow_web.services.prompt.context_block import CURRENT_HEADER
from deerflow_web.services.prompt.context_block import DEFAULT_MAX_FILES
from deerflow_web.services.prompt.context_block import INCREMENTAL_HEADER
from deerflow_web.services.prompt.context_block import build_upload_context
from deerflow_web.services.prompt.context_block import context_files_for
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags
from deerflow_web.services.scanning.policy import WAITING
from deerflow_web.storage.paths import is_staging_name


@dataclass(frozen=True)
class UploadTurn:
    """The outcome of one turn: the block for the message and the state keys to write.

    Attributes:
        block: The upload block to put in front of the message; None leaves it unchanged.
        uploaded_files: State `uploaded_files`: this turn's files (4 keys each, SPEC 4.7).
        uploads: State `uploads` (SPEC D10); None when the records could not be read, so
            the key is left out rather than emptied.
        shown_uploads: State `shown_uploads` (incremental mode only, else None).
    """

    block: str | None
    uploaded_files: list[dict[str, Any]]
    uploads: list[dict[str, Any]] | None = None
    shown_uploads: list[dict[str, str]] | None = None

    def state_update(self) -> dict[str, Any]:
        """The state keys this turn writes (without `messages`)."""
        update: dict[str, Any] = {"uploaded_files": list(self.uploaded_files)}
        if self.uploads is not None:
            update["uploads"] = list(self.uploads)
        if self.shown_uploads is not None:
            update["shown_uploads"] = list(self.shown_uploads)
        return update


def file_entry(filename: str, size: int) -> dict[str, Any]:
    """A state `uploaded_files` entry; the path is always rebuilt from the name."""
    return {
        "filename": filename,
        "size": size,
        "path": f"{VIRTUAL_UPLOADS_DIR}/{filename}",
        "extension": Path(filename).suffix,
    }


def record_to_state(record: UploadRecord) -> dict[str, Any]:
    """A record as a plain, JSON-serialisable dict for the agent state key `uploads`."""
    # Enums become their values: checkpointers store plain data, and a model class in the
    # state would tie saved threads to this code.
    data = {
        key: value.value if isinstance(value, enum.Enum) else value
        for key, value in asdict(record).items()
    }
    data["path"] = record.virtual_path
    data["extension"] = record.extension
    return data


def _int_size(raw: Any) -> int:
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        return 0


def message_files(raw_files: Any, uploads_dir: Path | None) -> list[dict[str, Any]]:
    """The valid entries of a message's `additional_kwargs.files`, in order (SPEC 4.4 step 4).

    The client's `path` is ignored: the path is rebuilt from the name, so a message cannot
    point the model at another folder. With a known folder, only existing files count.

    Args:
        raw_files: The `files` value exactly as the message carries it (anything).
        uploads_dir: The thread's uploads folder, or None when the thread is unknown.
    """
    if not isinstance(raw_files, list):
        return []
    files = []
    for entry in raw_files:
        if not isinstance(entry, dict):
            continue
        filename = entry.get("filename") or ""
        if (
            not isinstance(filename, str)
            or not filename
            or filename in {".", ".."}
            or os.path.basename(filename) != filename
            or is_staging_name(filename)
        ):
            continue
        if uploads_dir is not None and not (uploads_dir / filename).is_file():
            continue
        files.append(file_entry(filename, _int_size(entry.get("size"))))
    return files


def _name(entry: Mapping[str, Any] | UploadRecord) -> str:
    if isinstance(entry, Mapping):
        return str(entry.get("filename", ""))
    return entry.filename


def upload_block(
    uploads_dir: Path | None,
    entries: Sequence[Mapping[str, Any] | UploadRecord],
    *,
    max_files: int = DEFAULT_MAX_FILES,
    companions: Iterable[UploadRecord] = (),
    header: str = CURRENT_HEADER,
) -> str:
    """Render the block for `entries`; companions only lend outlines to described entries.

    Outlines are read only for the first `max_files` entries (the ones described in full).
    A companion of an omitted entry is dropped: otherwise nothing would fold it into its
    original, and it would take an entry's place or count as one more omitted file.
    """
    described = entries[:max_files]
    described_names = {_name(entry) for entry in described}
    lenders = [c for c in companions if c.converted_from in described_names]
    shown = context_files_for(uploads_dir, [*described, *lenders])
    omitted = context_files_for(None, entries[max_files:])
    return build_upload_context([*shown, *omitted], max_files=max_files, header=header)


def current_turn(
    raw_files: Any,
    records: Sequence[UploadRecord] | None,
    uploads_dir: Path | None,
    *,
    max_files: int = DEFAULT_MAX_FILES,
    withheld: Mapping[str, str] | None = None,
) -> UploadTurn:
    """Announce the files of this message (SPEC 4.4 steps 4-8, 11; D10).

    Args:
        raw_files: The message's `additional_kwargs.files`, as sent.
        records: The thread's upload records; None when there is no thread or they could
            not be read (then no `uploads` key and no recorded companions).
        uploads_dir: The thread's uploads folder, or None when the thread is unknown
            (files are then announced unchecked and without outlines).
        max_files: Files described in full before the rest are summarised.
        withheld: With virus scanning on, the files the agent may not use yet and why
            (`services/scanning/policy.py`); `records` then holds only the usable ones, and
            a message file not among them is named in a note instead of announced.

    Returns:
        No block when no listed file is valid: this deliberately clears the previous
        turn's `uploaded_files`.
    """
    uploads = None if records is None else [record_to_state(record) for record in records]
    files = message_files(raw_files, uploads_dir)
    note = None
    if withheld is not None:
        usable = {record.filename for record in records or ()}
        held = [entry["filename"] for entry in files if entry["filename"] not in usable]
        files = [entry for entry in files if entry["filename"] in usable]
        note = withheld_note({name: withheld.get(name, WAITING) for name in held})
    if not files:
        return UploadTurn(note, [], uploads)
    # A recorded companion (D8, `a_1.md` included) lends its outline to its original.
    names = {entry["filename"] for entry in files}
    companions = [r for r in records or () if r.converted_from in names and r.filename not in names]
    block = upload_block(uploads_dir, files, max_files=max_files, companions=companions)
    if note is not None:
        block = f"{block}\n\n{note}"
    return UploadTurn(block, files, uploads)


def withheld_note(withheld: Mapping[str, str]) -> str | None:
    """Tell the model which attached files it cannot use yet and why; None when none."""
    if not withheld:
        return None
    lines = ["<withheld_uploads>", "These attached files cannot be used yet:"]
    for name, reason in withheld.items():
        lines.append(f"- {neutralize_untrusted_tags(name)}: {reason}")
    lines.append("</withheld_uploads>")
    return "\n".join(lines)


def shown_pairs(raw: Any) -> set[tuple[str, str]]:
    """The (filename, sha256) pairs of a state `shown_uploads` value; junk is ignored."""
    pairs = set()
    for item in raw or []:
        if isinstance(item, dict):
            name, digest = item.get("filename"), item.get("sha256")
            if isinstance(name, str) and isinstance(digest, str):
                pairs.add((name, digest))
    return pairs


def incremental_turn(
    records: Sequence[UploadRecord],
    shown_uploads: Any,
    uploads_dir: Path | None,
    *,
    max_files: int = DEFAULT_MAX_FILES,
) -> UploadTurn:
    """Announce every upload not shown yet, by name and content (D11's incremental mode).

    Args:
        records: The thread's upload records.
        shown_uploads: The previous state `shown_uploads` (`{"filename", "sha256"}` dicts).
        uploads_dir: The thread's uploads folder, for outlines.
        max_files: Files described in full before the rest are summarised.

    Returns:
        The new files as `uploaded_files`, and `shown_uploads` updated: pairs whose file is
        gone or changed are forgotten, so new content under an old name is announced again.
    """
    names = {record.filename for record in records}
    companions = [r for r in records if r.converted_from and r.converted_from in names]
    companion_names = {record.filename for record in companions}
    shown_before = shown_pairs(shown_uploads)
    new = sorted(
        (
            record
            for record in records
            if record.filename not in companion_names
            and (record.filename, record.sha256) not in shown_before
        ),
        key=lambda record: record.filename,
    )
    present = {(record.filename, record.sha256) for record in records}
    shown_now = (shown_before & present) | {(r.filename, r.sha256) for r in new}
    shown_state = [{"filename": name, "sha256": digest} for name, digest in sorted(shown_now)]
    uploads = [record_to_state(record) for record in records]
    if not new:
        return UploadTurn(None, [], uploads, shown_state)
    block = upload_block(
        uploads_dir, new, max_files=max_files, companions=companions, header=INCREMENTAL_HEADER
    )
    entries = [file_entry(record.filename, record.size) for record in new]
    return UploadTurn(block, entries, uploads, shown_state)


def compose_text(block: str | None, text: str) -> str:
    """The text the model reads: the block, a blank line, then the person's text.

    For list content the middleware passes `text=""` and puts the result in a new first
    text element, so both content shapes share this one seam (SPEC 4.4 step 8).
    """
    if block is None:
        return text
    return f"{block}\n\n{text}"
