"""Read-only access to one thread's /mnt/user-data, for the `read_file`/`glob`/`grep` tools.

Every path the model gives is a virtual path, mapped through `ThreadPaths` (which resolves
symlinks and `..` and refuses anything outside the thread's user-data). Walks re-check each
file they meet, because a folder inside may hold a symlink that points out. Everything that
goes back to the model is neutralised (SPEC 4.1). An uploaded document (PDF, Word, Excel,
PowerPoint) is read as its Markdown text, the text its outline's line numbers refer to
(SPEC D17, `document_text`). No LangChain and no Flask here: the tools wrap it, and the chat
preview page calls `run_file_tool` to show exactly what a tool call returns.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from pathlib import PurePosixPath
from typing import Any
from typing import TypeVar

import regex

from deerflow_web.concurrency import off_loop
from deerflow_web.errors import ArchiveError
from deerflow_web.errors import ConversionError
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import FileAccessError
from deerflow_web.errors import ImageNotUsable
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import OCR_IMAGE_EXTENSIONS
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import ImageLimits
from deerflow_web.models import is_archive_name
from deerflow_web.models import suffix_of
from deerflow_web.services.archives.members import ArchiveAt
from deerflow_web.services.archives.members import ArchiveMembers
from deerflow_web.services.archives.members import MemberConverter
from deerflow_web.services.archives.members import TextStillConverting
from deerflow_web.services.archives.members import is_convertible_name
from deerflow_web.services.archives.reader import ArchiveListing
from deerflow_web.services.archives.reader import ArchiveMember
from deerflow_web.services.files.artifacts import is_foreign_upload
from deerflow_web.services.prompt.document_text import DocumentNotReadable
from deerflow_web.services.prompt.document_text import DocumentStillConverting
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.document_text import is_document_name
from deerflow_web.services.prompt.document_text import misnamed_document
from deerflow_web.services.prompt.images import encode_image
from deerflow_web.services.prompt.images import is_image_name
from deerflow_web.services.prompt.images import is_svg_name
from deerflow_web.services.prompt.images import view_image_content
from deerflow_web.services.prompt.page_lines import READ_NOTE
from deerflow_web.services.prompt.page_lines import PageTracker
from deerflow_web.services.prompt.page_lines import line_label
from deerflow_web.services.prompt.page_lines import match_fields
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize
from deerflow_web.settings import ArchiveLimits
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.sniff import SNIFF_BYTES
from deerflow_web.storage.sniff import is_binary_head

MAX_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_READ_CHARS = 200_000
MAX_GLOB_RESULTS = 500
MAX_GREP_RESULTS = 200
MAX_GREP_FILE_BYTES = 20 * 1024 * 1024
MAX_GREP_TOTAL_BYTES = 200 * 1024 * 1024
MAX_PATTERN_CHARS = 1000
MAX_LISTED_MEMBERS = 200  # read_file on an archive or one of its folders lists this many
GREP_SECONDS = 5.0  # one grep call, all its files and lines (`SearchBudget`)
Result = TypeVar("Result")

STILL_CONVERTING = (
    "{path} is still converting to text; call {tool} again in a few seconds to read it."
)
NO_CONVERSION = (
    "{path} is a document; its text is read through conversion, which is not set up here."
)


class FileToolFailure(Exception):
    """A tool call that failed; the message is what the model reads instead of a result."""


def run_file_tool(verb: str, path: str, action: Callable[[], Result]) -> Result:
    """Run one file action; every failure becomes a `FileToolFailure` with the model's text.

    The LangChain tools and the chat preview's tools panel both call this, so the panel
    shows, word for word, what a failed call tells the model.
    """
    try:
        return action()
    except DeerFlowError as error:  # a message may quote a name: neutralised like results
        raise FileToolFailure(neutralize(str(error))) from error
    except OSError as error:
        raise FileToolFailure(f"Cannot {verb} {neutralize(path)}: {error.strerror}") from error


def tool_content(result: Any) -> str:
    """A tool result as the model's tool message holds it (LangChain dumps dicts as JSON)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


@dataclass(frozen=True)
class WalkedFile:
    """A file found by a walk: its virtual path for the model, its real path for reading."""

    virtual_path: str
    real_path: Path
    relative: str
    # A member of an archive: `real_path` is then the archive, read through `archive`.
    archive: ArchiveAt | None = None
    member: ArchiveMember | None = None

    @property
    def name(self) -> str:
        """The file's own name (a member's, not its archive's)."""
        if self.member is not None:
            return PurePosixPath(self.member.name).name
        return self.real_path.name


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(segment):
        char = segment[index]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (close := segment.find("]", index + 2)) != -1:
            body = segment[index + 1 : close].replace("\\", "\\\\")
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body}]")
            index = close
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """Compile a relative glob (`*`, `?`, `[...]`, `**` for any depth) to a full-match regex.

    Raises:
        FileAccessError: An empty or absolute pattern, or one with a `..` segment.
    """
    if not pattern or not pattern.strip():
        raise FileAccessError("The glob pattern is empty.")
    if pattern.startswith("/"):
        raise FileAccessError(
            "Give a relative pattern such as '**/*.pdf' and put the folder in `path`."
        )
    segments = [segment for segment in pattern.split("/") if segment not in ("", ".")]
    if ".." in segments:
        raise FileAccessError("Glob patterns may not contain '..'.")
    expression = ""
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            expression += ".*" if last else "(?:[^/]+/)*"
        else:
            expression += _segment_regex(segment) + ("" if last else "/")
    return re.compile(expression, re.DOTALL)


class SearchBudget:
    """The time one grep call may take, across all its files and lines.

    The model writes the pattern, and a pattern like `(a|aa)+$` backtracks for hours on a
    long line, while an innocent one costs a few microseconds per line, which over two
    20 MiB files of short lines adds up to half a minute. So one deadline bounds the whole
    call: every line is searched with what is left of it (the `regex` engine stops a search
    at a timeout, which `re` cannot), and no line starts once it has passed. The deadline
    is wall-clock time, which also bounds the CPU time: the search runs on one thread,
    and a thread cannot use more CPU than the time that passes.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline = time.monotonic() + seconds

    def extend(self, seconds: float) -> None:
        """Give back time the call spent waiting, not searching (conversions of documents)."""
        self._deadline += max(seconds, 0.0)

    def left(self) -> float:
        """Seconds left; zero or less once the budget is spent."""
        return self._deadline - time.monotonic()


class BudgetSpent(Exception):
    """The grep call's time ran out; `pathological` when one line took the rest of it."""

    def __init__(self, pathological: bool) -> None:
        super().__init__()
        self.pathological = pathological


def _matches(compiled: regex.Pattern[str], line: str, budget: SearchBudget) -> bool:
    """Whether `line` matches, within what is left of the call's time budget.

    Raises:
        BudgetSpent: No time is left, or this line's search took the rest of it.
    """
    remaining = budget.left()
    if remaining <= 0:
        raise BudgetSpent(pathological=False)
    try:
        # concurrent: the engine lets other threads run while it searches.
        return compiled.search(line, timeout=remaining, concurrent=True) is not None
    except TimeoutError as error:
        raise BudgetSpent(pathological=True) from error


def _stopped_message(seconds: float, shown_path: str, line: int, pathological: bool) -> str:
    """What the model reads when its search ran out of time: where, and what to do."""
    where = f"line {line} of {shown_path}"
    if pathological:
        return (
            f"The search stopped after {seconds:g} s (its time limit) at {where}: that line "
            "alone took the rest of the time. Use a simpler pattern (nested repetition such "
            "as (a|aa)+ can take hours on long lines); lines and files after it were not "
            "searched."
        )
    return (
        f"The search stopped after {seconds:g} s (its time limit) at {where}; lines and files "
        "after it were not searched. Search a narrower path or glob to cover the rest."
    )


def _head(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(SNIFF_BYTES)


def _is_binary(path: Path) -> bool:
    return is_binary_head(_head(path))


def _refusal_under(path: str | None, folder: str) -> bool:
    """Whether a refused member belongs to a folder's listing; one refused for its name
    (no safe path) belongs to the archive's root."""
    if path is None:
        return not folder
    return not folder or path.startswith(f"{folder}/")


def _clip(line: str) -> str:
    line = line.rstrip("\r\n")
    if len(line) > MAX_LINE_CHARS:
        return line[:MAX_LINE_CHARS] + " … [line truncated]"
    return line


class UserDataFiles:
    """One thread's /mnt/user-data, read-only and confined."""

    def __init__(
        self,
        thread: ThreadFolders,
        documents: DocumentTexts | None = None,
        listed_upload: Callable[[str], bool] | None = None,
        archive_limits: ArchiveLimits | None = None,
        withheld: Callable[[str], str | None] | None = None,
    ) -> None:
        """`listed_upload(name)` says whether the upload listing includes a name; without
        it, no hard-linked file in uploads/ is read. Archives are read under
        `archive_limits`, else the documents' (the settings'), else the defaults.
        `withheld(name)` says why an upload may not be used yet (virus scanning), None
        when it may."""
        self._withheld = withheld
        self._uploads_real: Path | None = None
        self._thread = thread
        self._listed_upload = listed_upload
        self._base = thread.user_data_dir().resolve()
        self._documents = documents
        converter = (
            MemberConverter(documents.jobs.converter, documents.jobs.settings)
            if documents is not None
            else None
        )
        limits = archive_limits or (documents.archive_limits if documents else ArchiveLimits())
        self._archives = ArchiveMembers(thread, limits, converter)

    def _uploaded_document(self, real: Path, shown_path: str) -> bool:
        """Whether `real` is read through conversion; refuses documents it cannot convert.

        Raises:
            FileAccessError: A document outside uploads/, under a name that hides its
                format, or with no conversion set up.
        """
        if not is_document_name(real.name):
            hidden = misnamed_document(real.name, _head(real))
            if hidden is not None:
                raise FileAccessError(
                    f"{shown_path} holds a document ({hidden}) under a name that does not "
                    "say so; its raw bytes are not readable text. Ask for it to be renamed "
                    "with its extension, then read it again."
                )
            return False
        image = suffix_of(real.name).lower() in OCR_IMAGE_EXTENSIONS
        if image and (self._documents is None or real.parent != self._uploads_dir()):
            return False  # a chart in outputs/: a binary file, as it always was
        if self._documents is None:
            raise FileAccessError(NO_CONVERSION.format(path=shown_path))
        return True

    def _uploads_dir(self) -> Path:
        assert self._documents is not None
        return self._documents.uploads_dir.resolve()

    def _in_uploads(self, real: Path) -> bool:
        """Whether a document has upload records (and so a recorded companion)."""
        return real.parent == self._uploads_dir()

    def _document_text(
        self, real: Path, shown_path: str, tool: str, wait: float | None = None
    ) -> Path:
        """The Markdown file to read for a document; failures become messages.

        An uploaded document reads its recorded companion; one elsewhere (a file extracted
        from an archive, say) is converted by the same converter into the thread's
        archive cache, keyed by its content.
        """
        assert self._documents is not None
        if not self._in_uploads(real):
            budget = self._documents.wait_seconds if wait is None else wait
            return self._converted(lambda: self._archives.file_text(real, budget), shown_path, tool)
        try:
            return self._documents.markdown_path(real.name, wait=wait)
        except DocumentStillConverting as error:
            raise FileAccessError(STILL_CONVERTING.format(path=shown_path, tool=tool)) from error
        except DocumentNotReadable as error:
            raise FileAccessError(f"Cannot read {shown_path}: {neutralize(str(error))}") from error
        except UploadNotFound as error:
            raise FileAccessError(f"File not found: {shown_path}") from error

    @staticmethod
    def _converted(text: Callable[[], Path], shown_path: str, tool: str) -> Path:
        """Run a cache conversion; its failures become the model's messages."""
        try:
            return text()
        except TextStillConverting as error:
            raise FileAccessError(STILL_CONVERTING.format(path=shown_path, tool=tool)) from error
        except ConversionError as error:
            raise FileAccessError(f"Cannot read {shown_path}: {neutralize(str(error))}") from error

    def _archive_at(self, real: Path) -> ArchiveAt:
        return ArchiveAt(real, real.name, self._virtual(real))

    def _inside_archive(self, real: Path) -> tuple[ArchiveAt, str] | None:
        """The innermost archive and member path a missing path names, if it names one.

        Raises:
            ArchiveRefused: An archive on the way is refused or nested too deep.
            FileAccessError: The archive is held back by virus scanning.
        """
        split = self._thread.split_archive_path(real)
        if split is None:
            return None
        archive, rest = split
        if self._foreign(archive) or is_staging_name(archive.name):
            return None
        if (reason := self._held(archive)) is not None:
            # An archive the scanner has not cleared keeps its members too.
            raise FileAccessError(f"{neutralize(archive.name)} cannot be read yet: {reason}.")
        return self._archives.locate(self._archive_at(archive), rest)

    def _listing_text(
        self, archive: ArchiveAt, listing: ArchiveListing, folder: str, shown_path: str
    ) -> str:
        """What read_file answers for an archive, or a folder inside one: its members."""
        prefix = f"{folder}/" if folder else ""
        files = [m for m in listing.files if m.name.startswith(prefix)]
        refused = [r for r in listing.refused if _refusal_under(r.path, folder)]
        kind = "a folder of the archive" if folder else "an archive"
        lines = [
            f"[{shown_path} is {kind} holding {len(files)} file(s); read one with read_file "
            "at its path below, or search them with grep]"
        ]
        for member in files[:MAX_LISTED_MEMBERS]:
            lines.append(f"{neutralize(archive.virtual_path)}/{neutralize(member.name)}")
        if len(files) > MAX_LISTED_MEMBERS:
            lines.append(
                f"[{len(files) - MAX_LISTED_MEMBERS} more; use glob with path={shown_path}]"
            )
        if refused:
            lines.append("[Refused members, not readable:]")
            lines.extend(f"- {neutralize(r.reason)}" for r in refused[:MAX_LISTED_MEMBERS])
        return "\n".join(lines)

    def _member_target(
        self, archive: ArchiveAt, name: str, shown_path: str, tool: str, wait: float | None = None
    ) -> tuple[Path, str] | str:
        """(text file, label) to read for a member, or the listing of a folder/archive."""
        listing = self._archives.listing(archive)
        plain_folder = listing.member(name) is None and listing.refusal(name) is None
        if not name or (plain_folder and listing.is_folder(name)):
            return self._listing_text(archive, listing, name, shown_path)
        member = self._archives.member(archive, name)
        if is_archive_name(PurePosixPath(member.name).name):
            inner = self._archives.nested(archive, member)
            return self._listing_text(inner, self._archives.listing(inner), "", shown_path)
        if is_convertible_name(member.name):
            if self._documents is None:
                raise FileAccessError(NO_CONVERSION.format(path=shown_path))
            budget = self._documents.wait_seconds if wait is None else wait
            text = self._converted(
                lambda: self._archives.text(archive, member, budget), shown_path, tool
            )
            return text, f"{shown_path} as Markdown text"
        file = self._archives.member_file(archive, member)
        if _is_binary(file):
            raise FileAccessError(f"{shown_path} is a binary file; read_file shows text only.")
        return file, shown_path

    def _foreign(self, real: Path) -> bool:
        """A hard link in uploads/ that the listing leaves out: its bytes are not ours."""
        return is_foreign_upload(self._thread, real, self._listed_upload)

    def _held(self, real: Path) -> str | None:
        """Why an upload may not be read yet (not scanned clean), None when it may."""
        if self._withheld is None:
            return None
        if self._uploads_real is None:
            self._uploads_real = self._thread.uploads_dir().resolve()
        if real.parent != self._uploads_real:
            return None
        return self._withheld(real.name)

    def resolve(self, virtual_path: str) -> Path:
        """Map a virtual path to the host; raises the path errors of SPEC 1.9."""
        return self._thread.resolve_virtual_path(virtual_path)

    def _virtual(self, real: Path) -> str:
        relative = real.relative_to(self._base).as_posix()
        return VIRTUAL_PATH_PREFIX if relative == "." else f"{VIRTUAL_PATH_PREFIX}/{relative}"

    def _inside(self, path: Path) -> Path | None:
        """The real path when `path` is a regular file inside user-data, else None."""
        try:
            real = path.resolve()
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(self._base) or not real.is_file() or self._foreign(real):
            return None
        if self._held(real) is not None:
            return None  # not listed, searched or read until it is scanned clean
        return real

    def _directory(self, virtual_path: str) -> Path:
        root = self.resolve(virtual_path)
        if not root.exists():
            raise FileAccessError(f"Directory not found: {neutralize(virtual_path)}")
        if not root.is_dir():
            raise FileAccessError(f"Not a directory: {neutralize(virtual_path)}")
        return root

    def walk(self, root: Path, refused: list[dict[str, str]] | None = None) -> Iterator[WalkedFile]:
        """Regular files under `root`, sorted, never leaving user-data (links re-checked);
        an archive is followed by its members (`walk_archive`)."""
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                if is_staging_name(name):
                    continue
                path = Path(dirpath) / name
                real = self._inside(path)
                if real is None:
                    continue
                walked = WalkedFile(
                    virtual_path=self._virtual(path),
                    real_path=real,
                    relative=path.relative_to(root).as_posix(),
                )
                yield walked
                if is_archive_name(name):
                    archive = ArchiveAt(real, name, walked.virtual_path)
                    yield from self.walk_archive(archive, "", walked.relative, refused)

    def walk_archive(
        self,
        archive: ArchiveAt,
        folder: str,
        relative_to: str,
        refused: list[dict[str, str]] | None = None,
    ) -> Iterator[WalkedFile]:
        """The file members of an archive (under `folder` inside it), as walked files.

        Members that are archives are listed, not opened: a walk never descends into
        nested archives (a path given into one does). A refused archive or member is added
        to `refused` with its reason.
        """
        try:
            listing = self._archives.listing(archive)
        except ArchiveError as error:
            if refused is not None:
                refused.append({"path": neutralize(archive.virtual_path), "reason": str(error)})
            return
        prefix = f"{folder}/" if folder else ""
        for refusal in listing.refused if refused is not None else ():
            if _refusal_under(refusal.path, folder):
                refused.append({"path": neutralize(archive.virtual_path), "reason": refusal.reason})
        for member in listing.files:
            if not member.name.startswith(prefix):
                continue
            inner = member.name[len(prefix) :]
            yield WalkedFile(
                virtual_path=f"{archive.virtual_path}/{member.name}",
                real_path=archive.path,
                relative=f"{relative_to}/{inner}" if relative_to else inner,
                archive=archive,
                member=member,
            )

    def read(
        self, virtual_path: str, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        """Return numbered lines `start_line`..`end_line` (1-based, inclusive) of a text file.

        At most 2,000 lines and 200,000 characters come back; a footer says how to go on.

        Raises:
            FileAccessError: Missing, not a file, binary, or a bad line range.
            ArtifactError: The path is outside /mnt/user-data or escapes it.
        """
        shown_path = neutralize(virtual_path)
        real = self.resolve(virtual_path)
        # Archives are decompressed here: off the event loop, as grep's matching is.
        inside = None if real.exists() else off_loop(self._inside_archive, real)
        if inside is None:
            if not real.exists() or is_staging_name(real.name):
                raise FileAccessError(f"File not found: {shown_path}")
            if real.is_file() and self._foreign(real):
                raise FileAccessError(f"File not found: {shown_path}")
            if real.is_file() and (reason := self._held(real)) is not None:
                raise FileAccessError(f"{shown_path} cannot be read yet: {reason}.")
            if real.is_dir():
                raise FileAccessError(f"{shown_path} is a directory; use `glob` to list its files.")
            if not real.is_file():
                raise FileAccessError(f"{shown_path} is not a regular file.")
        start = 1 if start_line is None else start_line
        if start < 1:
            raise FileAccessError("start_line must be 1 or more.")
        if end_line is not None and end_line < start:
            raise FileAccessError("end_line must not be smaller than start_line.")
        label = shown_path
        paged = False
        if inside is not None or is_archive_name(real.name):
            archive, name = inside or (self._archive_at(real), "")
            target = off_loop(self._member_target, archive, name, shown_path, "read_file")
            if isinstance(target, str):
                return target
            real, label = target
            paged = label != shown_path  # a converted member: its pages are marked
        elif self._uploaded_document(real, shown_path):
            real = self._document_text(real, shown_path, "read_file")
            label = f"{shown_path} as Markdown text"
            paged = True
        elif _is_binary(real):
            raise FileAccessError(
                f"{shown_path} is a binary file; read_file shows text only. "
                "A converted document has a Markdown companion (.md) you can read instead."
            )
        last = start + MAX_READ_LINES - 1
        if end_line is not None:
            last = min(last, end_line)
        pages = PageTracker() if paged else None
        lines, total, stopped_at = self._numbered(real, start, last, pages)
        if total == 0:
            return f"[{shown_path} is empty]"
        if start > total:
            raise FileAccessError(
                f"start_line {start} is past the end of {shown_path} ({total} lines)."
            )
        end = stopped_at
        note = f"; {READ_NOTE}" if pages is not None and pages.seen else ""
        header = f"[{label}, lines {start}-{end} of {total}{note}]"
        body = "\n".join(lines)
        if end < total and (end_line is None or end < end_line):
            body += (
                f"\n[{total - end} more line(s); call read_file with start_line={end + 1} "
                "to continue]"
            )
        return f"{header}\n{body}"

    @staticmethod
    def _numbered(
        real: Path, start: int, last: int, pages: PageTracker | None = None
    ) -> tuple[list[str], int, int]:
        """Lines `start`..`last` numbered (and labelled with their page when `pages`
        follows a converted document's markers), the line count, the last line given."""
        lines: list[str] = []
        chars = 0
        total = 0
        stopped_at = start - 1
        full = False
        with real.open(encoding="utf-8", errors="replace", newline="") as handle:
            for number, raw in enumerate(handle, start=1):
                total = number
                mark = pages.line(raw) if pages is not None else None
                if full or number < start or number > last:
                    continue
                prefix = f"{number:>6}"
                if mark is not None:
                    prefix = f"{prefix} {line_label(mark)}"
                line = f"{prefix}\t{neutralize(_clip(raw), keep_tabs=True)}"
                if lines and chars + len(line) > MAX_READ_CHARS:
                    full = True
                    continue
                lines.append(line)
                chars += len(line) + 1
                stopped_at = number
        return lines, total, stopped_at

    def glob(self, pattern: str, virtual_path: str = VIRTUAL_PATH_PREFIX) -> dict[str, Any]:
        """Virtual paths of the files under `virtual_path` whose relative path matches."""
        # Listing a .tar.gz decompresses it: off the event loop.
        return off_loop(self._glob, pattern, virtual_path)

    def _glob(self, pattern: str, virtual_path: str) -> dict[str, Any]:
        matcher = compile_glob(pattern)
        refused: list[dict[str, str]] = []
        walked_files = self._walk_path(virtual_path, refused)
        matches: list[str] = []
        truncated = False
        for walked in walked_files:
            if matcher.fullmatch(walked.relative):
                if len(matches) == MAX_GLOB_RESULTS:
                    truncated = True
                    break
                matches.append(neutralize(walked.virtual_path))
        result: dict[str, Any] = {
            "path": neutralize(virtual_path),
            "pattern": neutralize(pattern),
            "matches": matches,
            "count": len(matches),
        }
        if truncated:
            result["truncated"] = True
        if refused:
            result["refused"] = refused
        if not matches:
            result["message"] = "No files matched the pattern."
        return result

    def _walk_path(self, virtual_path: str, refused: list[dict[str, str]]) -> Iterator[WalkedFile]:
        """The files under a folder, an archive, or a folder inside an archive.

        Raises:
            FileAccessError: The path is missing or a plain file.
            ArchiveError: The archive it goes into is refused.
        """
        real = self.resolve(virtual_path)
        if real.exists():
            if real.is_file() and is_archive_name(real.name) and not self._foreign(real):
                return self.walk_archive(self._archive_at(real), "", "", refused)
            return self.walk(self._directory(virtual_path), refused)
        inside = self._inside_archive(real)
        if inside is not None:
            archive, folder = inside
            listing = self._archives.listing(archive)
            if listing.is_folder(folder) and listing.member(folder) is None:
                return self.walk_archive(archive, folder, "", refused)
            if listing.member(folder) is not None:
                raise FileAccessError(f"Not a directory: {neutralize(virtual_path)}")
        raise FileAccessError(f"Directory not found: {neutralize(virtual_path)}")

    def grep(
        self,
        pattern: str,
        virtual_path: str,
        file_glob: str | None = None,
        max_results: int = 50,
    ) -> dict[str, Any]:
        """Lines matching a regular expression in the text files under `virtual_path`.

        Raises:
            FileAccessError: An invalid or overlong pattern, a missing path.
        """
        # Up to GREP_SECONDS of matching: off the event loop, so no other connection waits.
        return off_loop(self._grep, pattern, virtual_path, file_glob, max_results)

    def _grep(
        self, pattern: str, virtual_path: str, file_glob: str | None, max_results: int
    ) -> dict[str, Any]:
        if not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise FileAccessError(f"The pattern must have 1 to {MAX_PATTERN_CHARS} characters.")
        try:
            compiled = regex.compile(pattern)
        except regex.error as error:
            raise FileAccessError(f"Invalid regular expression: {error}") from error
        limit = min(max(max_results, 1), MAX_GREP_RESULTS)
        name_matcher = compile_glob(file_glob) if file_glob else None
        by_name = file_glob is not None and "/" not in file_glob
        matches: list[dict[str, Any]] = []
        skipped: list[dict[str, str]] = []
        searched = 0
        bytes_left = MAX_GREP_TOTAL_BYTES
        truncated = False
        stopped: dict[str, Any] | None = None
        budget = SearchBudget(GREP_SECONDS)
        targets = []
        for walked in self._grep_targets(virtual_path, skipped):
            if name_matcher is not None:
                candidate = walked.name if by_name else walked.relative
                if not name_matcher.fullmatch(candidate):
                    continue
            targets.append(walked)
        waited_from = time.monotonic()
        texts = self._grep_texts(targets, skipped)
        budget.extend(time.monotonic() - waited_from)  # conversions have their own wait
        for walked in targets:
            text_path = texts.get(walked.virtual_path, walked.real_path)
            if text_path is None:
                continue  # a document without text (yet): listed in `skipped`
            size = text_path.stat().st_size
            if size > MAX_GREP_FILE_BYTES or (
                walked.virtual_path not in texts and _is_binary(text_path)
            ):
                continue
            if size > bytes_left:
                truncated = True
                stopped = {"path": neutralize(walked.virtual_path), "reason": "size"}
                break
            bytes_left -= size
            searched += 1
            number = 0
            pages = PageTracker() if texts.get(walked.virtual_path) is not None else None
            try:
                with text_path.open(encoding="utf-8", errors="replace") as handle:
                    for number, raw in enumerate(handle, start=1):
                        mark = pages.line(raw) if pages is not None else None
                        line = _clip(raw)
                        if not _matches(compiled, line, budget):
                            continue
                        if len(matches) == limit:
                            truncated = True
                            break
                        matches.append(
                            {
                                "path": neutralize(walked.virtual_path),
                                "line": number,
                                **match_fields(mark),
                                "text": neutralize(line.strip(), keep_tabs=True),
                            }
                        )
            except BudgetSpent as spent:
                truncated = True
                shown = neutralize(walked.virtual_path)
                stopped = {"path": shown, "line": number, "reason": "time"}
                stopped["message"] = _stopped_message(
                    budget.seconds, shown, number, spent.pathological
                )
            if truncated:
                break
        result: dict[str, Any] = {
            "pattern": neutralize(pattern),
            "matches": matches,
            "files_searched": searched,
        }
        if skipped:
            result["skipped"] = skipped
        if truncated:
            result["truncated"] = True
        if stopped is not None:
            result["message"] = stopped.pop(
                "message",
                f"The search stopped before {stopped['path']}: together the files searched "
                f"reached {MAX_GREP_TOTAL_BYTES // (1024 * 1024)} MiB. Search a narrower path "
                "or glob to cover the rest.",
            )
            result["stopped_at"] = stopped
        elif not matches:
            result["message"] = "No matches found."
        return result

    def _grep_texts(
        self, targets: list[WalkedFile], skipped: list[dict[str, str]]
    ) -> dict[str, Path | None]:
        """The Markdown to search for each document among `targets` (None: skipped).

        A document is searched through the same text `read_file` returns; its companion is
        then not searched on its own, or every match would be reported twice. Conversions
        start together and share one wait budget, so a search over ten new documents waits
        once, not ten times.
        """
        texts = self._member_texts([w for w in targets if w.member is not None], skipped)
        targets = [w for w in targets if w.member is None]
        documents: list[WalkedFile] = []
        for walked in targets:
            shown = neutralize(walked.virtual_path)
            try:
                if self._uploaded_document(walked.real_path, shown):
                    documents.append(walked)
            except FileAccessError as error:
                skipped.append({"path": shown, "reason": str(error)})
        if not documents:
            return self._without_misnamed(targets, skipped, texts)
        assert self._documents is not None
        companions = self._documents.companions()
        for walked in documents:
            in_uploads = self._in_uploads(walked.real_path)
            if in_uploads and walked.real_path.name not in companions.values():
                self._documents.request(walked.real_path.name)
        deadline = time.monotonic() + self._documents.wait_seconds
        names = {walked.real_path.name for walked in documents}
        for walked in documents:
            shown = neutralize(walked.virtual_path)
            try:
                wait = self._documents.deadline_wait(deadline)
                texts[walked.virtual_path] = self._document_text(
                    walked.real_path, shown, "grep", wait
                )
            except FileAccessError as error:
                texts[walked.virtual_path] = None
                skipped.append({"path": shown, "reason": str(error)})
        uploads = self._documents.uploads_dir.resolve()
        for walked in targets:
            original = companions.get(walked.real_path.name)
            if walked.real_path.parent == uploads and original in names:
                texts[walked.virtual_path] = None  # searched as its document
        return self._without_misnamed(targets, skipped, texts)

    def _member_texts(
        self, members: list[WalkedFile], skipped: list[dict[str, str]]
    ) -> dict[str, Path | None]:
        """The file to search for each archive member (None: not searched).

        Text members are read out of each archive in one pass; documents and images are
        converted together under one wait, as uploaded documents are; binary members and
        nested archives are passed over as binary files are.
        """
        texts: dict[str, Path | None] = {}
        by_archive: dict[Path, list[WalkedFile]] = {}
        converting: list[WalkedFile] = []
        for walked in members:
            assert walked.member is not None
            name = PurePosixPath(walked.member.name).name
            if is_archive_name(name):
                texts[walked.virtual_path] = None
            elif is_convertible_name(name):
                converting.append(walked)
            else:
                by_archive.setdefault(walked.real_path, []).append(walked)
        for group in by_archive.values():
            archive = group[0].archive
            assert archive is not None
            try:
                files = self._archives.member_files(archive, [w.member for w in group if w.member])
            except ArchiveError as error:
                for walked in group:
                    texts[walked.virtual_path] = None
                skipped.append({"path": neutralize(archive.virtual_path), "reason": str(error)})
                continue
            for walked in group:
                assert walked.member is not None
                found = files.get(walked.member.name)
                if isinstance(found, Path) and not _is_binary(found):
                    texts[walked.virtual_path] = found
                else:
                    texts[walked.virtual_path] = None
                    if isinstance(found, ArchiveError):
                        skipped.append(
                            {"path": neutralize(walked.virtual_path), "reason": str(found)}
                        )
        if not converting:
            return texts
        wait = self._documents.wait_seconds if self._documents is not None else 0.0
        deadline = time.monotonic() + wait
        for walked in converting:  # all started before any is waited for
            assert walked.archive is not None and walked.member is not None
            try:
                self._archives.start_text(walked.archive, walked.member)
            except (ArchiveError, ConversionError, TextStillConverting):
                pass  # reported below, when its text is asked for
        for walked in converting:
            assert walked.archive is not None and walked.member is not None
            shown = neutralize(walked.virtual_path)
            archive, member = walked.archive, walked.member
            try:
                if self._documents is None:
                    raise FileAccessError(NO_CONVERSION.format(path=shown))
                left = max(deadline - time.monotonic(), 0.0)
                texts[walked.virtual_path] = self._converted(
                    lambda a=archive, m=member, w=left: self._archives.text(a, m, w), shown, "grep"
                )
            except (FileAccessError, ArchiveError) as error:
                texts[walked.virtual_path] = None
                skipped.append({"path": shown, "reason": neutralize(str(error))})
        return texts

    @staticmethod
    def _without_misnamed(
        targets: list[WalkedFile],
        skipped: list[dict[str, str]],
        texts: dict[str, Path | None],
    ) -> dict[str, Path | None]:
        refused = {entry["path"] for entry in skipped}
        for walked in targets:
            if neutralize(walked.virtual_path) in refused:
                texts.setdefault(walked.virtual_path, None)
        return texts

    def _grep_targets(
        self, virtual_path: str, refused: list[dict[str, str]]
    ) -> Iterator[WalkedFile]:
        real = self.resolve(virtual_path)
        if real.is_file():
            if is_staging_name(real.name) or self._foreign(real):
                raise FileAccessError(f"File not found: {neutralize(virtual_path)}")
            if (reason := self._held(real)) is not None:
                raise FileAccessError(f"{neutralize(virtual_path)} cannot be read yet: {reason}.")
            if is_archive_name(real.name):
                yield from self.walk_archive(self._archive_at(real), "", "", refused)
                return
            yield WalkedFile(self._virtual(real), real, real.name)
            return
        if not real.exists():
            inside = self._inside_archive(real)
            if inside is not None:
                archive, name = inside
                member = self._archives.listing(archive).member(name)
                if member is not None:
                    yield WalkedFile(
                        f"{archive.virtual_path}/{member.name}",
                        archive.path,
                        PurePosixPath(member.name).name,
                        archive,
                        member,
                    )
                    return
        yield from self._walk_path(virtual_path, refused)

    def existing_file(self, virtual_path: str) -> Path:
        """The host path of a regular file of the thread, checked as `read` checks it.

        Raises:
            FileAccessError: Missing, a staging file, a foreign hard link, a directory or
                not a regular file.
            ArtifactError: The path is outside /mnt/user-data or escapes it.
        """
        shown_path = neutralize(virtual_path)
        real = self.resolve(virtual_path)
        if not real.exists() or is_staging_name(real.name):
            raise FileAccessError(f"File not found: {shown_path}")
        if real.is_dir():
            raise FileAccessError(f"{shown_path} is a directory, not a file.")
        if not real.is_file():
            raise FileAccessError(f"{shown_path} is not a regular file.")
        if self._foreign(real):
            raise FileAccessError(f"File not found: {shown_path}")
        if (reason := self._held(real)) is not None:
            raise FileAccessError(f"{shown_path} cannot be read yet: {reason}.")
        return real

    def view_image(self, virtual_path: str, limits: ImageLimits) -> list[dict[str, Any]]:
        """What `view_image` returns: a short text and the picture's image block.

        Raises:
            ImageNotUsable: Not a raster picture, an SVG, too many pixels, damaged.
            FileAccessError, ArtifactError: As `existing_file`.
        """
        shown_path = neutralize(virtual_path)
        real = self.existing_file(virtual_path)
        if not is_image_name(real.name) and not is_svg_name(real.name):
            raise ImageNotUsable(
                f"{shown_path} is not a picture (JPEG, PNG, GIF, WebP, BMP or TIFF); "
                "use read_file for other files."
            )
        return view_image_content(encode_image(real, limits, label=shown_path), shown_path)
