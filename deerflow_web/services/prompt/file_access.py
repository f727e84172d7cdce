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
from typing import Any
from typing import TypeVar

import regex

from deerflow_web.concurrency import off_loop
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import FileAccessError
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.services.files.artifacts import is_foreign_upload
from deerflow_web.services.prompt.document_text import DocumentNotReadable
from deerflow_web.services.prompt.document_text import DocumentStillConverting
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.document_text import is_document_name
from deerflow_web.services.prompt.document_text import misnamed_document
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize
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
    ) -> None:
        """`listed_upload(name)` says whether the upload listing includes a name; without
        it, no hard-linked file in uploads/ is read."""
        self._thread = thread
        self._listed_upload = listed_upload
        self._base = thread.user_data_dir().resolve()
        self._documents = documents

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
        if self._documents is None:
            raise FileAccessError(NO_CONVERSION.format(path=shown_path))
        uploads = self._documents.uploads_dir.resolve()
        if real.parent != uploads:
            raise FileAccessError(
                f"{shown_path} is a document outside /mnt/user-data/uploads; only uploaded "
                "documents are converted to text."
            )
        return True

    def _document_text(
        self, real: Path, shown_path: str, tool: str, wait: float | None = None
    ) -> Path:
        """The Markdown file to read for an uploaded document; failures become messages."""
        assert self._documents is not None
        try:
            return self._documents.markdown_path(real.name, wait=wait)
        except DocumentStillConverting as error:
            raise FileAccessError(STILL_CONVERTING.format(path=shown_path, tool=tool)) from error
        except DocumentNotReadable as error:
            raise FileAccessError(f"Cannot read {shown_path}: {neutralize(str(error))}") from error
        except UploadNotFound as error:
            raise FileAccessError(f"File not found: {shown_path}") from error

    def _foreign(self, real: Path) -> bool:
        """A hard link in uploads/ that the listing leaves out: its bytes are not ours."""
        return is_foreign_upload(self._thread, real, self._listed_upload)

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
        return real

    def _directory(self, virtual_path: str) -> Path:
        root = self.resolve(virtual_path)
        if not root.exists():
            raise FileAccessError(f"Directory not found: {neutralize(virtual_path)}")
        if not root.is_dir():
            raise FileAccessError(f"Not a directory: {neutralize(virtual_path)}")
        return root

    def walk(self, root: Path) -> Iterator[WalkedFile]:
        """Regular files under `root`, sorted, never leaving user-data (links re-checked)."""
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                if is_staging_name(name):
                    continue
                path = Path(dirpath) / name
                real = self._inside(path)
                if real is None:
                    continue
                yield WalkedFile(
                    virtual_path=self._virtual(path),
                    real_path=real,
                    relative=path.relative_to(root).as_posix(),
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
        if not real.exists() or is_staging_name(real.name):
            raise FileAccessError(f"File not found: {shown_path}")
        if real.is_file() and self._foreign(real):
            raise FileAccessError(f"File not found: {shown_path}")
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
        if self._uploaded_document(real, shown_path):
            real = self._document_text(real, shown_path, "read_file")
            label = f"{shown_path} as Markdown text"
        elif _is_binary(real):
            raise FileAccessError(
                f"{shown_path} is a binary file; read_file shows text only. "
                "A converted document has a Markdown companion (.md) you can read instead."
            )
        last = start + MAX_READ_LINES - 1
        if end_line is not None:
            last = min(last, end_line)
        lines, total, stopped_at = self._numbered(real, start, last)
        if total == 0:
            return f"[{shown_path} is empty]"
        if start > total:
            raise FileAccessError(
                f"start_line {start} is past the end of {shown_path} ({total} lines)."
            )
        end = stopped_at
        header = f"[{label}, lines {start}-{end} of {total}]"
        body = "\n".join(lines)
        if end < total and (end_line is None or end < end_line):
            body += (
                f"\n[{total - end} more line(s); call read_file with start_line={end + 1} "
                "to continue]"
            )
        return f"{header}\n{body}"

    @staticmethod
    def _numbered(real: Path, start: int, last: int) -> tuple[list[str], int, int]:
        lines: list[str] = []
        chars = 0
        total = 0
        stopped_at = start - 1
        full = False
        with real.open(encoding="utf-8", errors="replace", newline="") as handle:
            for number, raw in enumerate(handle, start=1):
                total = number
                if full or number < start or number > last:
                    continue
                line = f"{number:>6}\t{neutralize(_clip(raw), keep_tabs=True)}"
                if lines and chars + len(line) > MAX_READ_CHARS:
                    full = True
                    continue
                lines.append(line)
                chars += len(line) + 1
                stopped_at = number
        return lines, total, stopped_at

    def glob(self, pattern: str, virtual_path: str = VIRTUAL_PATH_PREFIX) -> dict[str, Any]:
        """Virtual paths of the files under `virtual_path` whose relative path matches."""
        matcher = compile_glob(pattern)
        root = self._directory(virtual_path)
        matches: list[str] = []
        truncated = False
        for walked in self.walk(root):
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
        if not matches:
            result["message"] = "No files matched the pattern."
        return result

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
        for walked in self._grep_targets(virtual_path):
            if name_matcher is not None:
                candidate = walked.real_path.name if by_name else walked.relative
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
            try:
                with text_path.open(encoding="utf-8", errors="replace") as handle:
                    for number, raw in enumerate(handle, start=1):
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
        documents: list[WalkedFile] = []
        for walked in targets:
            shown = neutralize(walked.virtual_path)
            try:
                if self._uploaded_document(walked.real_path, shown):
                    documents.append(walked)
            except FileAccessError as error:
                skipped.append({"path": shown, "reason": str(error)})
        texts: dict[str, Path | None] = {}
        if not documents:
            return self._without_misnamed(targets, skipped, texts)
        assert self._documents is not None
        companions = self._documents.companions()
        for walked in documents:
            if walked.real_path.name not in companions.values():
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

    def _grep_targets(self, virtual_path: str) -> Iterator[WalkedFile]:
        real = self.resolve(virtual_path)
        if real.is_file():
            if is_staging_name(real.name) or self._foreign(real):
                raise FileAccessError(f"File not found: {neutralize(virtual_path)}")
            yield WalkedFile(self._virtual(real), real, real.name)
            return
        yield from self.walk(self._directory(virtual_path))
