"""Images and scanned PDF pages read by OCR, in the real isolated worker, on images made here.

The quality figures (characters right / characters drawn) are asserted with a margin and
printed with `-s`; speed belongs in bench/bench_ocr.py.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from PIL import Image

from deerflow_web.errors import ConversionError
from deerflow_web.services.conversion import ocr
from deerflow_web.services.conversion import pdf_pages
from deerflow_web.services.conversion import worker
from deerflow_web.services.conversion.page_marks import parse_mark
from tests.support.documents import make_pdf
from tests.support.documents import pdf_from_objects
from tests.support.images import PHOTO_LINES
from tests.support.images import SCAN_PAGES
from tests.support.images import SCREENSHOT_LINES
from tests.support.images import make_mixed_pdf
from tests.support.images import make_photo_jpeg
from tests.support.images import make_png_bomb
from tests.support.images import make_scanned_pdf
from tests.support.images import make_text_png
from tests.support.images import text_image
from tests.support.ocr_reads import assert_reads
from tests.support.ocr_reads import convert
from tests.support.ocr_reads import pages_of

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    return folder


def test_a_screenshot_reads_english_and_chinese_with_its_size(docs: Path) -> None:
    markdown = convert(make_text_png(docs / "shot.png"))

    header, _, text = markdown.partition("\n")
    assert re.fullmatch(
        r"<!-- image: 1400 x \d+ pixels \(PNG\); OCR, mean confidence 0\.\d\d -->", header
    ), header
    assert_reads(SCREENSHOT_LINES, text, "screenshot")
    assert "4,210.50" in text and "上传文件的内容识别测试" in text


def test_a_photo_of_text_is_read(docs: Path) -> None:
    markdown = convert(make_photo_jpeg(docs / "photo.jpg"))

    header, _, text = markdown.partition("\n")
    assert "(JPEG); OCR, mean confidence" in header
    assert_reads(PHOTO_LINES, text, "photo")


def test_a_scanned_pdf_is_read_page_by_page(docs: Path) -> None:
    markdown = convert(make_scanned_pdf(docs / "scan.pdf"))

    pages = pages_of(markdown)
    assert sorted(pages) == [1, 2]
    for number, lines in enumerate(SCAN_PAGES, start=1):
        how, text = pages[number]
        assert re.fullmatch(r"OCR, mean confidence 0\.\d\d|OCR, mean confidence 1\.00", how)
        assert_reads(lines, text, f"scanned page {number}")
    assert markdown.startswith("<!-- page 1 of 2: OCR")


def test_a_pdf_mixing_text_and_scanned_pages_gets_both(docs: Path) -> None:
    markdown = convert(make_mixed_pdf(docs / "mixed.pdf"))

    pages = pages_of(markdown)
    assert [pages[n][0] for n in (1, 3)] == ["text layer", "text layer"]
    assert pages[1][1] == "Typed introduction page\nRevenue grew in every region."
    assert pages[3][1] == "Typed closing page\nContact the finance office."
    assert pages[2][0].startswith("OCR, mean confidence")
    assert_reads(("Scanned signature page", "Signed at Harbour Road 7"), pages[2][1], "mixed")


def test_a_text_pdf_marks_every_page_and_keeps_its_text(docs: Path) -> None:
    markdown = convert(make_pdf(docs / "long.pdf", lines=("Opening line",), filler_pages=2))

    assert [(n, how) for n, (how, _) in pages_of(markdown).items()] == [
        (1, "text layer"),
        (2, "text layer"),
        (3, "text layer"),
    ]
    assert pages_of(markdown)[1][1] == "Opening line"


def test_text_that_imitates_a_page_marker_is_escaped(docs: Path) -> None:
    fake = "<!-- page 9 of 9: text layer -->"
    markdown = convert(make_pdf(docs / "forged.pdf", lines=(fake, "Real text on page one")))

    assert [parse_mark(line) for line in markdown.splitlines() if parse_mark(line)] == [
        parse_mark("<!-- page 1 of 1: text layer -->")
    ]
    assert "\\" + fake in markdown


def test_a_decompression_bomb_is_refused_from_its_header(docs: Path) -> None:
    bomb = make_png_bomb(docs / "bomb.png")
    assert bomb.stat().st_size < 1024 * 1024  # 2.5 gigapixels in well under a megabyte

    with pytest.raises(ConversionError) as caught:
        convert(bomb)

    message = str(caught.value)
    assert "bomb.png is too large an image to read (50000 x 50000 pixels)" in message
    assert f"at most {ocr.MAX_DECODE_PIXELS:,} pixels" in message
    assert sorted(p.name for p in docs.iterdir()) == ["bomb.png"]


def test_an_image_without_text_gives_its_size_and_says_so(docs: Path) -> None:
    Image.new("RGB", (640, 480), (200, 220, 240)).save(docs / "sky.png")

    markdown = convert(docs / "sky.png")

    assert markdown == (
        "<!-- image: 640 x 480 pixels (PNG); OCR found no text -->\n"
        "[No text was found in this image.]\n"
    )


def test_an_image_under_another_image_name_is_read_by_its_bytes(docs: Path) -> None:
    text_image(("Renamed picture text",)).save(docs / "really-a-png.jpg", format="PNG")

    markdown = convert(docs / "really-a-png.jpg")

    assert "(PNG); OCR, mean confidence" in markdown
    assert "Renamed picture text" in markdown


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("notes.png", b"just some text, not an image\n", "its content is plain text"),
        ("scan.jpg", b"%PDF-1.4\n%\xe2\xe3\n", "its content is a PDF document"),
        ("broken.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "is corrupt or not a valid PNG"),
    ],
)
def test_a_file_that_is_not_the_image_its_name_says_fails_clearly(
    docs: Path, name: str, content: bytes, reason: str
) -> None:
    (docs / name).write_bytes(content)

    with pytest.raises(ConversionError, match=re.escape(reason)):
        convert(docs / name)

    assert [p.name for p in docs.iterdir()] == [name]


# In-process checks of the pieces: the engine loads once for all of them.


@pytest.mark.parametrize(
    ("format_name", "suffix"),
    [("GIF", ".gif"), ("WEBP", ".webp"), ("TIFF", ".tiff"), ("BMP", ".bmp")],
)
def test_every_image_format_is_recognised_and_read(
    tmp_path: Path, format_name: str, suffix: str
) -> None:
    buffer = io.BytesIO()
    image = text_image(("Format check 42",), width=700)
    if format_name == "GIF":  # two frames: the first is read
        second = text_image(("Other frame",), width=700)
        image.save(buffer, format="GIF", save_all=True, append_images=[second])
    else:
        image.save(buffer, format=format_name)
    buffer.seek(0)
    assert worker.describe_content(buffer) == "image"
    assert worker.pick_converter(suffix, "image") == "image"

    output = tmp_path / "out.md"
    result = worker.convert(Path(f"document{suffix}"), output, buffer)

    assert result["status"] == "ok", result
    markdown = output.read_text(encoding="utf-8")
    assert f"pixels ({format_name}" in markdown
    assert "Format check 42" in markdown
    if format_name == "GIF":
        assert "first of 2 frames" in markdown and "Other frame" not in markdown


def test_text_starting_with_bm_is_not_a_bitmap() -> None:
    assert ocr.image_format(b"BMW quarterly figures\n") is None
    assert worker.describe_content(io.BytesIO(b"BMW quarterly figures\n")) == "text"


def test_a_page_past_its_cpu_time_limit_stops_and_the_engine_still_reads() -> None:
    ocr.recognize(text_image(("warm up",), width=300))  # the engine loads outside the limit

    with pytest.raises(ocr.PageTimeLimit):  # even when RapidOCR wraps it in its own error
        ocr.recognize(text_image(SCREENSHOT_LINES * 4), seconds=0.001)

    assert ocr.recognize(text_image(("Still reading",), width=500)).text == "Still reading"


def test_a_long_scrolling_screenshot_is_read_in_pieces_without_repeats() -> None:
    lines = [f"Row {n} of the long page says item {n * 7}" for n in range(1, 38)]
    image = text_image(lines, width=600, size=24)  # three pieces, two cuts
    assert image.height > ocr.TALL_RATIO * image.width  # one piece would shrink the text

    page = ocr.recognize(image)

    assert len(page.lines) == len(lines)  # no line lost at a cut, none read twice
    assert_reads(tuple(lines), page.text, "long screenshot")


def test_a_large_image_is_scaled_to_the_ocr_limit_before_reading() -> None:
    image = Image.new("RGB", (6000, 4000), "white")  # 24 megapixels

    scaled = ocr.bounded(image)

    assert scaled.width * scaled.height <= ocr.MAX_OCR_PIXELS
    assert abs(scaled.width / scaled.height - 1.5) < 0.01
    assert ocr.bounded(Image.new("RGB", (800, 600))).size == (800, 600)  # never scaled up


def test_scanned_pages_past_the_conversion_budget_are_marked_not_read(docs: Path) -> None:
    data = make_scanned_pdf(docs / "scan.pdf").read_bytes()
    budget = pdf_pages.OcrBudget(wall_seconds=0.001)

    markdown, report = pdf_pages.pdf_markdown(data, budget)

    assert markdown == ""  # no page gave text: the worker reports "no text"
    assert report.pages == 2 and report.ocr_pages == 0


def test_a_mixed_pdf_past_the_budget_keeps_its_text_pages(docs: Path) -> None:
    data = make_mixed_pdf(docs / "mixed.pdf").read_bytes()

    markdown, report = pdf_pages.pdf_markdown(data, pdf_pages.OcrBudget(wall_seconds=0.001))

    pages = pages_of(markdown)
    assert pages[1][0] == pages[3][0] == "text layer"
    assert pages[2] == ("not read: the time this conversion may spend on OCR ran out", "")
    assert report.text_pages == 2


def _pdf_with_image(width: int, height: int) -> bytes:
    """One page drawing one image whose dictionary claims `width` x `height` pixels."""
    import zlib

    pixels = zlib.compress(b"\xff" * 16)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /XObject << /Im1 5 0 R >> >> >>",
        b"<< /Length 31 >>\nstream\nq 612 0 0 792 0 0 cm /Im1 Do Q\nendstream",
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
        b"/BitsPerComponent 8 /Filter /FlateDecode /Length %d >>\nstream\n"
        % (width, height, len(pixels))
        + pixels
        + b"\nendstream",
    ]
    return pdf_from_objects(objects)


def test_a_scanned_page_with_a_giant_image_is_not_rendered() -> None:
    markdown, report = pdf_pages.pdf_markdown(_pdf_with_image(50_000, 50_000))

    assert markdown == ""
    assert report.ocr_pages == 0


def test_a_giant_image_among_text_pages_is_named_in_its_marker(docs: Path) -> None:
    from pypdf import PdfReader
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.append(PdfReader(make_pdf(docs / "text.pdf", lines=("Plain text page",))))
    writer.append(PdfReader(io.BytesIO(_pdf_with_image(50_000, 50_000))))
    buffer = io.BytesIO()
    writer.write(buffer)

    markdown, _ = pdf_pages.pdf_markdown(buffer.getvalue())

    pages = pages_of(markdown)
    assert pages[1] == ("text layer", "Plain text page")
    assert pages[2] == (
        "not read: it holds an image of 50000 x 50000 pixels, above the limit of "
        f"{ocr.MAX_DECODE_PIXELS:,} pixels",
        "",
    )


def test_reading_an_images_header_leaves_pillows_own_limit_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """OCR lifts Pillow's bomb limit only while it reads a header (it checks the size
    itself, and names it): the rest of the process keeps its own limit."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 123_456_789)
    bomb = make_png_bomb(tmp_path / "bomb.png")
    with bomb.open("rb") as stream:
        image = ocr.open_header(stream)
    assert image.size == (50_000, 50_000)  # read past Pillow's limit, to name the size
    assert Image.MAX_IMAGE_PIXELS == 123_456_789
