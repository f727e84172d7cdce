"""Child process that converts one document to Markdown with markitdown.

Parsing untrusted Office and PDF files happens here, in a process of its own, so a hostile or
huge file can exhaust only this process's time and memory (SPEC D9). `conversion.runner`
starts it and is the only caller:

    python -m deerflow_web.services.conversion.worker SOURCE OUTPUT RESULT
        [--memory-limit-mb N] [--time-limit-seconds S]

Protocol (a stand-in command used by tests receives the same arguments):

- OUTPUT is a file the parent created; on success it holds the Markdown as UTF-8.
- RESULT is where the outcome goes as one small JSON object: `{"status": "ok", "characters": N,
  "peak_rss_kb": N}` or `{"status": "error", "kind": KIND, "detail": TEXT}`, KIND being one of
  `ERROR_KINDS`. The parent turns kinds into sentences; the worker never talks to users.
- Exit status 0 on success, `EXIT_FAILED` on a reported failure and `EXIT_OUT_OF_MEMORY` when
  memory ran out (even if RESULT could not be written). Anything else, a signal included, is a
  crash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
from collections.abc import Sequence
from pathlib import Path

EXIT_FAILED = 1
EXIT_OUT_OF_MEMORY = 3

ERROR_KINDS = (
    "corrupt",
    "empty",
    "failed",
    "legacy",
    "memory",
    "password",
    "protected_office",
    "startup",
)

# Compound File Binary signature: legacy .doc/.xls/.ppt, and also encrypted .docx/.xlsx/.pptx.
_OLE_MAGIC = bytes.fromhex("D0CF11E0A1B11AE1")
_OOXML_SUFFIXES = frozenset({".docx", ".xlsx", ".pptx"})
_DETAIL_LIMIT = 300
_OUT_OF_MEMORY_MARKERS = ("failed to map segment", "cannot allocate memory", "bad_alloc")


def apply_limits(memory_limit_mb: int, time_limit_seconds: float) -> None:
    """Cap this process's address space and CPU time before any parser is imported.

    The CPU cap is a backstop for an orphaned worker: the parent kills the process group on
    its wall-clock limit, but if the parent itself dies, the kernel still ends the worker.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not leave a core dump
    if memory_limit_mb > 0:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if time_limit_seconds > 0:
        soft = math.ceil(time_limit_seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))


def convert(source: Path, output: Path) -> dict[str, object]:
    """Write `source` as Markdown to `output` and describe the outcome for the parent."""
    from markitdown import MarkItDown  # heavy import: only after the limits are in place
    from markitdown import UnsupportedFormatException

    try:
        markdown = MarkItDown().convert_local(str(source)).markdown
    except UnsupportedFormatException as error:
        # No converter claimed the content: a real .doc/.ppt, or bytes of no known format.
        kind = "legacy" if source.suffix.lower() in {".doc", ".ppt"} else "corrupt"
        return _error(kind, error)
    if not markdown.strip():
        return {"status": "error", "kind": "empty", "detail": ""}
    text = markdown.rstrip() + "\n"
    with output.open("w", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"status": "ok", "characters": len(text), "peak_rss_kb": peak_rss_kb}


def classify(error: BaseException, source: Path) -> str:
    """Name a failure from the exception and the parser errors markitdown collected in it."""
    causes = _causes(error)
    if any(isinstance(cause, MemoryError) for cause in causes):
        return "memory"
    texts = [f"{type(cause).__name__} {cause}".lower() for cause in causes]
    if any(marker in text for text in texts for marker in _OUT_OF_MEMORY_MARKERS):
        return "memory"  # a library that could not be mapped under RLIMIT_AS
    if any("password" in text or "encrypt" in text for text in texts):
        return "password"
    if isinstance(error, ImportError):
        # markitdown turns missing optional parsers into MissingDependencyException, so an
        # ImportError here means a parser library could not load, typically for lack of memory.
        return "startup"
    if source.suffix.lower() in _OOXML_SUFFIXES and _starts_with(source, _OLE_MAGIC):
        # An encrypted .docx/.xlsx/.pptx is stored as a CFB container, not as a zip.
        return "protected_office"
    if type(error).__name__ == "FileConversionException":  # by name: markitdown may not import
        return "corrupt"
    return "failed"


def _causes(error: BaseException) -> list[BaseException]:
    """The error, the exceptions of markitdown's attempts and their causes, without repeats."""
    pending: list[BaseException | None] = [error]
    for attempt in getattr(error, "attempts", None) or ():
        if attempt.exc_info is not None:
            pending.append(attempt.exc_info[1])
    seen: list[BaseException] = []
    while pending:
        current = pending.pop()
        if current is None or any(current is known for known in seen):
            continue
        seen.append(current)
        pending.extend((current.__cause__, current.__context__))
    return seen


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(magic)) == magic
    except OSError:
        return False


def _error(kind: str, error: BaseException) -> dict[str, object]:
    detail = f"{type(error).__name__}: {error}".strip()
    return {"status": "error", "kind": kind, "detail": detail[:_DETAIL_LIMIT]}


def _write_result(path: Path, result: dict[str, object]) -> None:
    path.write_text(json.dumps(result), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one conversion and return the exit status of the protocol above."""
    parser = argparse.ArgumentParser(description="Convert one document to Markdown.")
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--memory-limit-mb", type=int, default=0)
    parser.add_argument("--time-limit-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)

    apply_limits(args.memory_limit_mb, args.time_limit_seconds)
    try:
        try:
            result = convert(args.source, args.output)
        except Exception as error:  # parser errors arrive wrapped in FileConversionException
            result = _error(classify(error, args.source), error)
        _write_result(args.result, result)
    except MemoryError:
        return EXIT_OUT_OF_MEMORY  # not even the report fitted; the exit status says why
    if result["status"] == "ok":
        return 0
    return EXIT_OUT_OF_MEMORY if result["kind"] == "memory" else EXIT_FAILED


if __name__ == "__main__":
    # Skip interpreter teardown: after a MemoryError it can fail and turn our status into 120.
    os._exit(main())
