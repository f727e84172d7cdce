"""A PDF as Markdown page by page: the text layer where there is one, OCR where not.

markitdown reads a PDF as one stream of text and drops page boundaries, and it returns
nothing for a scanned page. Here each page keeps its place: the text layer is extracted
the way markitdown extracts it (its form and table heuristics through pdfplumber, else
pdfminer for prose, whose page breaks are kept), and every page with (almost) no text
layer is rendered with PDFium and read by OCR (`ocr.py`). Each page starts with a marker
(`page_marks.py`) that says how it was read, so a PDF mixing text and scanned pages gives
both, and the model knows which text is exact and which is recognised, with what
confidence.

Runs inside the conversion worker only, after its limits are set.
"""

from __future__ import annotations

import io
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from deerflow_web.services.conversion import ocr
from deerflow_web.services.conversion.page_marks import escape_text
from deerflow_web.services.conversion.page_marks import page_marker

MIN_TEXT_CHARACTERS = 8  # fewer non-blank characters than this: the page is read by OCR
RENDER_DPI = 200  # scanned pages are rendered at this resolution, within MAX_OCR_PIXELS
BUDGET_SHARE = 0.8  # OCR starts no page once this share of the worker's time is used
# How a page not read says why, in its marker (a multi-page TIFF's pages say the same).
BUDGET_SPENT = "not read: the time this conversion may spend on OCR ran out"
OCR_MISSING = "not read: OCR is not available here"


@dataclass
class OcrBudget:
    """How long OCR may go on in this worker: wall clock and CPU time, and CPU per page."""

    wall_seconds: float = 0.0  # 0: no limit
    cpu_seconds: float = 0.0  # 0: no limit
    page_seconds: float = ocr.PAGE_SECONDS
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def for_worker(cls, time_limit_seconds: float) -> OcrBudget:
        """A share of the worker's wall-clock limit and of its CPU limit (RLIMIT_CPU, set
        by the parent), so the worker stops OCR and reports before either kills it."""
        soft, _ = resource.getrlimit(resource.RLIMIT_CPU)
        cpu = 0.0 if soft == resource.RLIM_INFINITY else soft * BUDGET_SHARE
        return cls(wall_seconds=max(time_limit_seconds, 0.0) * BUDGET_SHARE, cpu_seconds=cpu)

    def spent(self) -> bool:
        if self.wall_seconds and time.monotonic() - self.started >= self.wall_seconds:
            return True
        return bool(self.cpu_seconds and time.process_time() >= self.cpu_seconds)

    def page_limit(self) -> float:
        """This page's CPU-time limit: its own, or what is left of the CPU budget, if less."""
        if not self.cpu_seconds:
            return self.page_seconds
        left = self.cpu_seconds - time.process_time()
        return max(min(self.page_seconds, left), 0.1)


@dataclass
class PdfReport:
    """What was done per page, for the worker's result and the benchmark."""

    pages: int = 0
    text_pages: int = 0
    ocr_pages: int = 0
    ocr_seconds: list[float] = field(default_factory=list)
    ocr_cpu_seconds: list[float] = field(default_factory=list)
    ocr_unavailable: str | None = None


@dataclass
class _Page:
    text: str = ""
    largest_image: tuple[int, int] | None = None  # pixels of its largest embedded image
    how: str = "text layer"


def _markitdown_helpers() -> tuple[Callable[[Any], str | None], Callable[[str], str]]:
    """markitdown's form/table extraction and its line clean-up, so the text layer reads
    as markitdown would give it; plain extraction if a release renamed them."""
    try:
        from markitdown.converters._pdf_converter import (
            _extract_form_content_from_words as form_content,
        )
        from markitdown.converters._pdf_converter import (
            _merge_partial_numbering_lines as merge_numbering,
        )
    except ImportError:
        return (lambda page: None), (lambda text: text)
    return form_content, merge_numbering


def _text_layer(data: bytes) -> list[_Page]:
    """Each page's text layer and largest image, in page order."""
    import pdfminer.high_level
    import pdfplumber

    form_content, merge_numbering = _markitdown_helpers()
    pages: list[_Page] = []
    forms = 0
    try:
        with pdfplumber.open(io.BytesIO(data)) as pdf:
            for page in pdf.pages:
                entry = _Page(largest_image=_largest_image(page))
                content = form_content(page)
                if content is not None:
                    forms += 1
                    entry.text = content
                else:
                    entry.text = page.extract_text() or ""
                pages.append(entry)
                page.close()  # pdfplumber caches every page's objects otherwise
    except Exception:
        pages, forms = [], 0  # markitdown falls back to pdfminer alone; so do we
    if forms == 0:
        # Prose reads better through pdfminer, which ends every page with a form feed.
        text = pdfminer.high_level.extract_text(io.BytesIO(data))
        pieces = text.split("\f")
        if pieces and not pieces[-1].strip():
            pieces.pop()
        if not pages:
            pages = [_Page() for _ in pieces]
        if len(pieces) == len(pages):
            for entry, piece in zip(pages, pieces, strict=True):
                entry.text = piece
    for entry in pages:
        entry.text = merge_numbering(entry.text).strip()
    return pages


def _largest_image(page: Any) -> tuple[int, int] | None:
    """The stored size in pixels of the page's largest image, from the PDF's own objects
    (nothing is decoded)."""
    largest = None
    try:
        images = page.images
    except Exception:
        return None
    for image in images:
        try:
            width, height = (int(value) for value in image.get("srcsize") or (0, 0))
        except (TypeError, ValueError):
            continue
        if largest is None or width * height > largest[0] * largest[1]:
            largest = (width, height)
    return largest


def _needs_ocr(text: str) -> bool:
    return sum(not char.isspace() for char in text) < MIN_TEXT_CHARACTERS


def _render(document: Any, index: int) -> Any:
    """Page `index` as an RGB image at `RENDER_DPI` at most, no larger than the engine
    reads (`ocr.DETECTION_SIDE`, `ocr.MAX_OCR_PIXELS`)."""
    page = document[index]
    try:
        width, height = page.get_size()  # points, 1/72 inch
        area = max(width * height, 1.0)
        # No more pixels than the engine keeps: it scales to DETECTION_SIDE anyway.
        scale = min(
            RENDER_DPI / 72,
            ocr.DETECTION_SIDE / max(width, height, 1.0),
            math.sqrt(ocr.MAX_OCR_PIXELS / area),
        )
        bitmap = page.render(scale=scale)
        try:
            return bitmap.to_pil().convert("RGB")
        finally:
            bitmap.close()
    finally:
        page.close()


def _read_scanned(data: bytes, pages: list[_Page], budget: OcrBudget, report: PdfReport) -> None:
    """OCR every page without a text layer, in order, while the budget lasts."""
    wanted = [index for index, page in enumerate(pages) if _needs_ocr(page.text)]
    if not wanted:
        return
    import pypdfium2

    document = pypdfium2.PdfDocument(data)
    try:
        for index in wanted:
            page = pages[index]
            if report.ocr_unavailable is not None:
                page.how = OCR_MISSING
                continue
            if budget.spent():
                page.how = BUDGET_SPENT
                continue
            if page.largest_image is not None:
                width, height = page.largest_image
                if width * height > ocr.MAX_DECODE_PIXELS:
                    page.how = (
                        f"not read: it holds an image of {width} x {height} pixels, above "
                        f"the limit of {ocr.MAX_DECODE_PIXELS:,} pixels"
                    )
                    continue
            limit = budget.page_limit()
            try:
                result = ocr.recognize(_render(document, index), limit)
            except ocr.PageTimeLimit:
                page.how = f"not read: OCR stopped after {limit:.0f} s of CPU time (limit per page)"
                continue
            except ocr.OcrUnavailable as error:
                report.ocr_unavailable = str(error)
                page.how = OCR_MISSING
                continue
            report.ocr_pages += 1
            report.ocr_seconds.append(result.seconds)
            report.ocr_cpu_seconds.append(result.cpu_seconds)
            if result.text.strip():
                page.text, page.how = result.text, ocr.describe(result)
            elif not page.text:  # else a page number alone: its text layer stays
                page.how = ocr.describe(result)
    finally:
        document.close()


def pdf_markdown(data: bytes, budget: OcrBudget | None = None) -> tuple[str, PdfReport]:
    """The PDF as Markdown with a marker at the start of every page, and what was done.

    The Markdown is empty when no page gave any text. Parser errors (damaged file, user
    password) propagate as pdfminer raises them, for the worker to classify.
    """
    budget = budget or OcrBudget()
    pages = _text_layer(data)
    report = PdfReport(pages=len(pages))
    _read_scanned(data, pages, budget, report)
    report.text_pages = sum(page.how == "text layer" for page in pages)
    if not any(page.text.strip() for page in pages):
        return "", report
    parts = []
    for number, page in enumerate(pages, start=1):
        parts.append(page_marker(number, len(pages), page.how))
        if page.text:
            parts.append(escape_text(page.text))
        parts.append("")
    return "\n".join(parts), report
