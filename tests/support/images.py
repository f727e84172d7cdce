"""Images of text, generated on the fly, for the OCR tests and the benchmark.

A screenshot (clean PNG), a photo of a printed page (grey paper, tilted, noisy, blurred
JPEG), a scanned PDF (pages that are images only, no text layer), a PDF that mixes text
pages with a scanned one, a multi-page fax TIFF, and a decompression bomb. The text is
drawn with Noto Sans CJK (Debian's `fonts-noto-cjk`, which `make test` installs), so
English and Chinese lines come out of one font.
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from fpdf import FPDF
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFilter
from PIL import ImageFont

FONT = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
SCREENSHOT_LINES = (
    "Invoice 2026-11 total 4,210.50 EUR",
    "上传文件的内容识别测试",
    "Payment due within 30 days",
)
PHOTO_LINES = ("Quarterly revenue grew by 12 percent", "发票号码 2026 年 11 月")
FAX_PAGES = (
    ("Fax cover sheet for the harbour office", "Pages in this fax 3"),
    ("Second fax page lists the delivery terms",),
    ("Third fax page signed on 30 November", "传真第三页 签字确认"),
)
SCAN_PAGES = (
    ("Scanned contract page one", "Delivery address Harbour Road 7"),
    ("Second scanned page", "合同第二页 签字确认"),
)


def text_image(
    lines: Sequence[str], *, width: int = 1400, size: int = 40, margin: int = 48
) -> Image.Image:
    """Black text on white, one line per entry, like a screenshot."""
    font = ImageFont.truetype(str(FONT), size)
    step = int(size * 1.7)
    image = Image.new("RGB", (width, margin * 2 + step * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        draw.text((margin, margin + number * step), line, font=font, fill="black")
    return image


def make_text_png(path: Path, lines: Sequence[str] = SCREENSHOT_LINES) -> Path:
    """A screenshot-like PNG (with an alpha channel, as screenshots often have)."""
    text_image(lines).convert("RGBA").save(path, format="PNG")
    return path


def make_photo_jpeg(path: Path, lines: Sequence[str] = PHOTO_LINES, *, seed: int = 1) -> Path:
    """A photo of printed text: grey paper, 3 degrees off, sensor noise, a little blur."""
    image = text_image(lines, size=44).convert("L").point(lambda value: 45 + value * 0.7)
    image = image.rotate(3, expand=True, fillcolor=205, resample=Image.Resampling.BICUBIC)
    rng = random.Random(seed)
    noise = bytes(rng.randrange(0, 50) for _ in range(image.width * image.height))
    grain = Image.frombytes("L", image.size, noise)
    image = Image.blend(image, grain, 0.18).filter(ImageFilter.GaussianBlur(0.8))
    image.save(path, format="JPEG", quality=70)
    return path


def page_image(lines: Sequence[str], *, dpi: int = 150) -> Image.Image:
    """An A4 page at `dpi` with the lines near its top, as a scanner would give it."""
    width, height = int(8.27 * dpi), int(11.69 * dpi)
    page = Image.new("RGB", (width, height), "white")
    page.paste(text_image(lines, width=width - 2 * dpi // 2, size=dpi // 4), (dpi // 2, dpi))
    return page


def make_scanned_pdf(path: Path, pages: Sequence[Sequence[str]] = SCAN_PAGES) -> Path:
    """A PDF whose pages are images only: no text layer at all."""
    images = [page_image(lines) for lines in pages]
    images[0].save(path, format="PDF", resolution=150, save_all=True, append_images=images[1:])
    return path


def make_fax_tiff(
    path: Path, pages: Sequence[Sequence[str]] = FAX_PAGES, *, dpi: int = 150
) -> Path:
    """A multi-page TIFF as a fax machine or a document scanner writes it: 1-bit pages,
    CCITT Group 4 compressed, one page per entry of `pages`."""
    images = [page_image(lines, dpi=dpi).convert("1") for lines in pages]
    images[0].save(
        path, format="TIFF", save_all=True, append_images=images[1:], compression="group4"
    )
    return path


def set_tiff_page_size(data: bytes, index: int, width: int, height: int) -> bytes:
    """The TIFF with page `index` claiming `width` x `height` pixels in its header (its
    pixels unchanged): a decompression bomb on one page, without gigabytes to write."""
    return set_tiff_tags(data, index, {256: width, 257: height})  # ImageWidth, ImageLength


def set_tiff_tags(data: bytes, index: int, values: dict[int, int]) -> bytes:
    """The TIFF with the SHORT or LONG tags of directory `index` set to `values` (each tag
    must already be there: Pillow writes NewSubfileType, 254, when given in `tiffinfo`)."""
    assert data[:4] == b"II*\x00", "little-endian TIFF only"
    out = bytearray(data)
    offset = struct.unpack_from("<I", out, 4)[0]
    for _ in range(index):
        entries = struct.unpack_from("<H", out, offset)[0]
        offset = struct.unpack_from("<I", out, offset + 2 + 12 * entries)[0]
    entries = struct.unpack_from("<H", out, offset)[0]
    for number in range(entries):
        entry = offset + 2 + 12 * number
        tag, kind = struct.unpack_from("<HH", out, entry)
        if tag in values:  # SHORT (3) or LONG (4)
            struct.pack_into("<H" if kind == 3 else "<I", out, entry + 8, values[tag])
    return bytes(out)


def make_mixed_pdf(
    path: Path,
    *,
    first: Sequence[str] = ("Typed introduction page", "Revenue grew in every region."),
    scanned: Sequence[str] = ("Scanned signature page", "Signed at Harbour Road 7"),
    last: Sequence[str] = ("Typed closing page", "Contact the finance office."),
) -> Path:
    """Three pages: text, a scanned image with no text layer, text again."""
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for lines in (first, None, last):
        pdf.add_page()
        if lines is None:
            buffer = io.BytesIO()
            page_image(scanned).save(buffer, format="PNG")
            pdf.image(buffer, x=0, y=0, w=pdf.w, h=pdf.h)
            continue
        for line in lines:
            pdf.cell(text=line, new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))
    return path


def make_png_bomb(path: Path, *, width: int = 50_000, height: int = 50_000) -> Path:
    """A valid 1-bit PNG of `width` x `height` blank pixels: a few hundred kilobytes on
    disk, gigabytes once decoded."""
    row = b"\x00" + bytes((width + 7) // 8)
    packer = zlib.compressobj(9)
    chunks = [packer.compress(row * 1000) for _ in range(height // 1000)]
    chunks.append(packer.compress(row * (height % 1000)))
    data = b"".join(chunks) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )
    return path


def character_accuracy(expected: str, found: str) -> tuple[int, int]:
    """(characters right, characters expected), ignoring whitespace: one minus the edit
    distance, so a dropped, added or wrong character each costs one."""
    want = "".join(expected.split())
    got = "".join(found.split())
    previous = list(range(len(got) + 1))
    for i, a in enumerate(want, start=1):
        current = [i]
        for j, b in enumerate(got, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return max(len(want) - previous[-1], 0), len(want)
