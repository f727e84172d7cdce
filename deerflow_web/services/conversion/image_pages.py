"""A multi-page TIFF (a fax, a scanner's document) read by OCR page by page, as a scan is.

A TIFF holds pages, not animation frames: reading only its first, as is right for a GIF,
would drop every page after the cover sheet. So each page is read the way a scanned PDF
page is (`pdf_pages`): decoded on its own (one page in memory at a time), bounded in pixels
from its own header, read within its own CPU-time limit and the conversion's budget, and
started with the same marker (`<!-- page 2 of 5: OCR, mean confidence 0.97 -->`), so
`read_file` and `grep` give the page of every line and an answer can cite "fax.tif, page 2".
A page that cannot be read says why in its marker and the others are still read. A
directory the TIFF marks as a reduced-resolution copy (a scanner's preview) or a mask is
no page and is skipped (`ocr.tiff_pages`).

Runs inside the conversion worker only, after its limits are set.
"""

from __future__ import annotations

from typing import Any
from typing import BinaryIO

from deerflow_web.services.conversion import ocr
from deerflow_web.services.conversion.page_marks import escape_text
from deerflow_web.services.conversion.page_marks import page_marker
from deerflow_web.services.conversion.pdf_pages import BUDGET_SPENT
from deerflow_web.services.conversion.pdf_pages import OCR_MISSING
from deerflow_web.services.conversion.pdf_pages import OcrBudget
from deerflow_web.services.conversion.pdf_pages import PdfReport


def pages_markdown(stream: BinaryIO, budget: OcrBudget | None = None) -> tuple[str, PdfReport]:
    """The image's pages as Markdown: a line with their number, size and format, then
    each page's marker and recognised text, and what was done (the report a PDF gives).

    Raises:
        OSError: Pillow cannot read the image at all.
        ocr.ImageTooLarge: Every page is above `ocr.MAX_DECODE_PIXELS` (the first is named),
            as a single image would be refused.
        ocr.OcrUnavailable: The engine cannot be loaded, so no page could be read.
    """
    budget = budget or OcrBudget()
    image = ocr.open_header(stream)
    frames = ocr.tiff_pages(image)
    count = len(frames)
    sizes = []
    for index in frames:  # headers only: no page is decoded here
        image.seek(index)
        sizes.append(image.size)
    report = PdfReport(pages=count)
    hows: list[str] = []
    texts: list[str] = []
    refusals: list[BaseException] = []
    for index in frames:
        how, text = _read_page(image, index, budget, report, refusals)
        hows.append(how)
        texts.append(text)
    if len(refusals) == count:  # not one page decoded: refused as one image would be
        raise refusals[0]
    if report.ocr_unavailable is not None and report.ocr_pages == 0:
        raise ocr.OcrUnavailable(report.ocr_unavailable)
    parts = [_header(image.format or "image", sizes)]
    for number, (how, text) in enumerate(zip(hows, texts, strict=True), start=1):
        parts.append(page_marker(number, count, how))
        if text:
            parts.append(escape_text(text))
    return "\n".join(parts) + "\n", report


def _read_page(
    image: Any, index: int, budget: OcrBudget, report: PdfReport, refusals: list[BaseException]
) -> tuple[str, str]:
    """(how page `index` was read, its text), counted in `report`; a page whose pixels
    cannot be decoded adds its error to `refusals`."""
    if report.ocr_unavailable is not None:
        return OCR_MISSING, ""
    if budget.spent():
        return BUDGET_SPENT, ""
    try:
        frame = ocr.decode_frame(image, index)
    except ocr.ImageTooLarge as error:
        refusals.append(error)
        return (
            f"not read: it is {error.width} x {error.height} pixels, above the limit of "
            f"{ocr.MAX_DECODE_PIXELS:,} pixels",
            "",
        )
    except (OSError, ValueError) as error:
        refusals.append(error)
        return "not read: this page is damaged", ""
    limit = budget.page_limit()
    try:
        result = ocr.recognize(frame, limit)
    except ocr.PageTimeLimit:
        return f"not read: OCR stopped after {limit:.0f} s of CPU time (limit per page)", ""
    except ocr.OcrUnavailable as error:
        report.ocr_unavailable = str(error)
        return OCR_MISSING, ""
    report.ocr_pages += 1
    report.ocr_seconds.append(result.seconds)
    report.ocr_cpu_seconds.append(result.cpu_seconds)
    return ocr.describe(result), result.text


def _header(format_name: str, sizes: list[tuple[int, int]]) -> str:
    """`<!-- image: 3 pages of 1240 x 1754 pixels (TIFF); read by OCR page by page -->`,
    "of up to" the largest page when their sizes differ."""
    width, height = max(sizes, key=lambda size: size[0] * size[1])
    up_to = "" if len(set(sizes)) == 1 else "up to "
    return (
        f"<!-- image: {len(sizes)} pages of {up_to}{width} x {height} pixels ({format_name}); "
        "read by OCR page by page -->"
    )
