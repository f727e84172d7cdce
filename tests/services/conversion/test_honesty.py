"""A conversion gives a document's text or fails: never raw bytes, never a host path, never
more Markdown than the cap (SPEC D17; the limits of conversion output)."""

from __future__ import annotations

import io
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from deerflow_web.errors import ConversionError
from deerflow_web.services.conversion.runner import convert_to_markdown
from tests.support.documents import make_docx
from tests.support.documents import make_pdf

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    return folder


def _convert(source: Path, **options: object) -> Path:
    destination = source.with_suffix(".md")
    convert_to_markdown(source, destination, timeout_seconds=120, memory_limit_mb=2048, **options)
    return destination


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, body in entries.items():
            archive.writestr(name, body)
    return buffer.getvalue()


def _html(_: Path) -> bytes:
    return b"<!DOCTYPE html><html><body><h1>Quarterly Report</h1></body></html>"


def _real_xlsx_bytes(path: Path) -> bytes:
    from tests.support.documents import make_xlsx

    return make_xlsx(path.with_name("real.xlsx")).read_bytes()


MISLABELLED: tuple[tuple[str, Callable[[Path], bytes], str], ...] = (
    ("broken.pdf", lambda _: b"%PDF-1.4 garbage", "broken.pdf is "),
    ("text.pdf", lambda _: b"Quarterly revenue grew\n" * 20, "its content is plain text"),
    ("notes.docx", lambda _: b"# Quarterly Report\nRevenue grew.\n", "its content is plain text"),
    ("page.docx", _html, "its content is HTML text"),
    ("archive.docx", lambda _: _zip({"notes.txt": b"hello"}), "its content is a plain ZIP"),
    ("sheet.xlsx", lambda _: b"Region,Revenue\nNorth,1200\n", "its content is plain text"),
    ("deck.pptx", _html, "its content is HTML text"),
    ("data.xls", lambda _: b"Region,Revenue\nNorth,1200\nSouth,950\n", "plain text"),
    ("modern.xls", _real_xlsx_bytes, "an Excel (.xlsx) workbook"),
    ("letter.docx", lambda p: make_pdf(p.with_name("real.pdf")).read_bytes(), "a PDF document"),
)


@pytest.mark.parametrize(
    ("name", "make", "reason"), MISLABELLED, ids=[case[0] for case in MISLABELLED]
)
def test_a_name_that_lies_about_the_format_fails_and_leaves_no_markdown(
    docs: Path, name: str, make: Callable[[Path], bytes], reason: str
) -> None:
    source = docs / name
    body = make(source)
    for helper in docs.iterdir():
        helper.unlink()  # only the file under test stays
    source.write_bytes(body)

    with pytest.raises(ConversionError) as caught:
        _convert(source)

    message = str(caught.value)
    assert message.startswith(name)
    assert reason in message
    assert "not a valid" in message or "corrupt" in message or "No text" in message
    assert [p.name for p in docs.iterdir()] == [name]  # no .md, no staging file
    assert source.read_bytes() == body


def test_real_documents_still_convert_through_the_forced_converter(docs: Path) -> None:
    from tests.support.documents import make_pptx
    from tests.support.documents import make_xlsx

    assert "# Quarterly Report" in _convert(make_docx(docs / "r.docx")).read_text()
    assert "North" in _convert(make_xlsx(docs / "s.xlsx")).read_text()
    assert "Quarterly Review" in _convert(make_pptx(docs / "d.pptx")).read_text()
    assert "Hello PDF world" in _convert(make_pdf(docs / "p.pdf")).read_text()


def test_markdown_over_the_cap_fails_with_sizes_and_saves_nothing(docs: Path) -> None:
    source = make_docx(docs / "long.docx", filler_paragraphs=40)

    with pytest.raises(ConversionError) as caught:
        _convert(source, max_output_bytes=2000)

    message = str(caught.value)
    assert message.startswith("The Markdown of long.docx would be ")
    assert "above the limit of 0.0 MB (2000 bytes, conversion.max_output_bytes)" in message
    assert [p.name for p in docs.iterdir()] == ["long.docx"]


def test_markdown_under_the_cap_is_saved(docs: Path) -> None:
    markdown = _convert(make_docx(docs / "short.docx"), max_output_bytes=10_000)
    assert markdown.stat().st_size <= 10_000


def test_a_worker_that_ignores_the_cap_is_still_refused(docs: Path) -> None:
    source = make_docx(docs / "r.docx")
    liar = [
        sys.executable,
        "-c",
        "import sys, json\n"
        "open(sys.argv[2], 'w').write('x' * 5000)\n"
        "open(sys.argv[3], 'w').write(json.dumps({'status': 'ok'}))\n",
    ]

    with pytest.raises(ConversionError, match="above the limit"):
        _convert(source, max_output_bytes=1000, worker_command=liar)

    assert [p.name for p in docs.iterdir()] == ["r.docx"]


def test_the_worker_sees_no_host_path(tmp_path: Path) -> None:
    """The worker gets a neutral name and the bytes on stdin: nothing it writes can hold the
    folder the document lives in (markitdown's zip converter writes the path it is given)."""
    folder = tmp_path / "host-secret-folder"
    folder.mkdir()
    source = make_docx(folder / "report.docx")
    reporter = [
        sys.executable,
        "-c",
        "import json, os, sys\n"
        "data = sys.stdin.buffer.read()\n"
        "seen = {'argv': sys.argv, 'cwd': os.getcwd(), 'size': len(data),\n"
        "        'env': dict(os.environ)}\n"
        "open(sys.argv[2], 'w').write(json.dumps(seen))\n"
        "open(sys.argv[3], 'w').write(json.dumps({'status': 'ok'}))\n",
    ]

    text = _convert(source, worker_command=reporter).read_text(encoding="utf-8")

    assert "host-secret-folder" not in text
    assert "document.docx" in text
    assert f'"size": {source.stat().st_size}' in text


def test_real_companions_hold_no_host_path(tmp_path: Path) -> None:
    folder = tmp_path / "host-secret-folder"
    folder.mkdir()
    for source in (make_docx(folder / "r.docx"), make_pdf(folder / "p.pdf")):
        assert "host-secret-folder" not in _convert(source).read_text(encoding="utf-8")
    plain_zip = folder / "bundle.docx"
    plain_zip.write_bytes(_zip({"inner.txt": b"inside"}))
    with pytest.raises(ConversionError, match="plain ZIP"):
        _convert(plain_zip)
    assert not (folder / "bundle.md").exists()
