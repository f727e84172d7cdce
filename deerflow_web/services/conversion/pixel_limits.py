"""Pillow's decompression-bomb limit, set for the opening of one image and put back after.

`PIL.Image.MAX_IMAGE_PIXELS` is one setting for the whole process, read when an image is
opened. The OCR and thumbnail workers each want their own (OCR none, since it checks its
own limit and names the size in its answer; thumbnails a tighter one), while the agent's
image reading (services/prompt/images.py) relies on Pillow's default. Set for good, a
worker's choice leaked into whatever else ran in the same process after it: the tests run
the workers' functions in-process, and an image test passed or failed by the order of the
test modules. The workers run one image at a time, so the setting is theirs while it lasts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def pillow_pixel_limit(limit: int | None) -> Iterator[None]:
    """Pillow refuses (and warns about) images above `limit` pixels inside the block; None:
    no limit of Pillow's own, the caller checks the size itself."""
    from PIL import Image

    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = limit
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous
