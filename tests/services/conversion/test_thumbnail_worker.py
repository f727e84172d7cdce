"""Thumbnails: made in a child process, only from raster formats, never from SVG, with the
pixel count checked before decoding, and cached by content."""

from __future__ import annotations

import hashlib
import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from deerflow_web.services.conversion.thumbnail_worker import make_thumbnail
from deerflow_web.services.files.thumbnails import Thumbnails
from deerflow_web.services.files.thumbnails import wants_thumbnail
from tests.browser.helpers import gradient_png

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


def png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims a huge picture (a decompression bomb's first bytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


def test_a_thumbnail_keeps_the_aspect_and_fits_the_box() -> None:
    data = make_thumbnail(gradient_png(900, 300), size=320)
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "WEBP"
        assert image.size == (320, 107)


@pytest.mark.parametrize(
    "data",
    [
        b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
        b"%PDF-1.4 not an image",
        png_header_claiming(100_000, 100_000),  # 10 gigapixels: refused before decoding
        b"\x89PNG\r\n\x1a\n broken",
    ],
)
def test_what_is_not_a_safe_raster_image_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        make_thumbnail(data)


def test_svg_and_other_names_never_ask_for_one() -> None:
    assert not wants_thumbnail("logo.svg", 100)
    assert not wants_thumbnail("photo.PNG.svg", 100)
    assert wants_thumbnail("photo.JPG", 100)
    assert not wants_thumbnail("empty.png", 0)


def test_the_worker_process_makes_it_once_per_content(tmp_path: Path) -> None:
    thumbnails = Thumbnails(tmp_path)
    png = gradient_png(64, 64)
    sha = hashlib.sha256(png).hexdigest()
    made = thumbnails.get(sha, io.BytesIO(png))
    assert made is not None and made == tmp_path / "thumbnails" / sha[:2] / f"{sha}.webp"
    first = made.stat().st_mtime_ns
    again = thumbnails.get(sha, io.BytesIO(b"not even read"))
    assert again == made and made.stat().st_mtime_ns == first  # from the cache


def test_a_refused_image_is_remembered_as_having_none(tmp_path: Path) -> None:
    thumbnails = Thumbnails(tmp_path)
    bad = b"\x89PNG\r\n\x1a\n broken"
    sha = hashlib.sha256(bad).hexdigest()
    assert thumbnails.get(sha, io.BytesIO(bad)) is None
    assert thumbnails.path_for(sha).stat().st_size == 0
    assert thumbnails.get(sha, io.BytesIO(bad)) is None


def test_a_key_that_is_not_a_hash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Thumbnails(tmp_path).path_for("../../etc/passwd")


def test_pillows_own_limit_is_put_back_after_a_thumbnail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's tighter limit lasts for its own image only: the rest of the process
    (the agent's image reading, under Pillow's default) never sees it."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 123_456_789)  # the process's own setting
    before = Image.MAX_IMAGE_PIXELS
    make_thumbnail(gradient_png(64, 48))
    with pytest.raises(ValueError):
        make_thumbnail(png_header_claiming(100_000, 100_000))
    assert Image.MAX_IMAGE_PIXELS == before
