"""The ONE builder of the upload context the model reads (SPEC 4.4.1, 4.5, D11).

The agent middleware and the web chat-preview page both render through these functions,
so the preview shows, byte for byte, what the model receives. Pure: no Flask, no LangChain;
the only file access is `context_files_for`, which reads Markdown companions for outlines.

Typical use::

    files = context_files_for(uploads_dir, records_or_state_entries)
    block = build_upload_context(files)            # "<current_uploads>...</current_uploads>"
    shown_text = strip_upload_blocks(message_text)  # what a UI shows of the person's message
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from pathlib import PurePosixPath
from typing import Any

from deerflow_web.errors import ArchiveRefused
from deerflow_web.errors import DeerFlowError
from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import UploadRecord
from deerflow_web.models import is_archive_name
from deerflow_web.services.archives.reader import list_archive
from deerflow_web.services.prompt.outline import outline_for_file
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize
from deerflow_web.settings import ArchiveLimits

DEFAULT_MAX_FILES = 10
CURRENT_HEADER = "The following files were uploaded in this message:"
INCREMENTAL_HEADER = "The following files were added to this conversation since it last saw them:"
NO_EXTENSION = "(no extension)"
LEGACY_EMPTY_BLOCK = "<uploaded_files>\nNo files have been uploaded yet.\n</uploaded_files>"

_GUIDANCE = (
    "To work with these files:",
    "- Read from the file first — use the outline line numbers and `read_file` to locate "
    "relevant sections.",
    "- Use `grep` when you are unsure which section to read, for example:",
    '  grep(pattern="keyword", path="/mnt/user-data/uploads/")',
    "- Use `glob` to find files by name pattern, for example:",
    '  glob(pattern="**/*.md", path="/mnt/user-data/uploads/")',
    "- Use web search only as a last resort, when these files are clearly insufficient.",
)

_UPLOAD_BLOCK = re.compile(r"<(current_uploads|uploaded_files)>.*?</\1>[ \t]*(?:\r?\n)*", re.DOTALL)


@dataclass(frozen=True)
class ContextFile:
    """One file as the context block shows it.

    Values are raw (as stored); the builder neutralises them while rendering, so callers
    never have to remember to.
    """

    filename: str
    size: int
    path: str
    extension: str
    outline: tuple[Mapping[str, Any], ...] = ()
    preview: tuple[str, ...] = ()
    archive: ArchiveSummary | None = None


@dataclass(frozen=True)
class ArchiveSummary:
    """What the block says of an archive: how many files it holds, or why it is refused."""

    files: int = 0
    refused_members: int = 0
    refused: str | None = None  # the whole archive's refusal


def summarize_archive(path: Path, limits: ArchiveLimits | None = None) -> ArchiveSummary | None:
    """The member count of an archive on disk, or its refusal; None for a non-archive."""
    if not is_archive_name(path.name):
        return None
    try:
        listing = list_archive(path, limits or ArchiveLimits())
    except ArchiveRefused as refused:
        return ArchiveSummary(refused=refused.reason)
    except DeerFlowError:
        return None
    return ArchiveSummary(files=len(listing.files), refused_members=len(listing.refused))


def format_size(size: int) -> str:
    """Render a byte count the way DeerFlow's blocks do: KB below 1024 KB, else MB.

    There is no GB step (5 GiB is `5120.0 MB`); clients parse this exact form.
    """
    kb = size / 1024
    if kb < 1024:
        return f"{kb:.1f} KB"
    return f"{kb / 1024:.1f} MB"


def _extension_label(extension: str) -> str:
    label = extension.lower()
    return neutralize(label) if label else NO_EXTENSION


def _summary(extensions: Iterable[str]) -> str:
    counts = Counter(_extension_label(extension) for extension in extensions)
    return neutralize(", ".join(f"{counts[label]} {label}" for label in sorted(counts)))


def format_omitted_summary(filenames: Iterable[str]) -> str:
    """Count omitted files per extension: `1 (no extension), 2 .pdf, 1 .txt`.

    Args:
        filenames: Names of the files left out (extensions are taken from the names).

    Returns:
        The neutralised summary, labels in plain string order.
    """
    return _summary(PurePosixPath(name).suffix for name in filenames)


def _outline_lines(file: ContextFile) -> list[str]:
    entries = [entry for entry in file.outline if "title" in entry]
    if entries:
        lines = ["  Document outline (use `read_file` with these line numbers to read a section):"]
        lines.extend(
            f"    L{entry['line']}: {neutralize(str(entry['title']))}" for entry in entries
        )
        if any(entry.get("truncated") for entry in file.outline):
            lines.append(
                f"    ... (showing first {len(entries)} headings; "
                "use `read_file` to explore further)"
            )
        return lines
    lines = []
    if file.preview:
        lines.append("  No structural headings detected. The document begins with:")
        lines.extend(f"    > {neutralize(line)}" for line in file.preview)
    lines.append("  Use `grep` on /mnt/user-data/uploads/ to search this file for keywords.")
    return lines


def _archive_lines(file: ContextFile) -> list[str]:
    archive = file.archive
    if archive is None:
        return []
    if archive.refused is not None:
        return [f"  Archive refused, its members cannot be read: {neutralize(archive.refused)}"]
    line = (
        f"  Archive of {archive.files} file(s): read or grep a member at its path inside, "
        f"such as {neutralize(file.path)}/<member>"
    )
    if archive.refused_members:
        line += f" ({archive.refused_members} member(s) refused; read_file on it lists why)"
    return [line]


def _entry_lines(file: ContextFile) -> list[str]:
    if file.archive is not None:  # an outline or preview of the archive's bytes says nothing
        return [
            f"- {neutralize(file.filename)} ({format_size(file.size)})",
            f"  Path: {neutralize(file.path)}",
            *_archive_lines(file),
            "",
        ]
    return [
        f"- {neutralize(file.filename)} ({format_size(file.size)})",
        f"  Path: {neutralize(file.path)}",
        *_outline_lines(file),
        "",
    ]


def _omitted_lines(omitted: Sequence[ContextFile]) -> list[str]:
    summary = _summary(file.extension or PurePosixPath(file.filename).suffix for file in omitted)
    return [
        f"... ({len(omitted)} more file(s) from this message omitted from this context.)",
        f"  Omitted file types: {summary}",
        "  Use `glob` with pattern '**/*' on /mnt/user-data/uploads/ to list all uploads.",
        "  Use `grep` with a keyword on /mnt/user-data/uploads/ to search across uploads.",
        "",
    ]


def build_upload_context(
    files: Sequence[ContextFile],
    *,
    max_files: int = DEFAULT_MAX_FILES,
    header: str = CURRENT_HEADER,
) -> str:
    """Render the `<current_uploads>` block (SPEC 4.4.1).

    The first `max_files` files are described (with outline or preview when attached); the
    rest are summarised by extension so a long upload does not flood the prompt.

    Args:
        files: The files to announce, in the order they should appear.
        max_files: How many files to describe before summarising the rest (at least 1).
        header: The sentence after the opening tag; the incremental mode says "added since".

    Returns:
        The block, without a trailing newline.

    Raises:
        ValueError: If `max_files` is below 1.
    """
    if max_files < 1:
        raise ValueError("max_files must be at least 1")
    shown, omitted = files[:max_files], files[max_files:]
    lines = ["<current_uploads>", header, ""]
    for file in shown:
        lines.extend(_entry_lines(file))
    if omitted:
        lines.extend(_omitted_lines(omitted))
    if not shown:
        lines.extend(["(empty)", ""])
    lines.extend(_GUIDANCE)
    lines.append("</current_uploads>")
    return "\n".join(lines)


def build_legacy_upload_block(files: Sequence[ContextFile]) -> str:
    """Render doc A's `<uploaded_files>` block (SPEC 4.5) for the legacy middleware mode.

    SPEC 4.5 leaves the names raw; they are neutralised here anyway, because 4.1 applies to
    every user value in a server-written block. Clients parse `- name (size)` lines either way.
    """
    if not files:
        return LEGACY_EMPTY_BLOCK
    lines = [
        "<uploaded_files>",
        "The following files have been uploaded and are available for use:",
        "",
    ]
    for file in files:
        lines.append(f"- {neutralize(file.filename)} ({format_size(file.size)})")
        lines.append(f"  Path: {neutralize(file.path)}")
        lines.append("")
    lines.append("You can read these files using the `read_file` tool with the paths shown above.")
    lines.append("</uploaded_files>")
    return "\n".join(lines)


def strip_upload_blocks(text: str) -> str:
    """Remove `<current_uploads>` and `<uploaded_files>` blocks from a message's text.

    UIs show the person's own words; the blocks are server context (SPEC 2.7).
    """
    return _UPLOAD_BLOCK.sub("", text)


def _field(entry: Mapping[str, Any] | UploadRecord, name: str, default: Any = None) -> Any:
    if isinstance(entry, Mapping):
        return entry.get(name, default)
    return getattr(entry, name, default)


def _as_context_file(
    entry: Mapping[str, Any] | UploadRecord,
    uploads_dir: Path | None,
    companion: str | None,
    archive_limits: ArchiveLimits | None = None,
) -> ContextFile:
    filename = str(_field(entry, "filename", ""))
    extension = _field(entry, "extension")
    outline: list[dict[str, Any]] = []
    preview: list[str] = []
    archive = None
    if uploads_dir is not None and is_archive_name(filename):
        archive = summarize_archive(uploads_dir / filename, archive_limits)
    elif uploads_dir is not None:
        companion_file = uploads_dir / companion if companion else None
        outline, preview = outline_for_file(uploads_dir / filename, companion_file)
    return ContextFile(
        filename=filename,
        size=int(_field(entry, "size", 0) or 0),
        path=str(_field(entry, "path") or f"{VIRTUAL_UPLOADS_DIR}/{filename}"),
        extension=str(extension) if extension is not None else PurePosixPath(filename).suffix,
        outline=tuple(outline),
        preview=tuple(preview),
        archive=archive,
    )


def context_files_for(
    uploads_dir: Path | None,
    entries: Iterable[Mapping[str, Any] | UploadRecord],
    archive_limits: ArchiveLimits | None = None,
) -> list[ContextFile]:
    """Turn state entries or upload records into context files with outlines attached.

    Upload records that are conversion companions (`converted_from` names another entry)
    are not listed on their own: their headings become the original's outline instead.

    Args:
        uploads_dir: The thread's uploads folder on the host, or None when the thread is
            unknown (then no outline or preview is read).
        entries: `{"filename", "size", "path"?, "extension"?}` mappings (the middleware's
            state entries) or `UploadRecord`s (the upload service's records).
        archive_limits: How archives are listed for their member count (the defaults
            when None).

    Returns:
        Context files in the order given.
    """
    items = list(entries)
    names = {str(_field(entry, "filename", "")) for entry in items}
    companions: dict[str, str] = {}
    for entry in items:
        original = _field(entry, "converted_from")
        if original and original in names:
            companions.setdefault(str(original), str(_field(entry, "filename")))
    hidden = set(companions.values())
    return [
        _as_context_file(
            entry, uploads_dir, companions.get(str(_field(entry, "filename"))), archive_limits
        )
        for entry in items
        if str(_field(entry, "filename", "")) not in hidden
    ]
