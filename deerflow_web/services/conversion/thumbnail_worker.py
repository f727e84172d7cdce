"""Make one image thumbnail in a bounded child process: the image on stdin, WebP on stdout.

An uploaded image is untrusted input to an image decoder, so it is decoded here, in a
process with an address-space and CPU limit (`worker.apply_limits`), never in a request
thread. Only raster formats a browser shows anyway are opened (`FORMATS`): never SVG (a
document with scripts and external references, not a picture), and Pillow is told not to
try any other decoder. The pixel count is read from the header and checked before a single
pixel is decoded (`MAX_PIXELS`), so a decompression bomb costs nothing.

Exit 0 with the thumbnail written; 2 when the image is refused (format, size, damage).
"""

from __future__ import annotations

import io
import sys

from deerflow_web.services.conversion.pixel_limits import pillow_pixel_limit
from deerflow_web.services.conversion.worker import apply_limits

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
MAX_PIXELS = 50_000_000
MAX_INPUT_BYTES = 64 * 1024 * 1024
THUMBNAIL_SIZE = 320
MEMORY_LIMIT_MB = 768
TIME_LIMIT_SECONDS = 20
EXIT_REFUSED = 2


def make_thumbnail(data: bytes, size: int = THUMBNAIL_SIZE) -> bytes:
    """A WebP no larger than `size` on either side.

    Raises:
        ValueError: Not an image of an allowed format, too many pixels, or damaged.
    """
    from PIL import Image
    from PIL import ImageOps

    try:
        with pillow_pixel_limit(MAX_PIXELS):  # Pillow's own bomb check, as a second line
            opened = Image.open(io.BytesIO(data), formats=FORMATS)
        with opened as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise ValueError(f"{width}x{height} is more pixels than a thumbnail is made of")
            image.draft("RGB", (size, size))  # JPEG: decode at a reduced scale
            picture = ImageOps.exif_transpose(image)
            picture.thumbnail((size, size))
            if picture.mode not in ("RGB", "RGBA"):
                picture = picture.convert("RGBA" if "transparency" in picture.info else "RGB")
            out = io.BytesIO()
            picture.save(out, "WEBP", quality=80, method=4)
            return out.getvalue()
    except (OSError, SyntaxError, Image.DecompressionBombError) as error:
        raise ValueError(str(error)) from error


def main() -> int:
    apply_limits(MEMORY_LIMIT_MB, TIME_LIMIT_SECONDS)
    data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        return EXIT_REFUSED
    try:
        thumbnail = make_thumbnail(data)
    except ValueError as error:
        print(error, file=sys.stderr)
        return EXIT_REFUSED
    sys.stdout.buffer.write(thumbnail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
