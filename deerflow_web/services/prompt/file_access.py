"""Read-only access to one thread's /mnt/user-data, for the `read_file`/`glob`/`grep` tools.

Every path the model gives is a virtual path, mapped through `ThreadPaths` (which resolves
symlinks and `..` and refuses anything outside the thread's user-data). Walks re-check each
file they meet, because a folder inside may hold a symlink that points out. Everything that
goes back to the model is neutralised (SPEC 4.1). No LangChain here: the tools wrap it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from deerflow_web.errors import FileAccessError
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.sniff import is_binary_file

MAX_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_READ_CHARS = 200_000
MAX_GLOB_RESULTS = 500
MAX_GREP_RESULTS = 200
MAX_GREP_FILE_BYTES = 20 * 1024 * 1024
MAX_GREP_TOTAL_BYTES = 200 * 1024 * 1024
MAX_PATTERN_CHARS = 1000
GREP_SECONDS = 5.0  # a whole grep call, across files


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


def _matches(compiled: regex.Pattern[str], line: str, deadline: float) -> bool:
    """Whether `line` matches, within what is left of the search's time budget.

    The model writes the pattern, and a pattern like `(a|aa)+$` backtracks for hours on a
    long line; the `regex` engine can stop a search at a deadline, which `re` cannot.
    """
    try:
        return compiled.search(line, timeout=max(deadline - time.monotonic(), 0.001)) is not None
    except TimeoutError as error:
        raise FileAccessError(
            f"The search was stopped after {GREP_SECONDS:g} s; use a simpler pattern "
            "(nested repetition such as (a|aa)+ can take hours on long lines)."
        ) from error


def _clip(line: str) -> str:
    line = line.rstrip("\r\n")
    if len(line) > MAX_LINE_CHARS:
        return line[:MAX_LINE_CHARS] + " … [line truncated]"
    return line


class UserDataFiles:
    """One thread's /mnt/user-data, read-only and confined."""

    def __init__(self, paths: ThreadPaths, thread_id: str, user_id: str | None = None) -> None:
        self._paths = paths
        self._thread_id = thread_id
        self._user_id = user_id
        self._base = paths.user_data_dir(thread_id, user_id).resolve()

    def resolve(self, virtual_path: str) -> Path:
        """Map a virtual path to the host; raises the path errors of SPEC 1.9."""
        return self._paths.resolve_virtual_path(self._thread_id, virtual_path, self._user_id)

    def _virtual(self, real: Path) -> str:
        relative = real.relative_to(self._base).as_posix()
        return VIRTUAL_PATH_PREFIX if relative == "." else f"{VIRTUAL_PATH_PREFIX}/{relative}"

    def _inside(self, path: Path) -> Path | None:
        """The real path when `path` is a regular file inside user-data, else None."""
        try:
            real = path.resolve()
        except (OSError, RuntimeError):
            return None
        if not real.is_relative_to(self._base) or not real.is_file():
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
        if real.is_dir():
            raise FileAccessError(f"{shown_path} is a directory; use `glob` to list its files.")
        if not real.is_file():
            raise FileAccessError(f"{shown_path} is not a regular file.")
        start = 1 if start_line is None else start_line
        if start < 1:
            raise FileAccessError("start_line must be 1 or more.")
        if end_line is not None and end_line < start:
            raise FileAccessError("end_line must not be smaller than start_line.")
        if is_binary_file(real):
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
        header = f"[{shown_path}, lines {start}-{end} of {total}]"
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
                line = f"{number:>6}\t{neutralize(_clip(raw))}"
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
        if not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise FileAccessError(f"The pattern must have 1 to {MAX_PATTERN_CHARS} characters.")
        try:
            compiled = regex.compile(pattern)
        except regex.error as error:
            raise FileAccessError(f"Invalid regular expression: {error}") from error
        deadline = time.monotonic() + GREP_SECONDS
        limit = min(max(max_results, 1), MAX_GREP_RESULTS)
        name_matcher = compile_glob(file_glob) if file_glob else None
        by_name = file_glob is not None and "/" not in file_glob
        matches: list[dict[str, Any]] = []
        searched = 0
        budget = MAX_GREP_TOTAL_BYTES
        truncated = False
        for walked in self._grep_targets(virtual_path):
            if name_matcher is not None:
                candidate = walked.real_path.name if by_name else walked.relative
                if not name_matcher.fullmatch(candidate):
                    continue
            size = walked.real_path.stat().st_size
            if size > MAX_GREP_FILE_BYTES or is_binary_file(walked.real_path):
                continue
            if size > budget:
                truncated = True
                break
            budget -= size
            searched += 1
            with walked.real_path.open(encoding="utf-8", errors="replace") as handle:
                for number, raw in enumerate(handle, start=1):
                    line = _clip(raw)
                    if not _matches(compiled, line, deadline):
                        continue
                    if len(matches) == limit:
                        truncated = True
                        break
                    matches.append(
                        {
                            "path": neutralize(walked.virtual_path),
                            "line": number,
                            "text": neutralize(line.strip()),
                        }
                    )
            if truncated:
                break
        result: dict[str, Any] = {
            "pattern": neutralize(pattern),
            "matches": matches,
            "files_searched": searched,
        }
        if truncated:
            result["truncated"] = True
        if not matches:
            result["message"] = "No matches found."
        return result

    def _grep_targets(self, virtual_path: str) -> Iterator[WalkedFile]:
        real = self.resolve(virtual_path)
        if real.is_file():
            if is_staging_name(real.name):
                raise FileAccessError(f"File not found: {neutralize(virtual_path)}")
            yield WalkedFile(self._virtual(real), real, real.name)
            return
        yield from self.walk(self._directory(virtual_path))
