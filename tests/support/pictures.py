"""Real pictures for the vision tests: JPEGs with EXIF (orientation, GPS), PNGs with text
chunks and ICC profiles, and a PNG whose header claims more pixels than it holds."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image
from PIL import ImageCms
from PIL.PngImagePlugin import PngInfo

ORIENTATION = 0x0112
GPS_IFD = 0x8825
SOFTWARE = 0x0131
RED = (220, 20, 20)
BLUE = (20, 20, 220)


def two_colour(width: int, height: int) -> Image.Image:
    """Left half red, right half blue: shows which way a picture was turned."""
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(Image.new("RGB", (width // 2, height), RED), (0, 0))
    return image


def srgb_profile() -> bytes:
    """An ICC profile, as cameras and editors embed them."""
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def jpeg_with_exif(
    width: int = 400, height: int = 200, *, orientation: int = 6, gps: bool = True
) -> bytes:
    """A JPEG that must be turned (Orientation tag) and that says where it was taken."""
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    exif[SOFTWARE] = "CameraFirmware 1.0"
    if gps:
        exif[GPS_IFD] = {1: "N", 2: (52.0, 31.0, 12.0), 3: "E", 4: (13.0, 24.0, 36.0)}
    out = io.BytesIO()
    two_colour(width, height).save(
        out, format="JPEG", exif=exif.tobytes(), icc_profile=srgb_profile(), quality=95
    )
    return out.getvalue()


def png_bytes(
    width: int = 64, height: int = 32, *, mode: str = "RGB", text: str | None = None
) -> bytes:
    """A PNG, optionally with a text chunk (metadata that must not reach the model)."""
    image = two_colour(width, height)
    if mode != "RGB":
        image = image.convert(mode)
    info = None
    if text is not None:
        info = PngInfo()
        info.add_text("Comment", text)
    out = io.BytesIO()
    image.save(out, format="PNG", pnginfo=info, icc_profile=srgb_profile())
    return out.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A tiny, valid-looking PNG whose header claims `width`×`height` pixels: decoding it
    would allocate gigabytes (a decompression bomb)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    data = zlib.compress(b"\x00" * 1024)
    chunks = _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


SVG = (
    b'<?xml version="1.0"?>\n'
    b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
)
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
