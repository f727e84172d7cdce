"""Real documents, generated on the fly, for the conversion tests and the benchmark.

Each maker writes one file with the library a user's office suite would produce it with
(python-docx, openpyxl, python-pptx, fpdf2, pypdf) and returns its path. The `filler_*`
arguments add seeded pseudo-random text, which compresses about as badly as prose, to reach a
target file size.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from pathlib import Path

from docx import Document
from fpdf import FPDF
from openpyxl import Workbook
from pptx import Presentation
from pypdf import PdfReader
from pypdf import PdfWriter

TABLE = (("Region", "Revenue"), ("North", "1200"), ("South", "950"))
SLIDES = (
    ("Quarterly Review", "Revenue grew in every region"),
    ("Next Steps", "Open two new offices"),
)
OLE_MAGIC = bytes.fromhex("D0CF11E0A1B11AE1")  # what a real Word 97-2003 .doc starts with


def filler_text(words: int, seed: int = 0) -> str:
    """Seeded nonsense prose: reproducible, and about as compressible as real text."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join(
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(words)
    )


def make_docx(
    path: Path,
    *,
    title: str = "Quarterly Report",
    paragraphs: Sequence[str] = ("Revenue grew in every region.",),
    table: Sequence[Sequence[str]] = TABLE,
    filler_paragraphs: int = 0,
) -> Path:
    """A Word file: a level-1 title, a level-2 section, paragraphs and one table."""
    document = Document()
    document.add_heading(title, level=1)
    document.add_heading("Summary", level=2)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for row, values in zip(grid.rows, table, strict=True):
            for cell, value in zip(row.cells, values, strict=True):
                cell.text = value
    for number in range(filler_paragraphs):
        document.add_paragraph(filler_text(120, seed=number))
    document.save(str(path))
    return path


def make_blank_docx(path: Path) -> Path:
    """A valid Word file with no text at all."""
    Document().save(str(path))
    return path


def make_xlsx(
    path: Path,
    *,
    sheet: str = "Sales",
    rows: Sequence[Sequence[str]] = TABLE,
    filler_rows: int = 0,
) -> Path:
    """An Excel workbook with one named sheet holding a table."""
    workbook = Workbook()
    worksheet = workbook.active
    worksheet.title = sheet
    for row in rows:
        worksheet.append(list(row))
    rng = random.Random(0)
    for number in range(filler_rows):
        worksheet.append([f"row{number}", rng.randint(0, 10**6), filler_text(6, seed=number)])
    workbook.save(str(path))
    return path


def make_pptx(
    path: Path,
    *,
    slides: Sequence[tuple[str, str]] = SLIDES,
    filler_slides: int = 0,
) -> Path:
    """A PowerPoint deck whose slides have a title and a body text."""
    presentation = Presentation()
    layout = presentation.slide_layouts[1]  # "Title and Content"
    numbered = [(f"Slide {n}", filler_text(150, seed=n)) for n in range(filler_slides)]
    for title, body in [*slides, *numbered]:
        slide = presentation.slides.add_slide(layout)
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    presentation.save(str(path))
    return path


def make_pdf(
    path: Path,
    *,
    lines: Sequence[str] = ("Hello PDF world", "Revenue grew in every region."),
    filler_pages: int = 0,
) -> Path:
    """A text PDF (fpdf2's built-in font, so Latin-1 text only)."""
    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    pdf.add_page()
    for line in lines:
        pdf.cell(text=line, new_x="LMARGIN", new_y="NEXT")
    for number in range(filler_pages):
        pdf.add_page()
        pdf.multi_cell(0, 5, text=filler_text(450, seed=number))
    pdf.output(str(path))
    return path


def make_spinning_pdf(path: Path, *, operations: int = 2_000_000) -> Path:
    """A tiny valid PDF whose one page draws nothing `operations` times (`q Q`, compressed):
    a few kilobytes that keep a PDF parser busy for about 50 us of CPU per operation, as a
    hostile document would. Its text is empty, so a conversion that finishes fails."""
    content = zlib.compress(b"q Q " * operations, 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content)
        + content
        + b"\nendstream",
    ]
    path.write_bytes(pdf_from_objects(objects))
    return path


def make_encrypted_pdf(path: Path, *, password: str = "secret") -> Path:
    """A PDF that opens only with a user password."""
    plain = make_pdf(path.with_name(f"plain-{path.name}"))
    writer = PdfWriter()
    writer.append(PdfReader(plain))
    writer.encrypt(user_password=password, owner_password=f"{password}-owner")
    with path.open("wb") as handle:
        writer.write(handle)
    plain.unlink()
    return path


def make_corrupt_pdf(path: Path) -> Path:
    """A file that starts like a PDF and then breaks off."""
    path.write_bytes(b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R\n" + _noise(256))
    return path


def make_empty_file(path: Path) -> Path:
    """A 0-byte file (an upload that arrived empty)."""
    path.write_bytes(b"")
    return path


def make_random_bytes(path: Path, *, size: int = 4096) -> Path:
    """Bytes of no format at all, for a file renamed to look like a document."""
    path.write_bytes(_noise(size))
    return path


def make_fake_legacy_doc(path: Path) -> Path:
    """A Word 97-2003 look-alike: the Compound File signature, then noise."""
    path.write_bytes(OLE_MAGIC + _noise(4088))
    return path


def _noise(size: int) -> bytes:
    return random.Random(size).randbytes(size)  # seeded: a failing test fails the same way again


def pdf_from_objects(objects: list[bytes]) -> bytes:
    """A PDF file of these numbered objects (the first one the catalog) with its
    cross-reference table, laid out as a writer would."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)
