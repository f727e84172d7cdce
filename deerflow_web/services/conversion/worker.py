"""Child process that converts one document to Markdown with markitdown.

Parsing untrusted Office and PDF files happens here, in a process of its own, so a hostile or
huge file can exhaust only this process's time and memory (SPEC D9). `conversion.runner`
starts it and is the only caller:

    python -m deerflow_web.services.conversion.worker SOURCE OUTPUT RESULT
        [--memory-limit-mb N] [--time-limit-seconds S] [--max-output-bytes N] < document

Protocol (a stand-in command used by tests receives the same arguments):

- The document's bytes arrive on standard input (a regular file the parent opened without
  following links). SOURCE is only a neutral name such as `document.pdf`, whose suffix is the
  format the user's file name claims: no host path ever reaches a parser, so none can end up
  in the Markdown (markitdown's zip converter, for one, writes the path it was given).
- OUTPUT and RESULT are names in the worker's working directory, a private folder that the
  parent removes afterwards; on success OUTPUT holds the Markdown as UTF-8.
- RESULT is where the outcome goes as one small JSON object: `{"status": "ok", "characters": N,
  "peak_rss_kb": N}` or `{"status": "error", "kind": KIND, "detail": TEXT}`, KIND being one of
  `ERROR_KINDS`. The parent turns kinds into sentences; the worker never talks to users.
- Exit status 0 on success, `EXIT_FAILED` on a reported failure and `EXIT_OUT_OF_MEMORY` when
  memory ran out (even if RESULT could not be written). Anything else, a signal included, is a
  crash.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import BinaryIO

from deerflow_web.models import OCR_IMAGE_EXTENSIONS
from deerflow_web.services.conversion.ocr import image_format

EXIT_FAILED = 1
EXIT_OUT_OF_MEMORY = 3

ERROR_KINDS = (
    "corrupt",
    "empty",
    "failed",
    "legacy",
    "memory",
    "mislabelled",
    "ocr_timeout",
    "ocr_unavailable",
    "password",
    "protected_office",
    "startup",
    "too_large",
    "too_many_pixels",
)

# Compound File Binary signature: legacy .doc/.xls/.ppt, and also encrypted .docx/.xlsx/.pptx.
_OLE_MAGIC = bytes.fromhex("D0CF11E0A1B11AE1")
_OOXML_SUFFIXES = frozenset({".docx", ".xlsx", ".pptx"})
# The part every real package of each Office Open XML type holds.
_OOXML_MAIN_PART = {
    ".docx": "word/document.xml",
    ".xlsx": "xl/workbook.xml",
    ".pptx": "ppt/presentation.xml",
}
_PDF_HEADER_WINDOW = 1024  # readers accept junk before %PDF- within the first kilobyte
_DETAIL_LIMIT = 300
_OUT_OF_MEMORY_MARKERS = ("failed to map segment", "cannot allocate memory", "bad_alloc")


def apply_limits(memory_limit_mb: int, time_limit_seconds: float) -> None:
    """Cap this process's address space and CPU time before any parser is imported.

    The CPU cap is a backstop for a worker started without one: the parent sets the job's
    own CPU limit (`conversion.cpu_limit_seconds`) before exec, which this never raises.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not leave a core dump
    if memory_limit_mb > 0:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if time_limit_seconds > 0 and resource.getrlimit(resource.RLIMIT_CPU)[0] == (
        resource.RLIM_INFINITY
    ):
        soft = math.ceil(time_limit_seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))


def describe_content(stream: BinaryIO) -> str:
    """Name what the bytes are, whatever the file is called: `pdf`, `docx`, `xlsx`, `pptx`,
    `ole` (a Compound File: legacy Office or encrypted OOXML), `zip`, `image` (a format
    read by OCR), `html`, `text` or `binary`. The stream is left at its start."""
    stream.seek(0)
    head = stream.read(8192)
    stream.seek(0)
    if b"%PDF-" in head[:_PDF_HEADER_WINDOW]:
        return "pdf"
    if head.startswith(_OLE_MAGIC):
        return "ole"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            names = set(zipfile.ZipFile(stream).namelist())
        except (zipfile.BadZipFile, OSError, ValueError):
            names = set()
        finally:
            stream.seek(0)
        for suffix, part in _OOXML_MAIN_PART.items():
            if part in names:
                return suffix[1:]
        return "zip"
    if image_format(head) is not None:
        return "image"
    if b"\0" in head:
        return "binary"
    lowered = head.lstrip()[:512].lower()
    if lowered.startswith((b"<!doctype html", b"<html")) or b"<html" in lowered:
        return "html"
    return "text"


_CONTENT_NAMES = {
    "pdf": "a PDF document",
    "docx": "a Word (.docx) document",
    "xlsx": "an Excel (.xlsx) workbook",
    "pptx": "a PowerPoint (.pptx) presentation",
    "ole": "a legacy Office or encrypted file",
    "zip": "a plain ZIP archive",
    "image": "an image",
    "html": "HTML text",
    "text": "plain text",
    "binary": "binary data of another kind",
}


def pick_converter(suffix: str, content: str) -> str | None:
    """The one converter for a file: the format its name claims, confirmed by its bytes.

    None means the bytes are not that format. markitdown on its own picks a converter by
    content and falls back to plain text, which turned a "PDF" of text into a `.md` of its
    raw bytes; here the name's format is forced, and a mismatch is a failure.
    """
    if suffix == ".pdf" and content == "pdf":
        return "pdf"
    if suffix in _OOXML_SUFFIXES and content == suffix[1:]:
        return content
    if suffix == ".xls" and content == "ole":
        return "xls"
    if suffix in OCR_IMAGE_EXTENSIONS and content == "image":
        return "image"  # any image format: Pillow reads a PNG named .jpg by its bytes
    return None


def _converter(kind: str) -> Any:
    from markitdown.converters import DocxConverter
    from markitdown.converters import PdfConverter
    from markitdown.converters import PptxConverter
    from markitdown.converters import XlsConverter
    from markitdown.converters import XlsxConverter

    classes = {
        "pdf": PdfConverter,
        "docx": DocxConverter,
        "xlsx": XlsxConverter,
        "pptx": PptxConverter,
        "xls": XlsConverter,
    }
    return classes[kind]()


def convert(
    source: Path,
    output: Path,
    stream: BinaryIO | None = None,
    max_output_bytes: int = 0,
    time_limit_seconds: float = 0.0,
) -> dict[str, object]:
    """Write the document as Markdown to `output` and describe the outcome for the parent.

    Args:
        source: The document's name; its suffix is the format the name claims. Read from
            when `stream` is None (direct calls), never otherwise.
        output: Where the Markdown goes.
        stream: The document's bytes (the worker's standard input).
        max_output_bytes: Refuse Markdown longer than this many UTF-8 bytes (0: no cap).
        time_limit_seconds: The worker's wall-clock limit; OCR stops starting pages well
            before it (0: no limit).
    """
    if stream is None:
        with source.open("rb") as handle:
            return convert(source, output, handle, max_output_bytes, time_limit_seconds)
    suffix = source.suffix.lower()
    if suffix in {".doc", ".ppt"}:
        return {"status": "error", "kind": "legacy", "detail": ""}
    content = describe_content(stream)
    kind = pick_converter(suffix, content)
    if kind is None:
        if content == "ole" and suffix in _OOXML_SUFFIXES:
            return {"status": "error", "kind": "protected_office", "detail": ""}
        if content == "binary":  # bytes of no format we can name: damaged, as far as we know
            return {"status": "error", "kind": "corrupt", "detail": ""}
        return {"status": "error", "kind": "mislabelled", "detail": _CONTENT_NAMES[content]}

    facts: dict[str, object] = {}
    try:
        if kind == "image":
            markdown = _image(stream, time_limit_seconds, facts)
        elif kind == "pdf":
            markdown = _pdf(stream, time_limit_seconds, facts)
        else:
            from markitdown import StreamInfo  # heavy import: only after the limits are set

            info = StreamInfo(extension=suffix, filename=f"document{suffix}")
            markdown = _converter(kind).convert(stream, info).markdown
    except _Refused as refused:
        return {"status": "error", "kind": refused.kind, "detail": refused.detail}
    if not markdown.strip():
        return {"status": "error", "kind": "empty", "detail": ""}
    text = markdown.rstrip() + "\n"
    data = text.encode("utf-8")
    if max_output_bytes and len(data) > max_output_bytes:
        return {"status": "error", "kind": "too_large", "detail": str(len(data))}
    with output.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"status": "ok", "characters": len(text), "peak_rss_kb": peak_rss_kb, **facts}


class _Refused(Exception):
    """A failure the worker names itself, with one of `ERROR_KINDS`."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind = kind
        self.detail = detail[:_DETAIL_LIMIT]


def _image(stream: BinaryIO, time_limit_seconds: float, facts: dict[str, object]) -> str:
    """An image's size in pixels and its text, read by OCR; a multi-page TIFF page by page,
    within the budget a PDF's scanned pages get (`image_pages`)."""
    from deerflow_web.services.conversion import image_pages
    from deerflow_web.services.conversion import ocr
    from deerflow_web.services.conversion import pdf_pages

    if ocr.page_count(stream) > 1:
        budget = pdf_pages.OcrBudget.for_worker(time_limit_seconds)
        try:
            markdown, report = image_pages.pages_markdown(stream, budget)
        except ocr.ImageTooLarge as error:
            raise _Refused("too_many_pixels", str(error)) from error
        except ocr.OcrUnavailable as error:
            raise _Refused("ocr_unavailable", str(error)) from error
        facts.update(
            pages=report.pages,
            ocr_pages=report.ocr_pages,
            ocr_seconds=[round(seconds, 3) for seconds in report.ocr_seconds],
            ocr_cpu_seconds=[round(seconds, 3) for seconds in report.ocr_cpu_seconds],
        )
        return markdown
    try:
        markdown, page = ocr.image_markdown(stream)
    except ocr.ImageTooLarge as error:
        raise _Refused("too_many_pixels", str(error)) from error
    except ocr.PageTimeLimit as error:
        raise _Refused("ocr_timeout", f"{ocr.PAGE_SECONDS:g}") from error
    except ocr.OcrUnavailable as error:
        raise _Refused("ocr_unavailable", str(error)) from error
    facts.update(
        pages=1,
        ocr_pages=1,
        ocr_seconds=[round(page.seconds, 3)],
        ocr_cpu_seconds=[round(page.cpu_seconds, 3)],
    )
    return markdown


def _pdf(stream: BinaryIO, time_limit_seconds: float, facts: dict[str, object]) -> str:
    """A PDF page by page (`pdf_pages`): its text layer, and OCR for scanned pages."""
    from deerflow_web.services.conversion import pdf_pages

    budget = pdf_pages.OcrBudget.for_worker(time_limit_seconds)
    markdown, report = pdf_pages.pdf_markdown(stream.read(), budget)
    facts.update(
        pages=report.pages,
        ocr_pages=report.ocr_pages,
        ocr_seconds=[round(seconds, 3) for seconds in report.ocr_seconds],
        ocr_cpu_seconds=[round(seconds, 3) for seconds in report.ocr_cpu_seconds],
    )
    if not markdown and report.ocr_unavailable is not None:
        raise _Refused("ocr_unavailable", report.ocr_unavailable)
    return markdown


def classify(error: BaseException, source: Path) -> str:
    """Name a failure from the exception and the parser errors markitdown collected in it."""
    causes = _causes(error)
    if any(isinstance(cause, MemoryError) for cause in causes):
        return "memory"
    if any(type(cause).__name__ == "DecompressionBombError" for cause in causes):
        return "too_many_pixels"  # Pillow's own check, behind ours
    texts = [f"{type(cause).__name__} {cause}".lower() for cause in causes]
    if any(marker in text for text in texts for marker in _OUT_OF_MEMORY_MARKERS):
        return "memory"  # a library that could not be mapped under RLIMIT_AS
    if any("password" in text or "encrypt" in text for text in texts):
        return "password"
    if isinstance(error, ImportError):
        # markitdown turns missing optional parsers into MissingDependencyException, so an
        # ImportError here means a parser library could not load, typically for lack of memory.
        return "startup"
    if type(error).__name__ == "MissingDependencyException":
        return "startup"
    # The bytes were checked to be the claimed format, so a parser error means a damaged
    # file: pdfminer, zipfile, lxml and xlrd all raise their own types.
    return "corrupt"


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
    parser.add_argument("--max-output-bytes", type=int, default=0)
    args = parser.parse_args(argv)

    apply_limits(args.memory_limit_mb, args.time_limit_seconds)
    try:
        try:
            with open(0, "rb", closefd=False) as stdin:
                stream = stdin if stdin.seekable() else io.BytesIO(stdin.read())
                result = convert(
                    args.source,
                    args.output,
                    stream,
                    args.max_output_bytes,
                    args.time_limit_seconds,
                )
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
