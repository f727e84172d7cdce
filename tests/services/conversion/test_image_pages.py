"""A multi-page TIFF (a fax) is read by OCR page by page, as a scanned PDF is: one marker
per page saying how it was read, the same pixel bounds per page, the same budget.

Real faxes made here (1-bit, Group 4), read by the real engine; the first test goes
through the real isolated worker with the limits conversion jobs use.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from deerflow_web.errors import ConversionError
from deerflow_web.services.conversion import image_pages
from deerflow_web.services.conversion import ocr
from deerflow_web.services.conversion import worker
from deerflow_web.services.conversion.pdf_pages import OcrBudget
from deerflow_web.services.prompt.page_lines import PageTracker
from deerflow_web.services.prompt.page_lines import line_label
from tests.support.images import FAX_PAGES
from tests.support.images import make_fax_tiff
from tests.support.images import set_tiff_page_size
from tests.support.images import set_tiff_tags
from tests.support.images import text_image
from tests.support.ocr_reads import assert_reads
from tests.support.ocr_reads import convert
from tests.support.ocr_reads import pages_of

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

_OCR_HOW = re.compile(r"OCR, mean confidence (0\.\d\d|1\.00)")


class PagesBudget(OcrBudget):
    """A budget that is spent once `pages` pages have been started: deterministic,
    where a clock would depend on the machine's load."""

    def __init__(self, pages: int) -> None:
        super().__init__()
        self.left = pages

    def spent(self) -> bool:
        self.left -= 1
        return self.left < 0


def test_a_fax_is_read_page_by_page_in_order_in_the_worker(tmp_path: Path) -> None:
    fax = make_fax_tiff(tmp_path / "fax.tif")

    markdown = convert(fax)

    header = markdown.splitlines()[0]
    assert header == (
        "<!-- image: 3 pages of 1240 x 1753 pixels (TIFF); read by OCR page by page -->"
    )
    pages = pages_of(markdown)
    assert sorted(pages) == [1, 2, 3]
    for number, lines in enumerate(FAX_PAGES, start=1):
        how, text = pages[number]
        assert _OCR_HOW.fullmatch(how), how
        assert_reads(lines, text, f"fax page {number}")
    first = markdown.index("harbour office")
    third = markdown.index("30 November")
    assert first < markdown.index("delivery terms") < third
    # read_file and grep follow the same markers: the third page's lines say p.3.
    tracker = PageTracker()
    labels = {line: line_label(tracker.line(line)) for line in markdown.splitlines()}
    assert labels[next(line for line in labels if "30 November" in line)] == "p.3"
    assert labels[next(line for line in labels if "harbour office" in line)] == "p.1"


def _fax(pages=FAX_PAGES) -> bytes:
    """A small fax TIFF (one short image per page) for the in-process checks, each
    directory with its NewSubfileType (0: a page)."""
    images = [text_image(lines, width=900, size=36).convert("1") for lines in pages]
    buffer = io.BytesIO()
    images[0].save(
        buffer,
        format="TIFF",
        save_all=True,
        append_images=images[1:],
        compression="group4",
        tiffinfo={254: 0},
    )
    return buffer.getvalue()


def test_pages_past_the_conversion_budget_are_marked_not_read() -> None:
    markdown, report = image_pages.pages_markdown(io.BytesIO(_fax()), PagesBudget(pages=1))

    pages = pages_of(markdown)
    assert _OCR_HOW.fullmatch(pages[1][0])
    assert "harbour office" in pages[1][1]
    assert pages[2] == pages[3] == (image_pages.BUDGET_SPENT, "")
    assert (report.pages, report.ocr_pages, len(report.ocr_seconds)) == (3, 1, 1)
    # The words a PDF's unread pages have (README, "Images, scanned pages").
    assert image_pages.BUDGET_SPENT == "not read: the time this conversion may spend on OCR ran out"


def test_a_page_past_its_cpu_time_limit_is_marked_and_the_next_pages_still_run() -> None:
    ocr.recognize(text_image(("warm up",), width=300))  # the engine loads outside the limit

    markdown, report = image_pages.pages_markdown(io.BytesIO(_fax()), OcrBudget(page_seconds=0.001))

    pages = pages_of(markdown)
    assert sorted(pages) == [1, 2, 3]
    for how, text in pages.values():
        assert how.startswith("not read: OCR stopped after") and how.endswith("(limit per page)")
        assert text == ""
    assert report.ocr_pages == 0


def test_a_page_above_the_pixel_limit_is_named_and_the_others_are_read(tmp_path: Path) -> None:
    data = set_tiff_page_size(_fax(), 1, 50_000, 50_000)
    output = tmp_path / "out.md"

    result = worker.convert(Path("document.tiff"), output, io.BytesIO(data))

    assert result["status"] == "ok", result
    assert (result["pages"], result["ocr_pages"]) == (3, 2)
    markdown = output.read_text(encoding="utf-8")
    assert markdown.startswith("<!-- image: 3 pages of up to 50000 x 50000 pixels (TIFF);")
    pages = pages_of(markdown)
    assert pages[2] == (
        "not read: it is 50000 x 50000 pixels, above the limit of "
        f"{ocr.MAX_DECODE_PIXELS:,} pixels",
        "",
    )
    assert "harbour office" in pages[1][1] and "30 November" in pages[3][1]


def test_a_tiff_whose_every_page_is_too_large_is_refused_as_one_image_is(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    data = _fax(FAX_PAGES[:2])
    for index in (0, 1):
        data = set_tiff_page_size(data, index, 50_000, 40_000)
    (docs / "bomb.tif").write_bytes(data)

    with pytest.raises(ConversionError) as caught:
        convert(docs / "bomb.tif")

    assert "bomb.tif is too large an image to read (50000 x 40000 pixels)" in str(caught.value)
    assert [p.name for p in docs.iterdir()] == ["bomb.tif"]


def test_only_a_tiff_is_read_as_pages_a_gif_keeps_its_first_frame() -> None:
    gif = io.BytesIO()
    frames = [text_image((f"Frame {n}",), width=300) for n in (1, 2, 3)]
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    one_page = io.BytesIO()
    frames[0].save(one_page, format="TIFF")

    assert ocr.page_count(io.BytesIO(_fax())) == 3
    assert ocr.page_count(one_page) == 1  # read as one image, marker and all
    assert ocr.page_count(gif) == 1
    assert gif.tell() == 0 and one_page.tell() == 0
    assert ocr.page_count(io.BytesIO(b"II*\x00 damaged")) == 1  # the image path says why


def test_a_reduced_resolution_copy_in_a_tiff_is_no_page_of_its_own() -> None:
    """Scanners store a preview as a directory marked "reduced-resolution" (TIFF 6.0,
    NewSubfileType bit 0): it is skipped, so the scan is not read twice."""
    data = _fax((FAX_PAGES[0], FAX_PAGES[0], FAX_PAGES[2]))
    with_preview = set_tiff_tags(data, 1, {254: 1})

    markdown, report = image_pages.pages_markdown(io.BytesIO(with_preview))

    pages = pages_of(markdown)
    assert sorted(pages) == [1, 2] and report.pages == 2
    assert "harbour office" in pages[1][1] and "30 November" in pages[2][1]
    assert markdown.count("harbour office") == 1
    one_page = set_tiff_tags(_fax(FAX_PAGES[:2]), 1, {254: 1})
    assert ocr.page_count(io.BytesIO(one_page)) == 1  # a page and its preview: one image
