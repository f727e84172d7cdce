"""Text in images, read offline: screenshots, photos, scanned PDF pages and fax pages (OCR).

Runs inside the conversion worker only (`worker.py`), under its address-space and CPU
limits; nothing here is imported by the web app. The engine is RapidOCR's PP-OCRv4
detection and recognition models, which ship inside the `rapidocr-onnxruntime` wheel
(English and Simplified Chinese in one model), so reading works on a machine that has never
been online and nothing is downloaded at run time.

Two bounds keep one image from costing more than a page should:

- Pixels. An image's size is read from its header before a single pixel is decoded, and
  one above `MAX_DECODE_PIXELS` is refused (a 50,000 x 50,000 PNG is a few hundred
  kilobytes on disk and 2.5 GB once decoded). What is decoded is scaled down to
  `MAX_OCR_PIXELS` before the engine gets it (which scales it on to `DETECTION_SIDE`
  pixels on its longer side); JPEGs are decoded at a reduced scale straight
  away (Pillow's `draft`), so a 50-megapixel photo never exists at full size in memory.
- Time. Each page's recognition has its own CPU-time limit (`PageTimeLimit`, from a
  timer signal), and the caller stops starting pages once the
  conversion's own budget is nearly spent, so a long scan ends with the pages read so far
  and a note for the rest instead of a killed worker and nothing.

The text-direction classifier is off: on upright test lines it flipped one by 180 degrees
and garbled it, and uploads are overwhelmingly upright.
"""

from __future__ import annotations

import math
import signal
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import BinaryIO

from deerflow_web.services.conversion.pixel_limits import pillow_pixel_limit

MAX_DECODE_PIXELS = 100_000_000  # refused before decoding: 10,000 x 10,000
MAX_OCR_PIXELS = 12_000_000  # what the engine is given at most: a 300 dpi A4 page
PAGE_SECONDS = 30.0  # CPU seconds one page's recognition may use
TALL_RATIO = 2.5  # an image taller than this times its width is read in pieces
# The models see the image scaled so its longer side is at most this: an A4 page at 137 dpi.
# Memory and time grow with its square (1280: 1.7 CPU-s, 520 MB; 2000: 4.4 s, 880 MB).
DETECTION_SIDE = 1600

# Formats read through OCR, by the first bytes of the file.
_IMAGE_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)

_BMP_HEADER_SIZES = frozenset({12, 40, 52, 56, 64, 108, 124})

_engine: Any = None


class ImageTooLarge(Exception):
    """The image has more pixels than may be decoded."""

    def __init__(self, width: int, height: int) -> None:
        super().__init__(f"{width} x {height}")
        self.width = width
        self.height = height


class OcrUnavailable(Exception):
    """The OCR engine could not be loaded (a missing system library, for one)."""


class PageTimeLimit(Exception):
    """One page's recognition used more than its CPU time (`PAGE_SECONDS`)."""


def image_format(head: bytes) -> str | None:
    """The image format the bytes start with (PNG, JPEG, GIF, TIFF, BMP, WEBP), else None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    # "BM" alone starts plenty of text; a bitmap's info header has one of these sizes.
    if head[:2] == b"BM" and int.from_bytes(head[14:18], "little") in _BMP_HEADER_SIZES:
        return "BMP"
    for signature, name in _IMAGE_SIGNATURES:
        if head.startswith(signature):
            return name
    return None


@dataclass(frozen=True)
class OcrLine:
    """One line of recognised text and the engine's confidence in it (0 to 1)."""

    text: str
    confidence: float


@dataclass
class OcrPage:
    """The text recognised on one image or page, in reading order."""

    lines: list[OcrLine] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the whole worker process (the engine's threads included)

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)

    @property
    def mean_confidence(self) -> float | None:
        """Mean confidence weighted by characters, so a stray one-letter box counts little."""
        weights = [len(line.text) for line in self.lines]
        if not sum(weights):
            return None
        pairs = zip(self.lines, weights, strict=True)
        total = sum(line.confidence * weight for line, weight in pairs)
        return total / sum(weights)


def describe(page: OcrPage) -> str:
    """How a page was read, for its marker: `OCR, mean confidence 0.97`."""
    confidence = page.mean_confidence
    if confidence is None:
        return "OCR found no text"
    return f"OCR, mean confidence {confidence:.2f}"


def _load_engine() -> Any:
    """The engine, loaded once per worker (about a second: two ONNX models)."""
    global _engine
    if _engine is None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as error:  # e.g. OpenCV without libGL on a bare system
            raise OcrUnavailable(str(error)) from error
        _engine = RapidOCR(
            use_cls=False,
            det_limit_type="max",
            max_side_len=DETECTION_SIDE,  # with "max", the detector picks 960, 1500 or 2000
            print_verbose=False,
        )
    return _engine


def open_header(stream: BinaryIO) -> Any:
    """The image with only its header read: size, format and frames, no pixel decoded.

    Raises:
        OSError: Pillow cannot read it (damaged, or a format it does not know).
    """
    from PIL import Image

    # Pillow's own check would refuse in `open` without the size; ours, after it, says it.
    with pillow_pixel_limit(None):
        return Image.open(stream)


# NewSubfileType bits of a TIFF directory that mark it as no page of its own: a
# reduced-resolution copy of another (a scanner's preview) or a transparency mask.
_NEW_SUBFILE_TYPE = 254
_NOT_A_PAGE = 0b101


def tiff_pages(image: Any) -> list[int]:
    """The frames of a TIFF opened with `open_header` that are pages, in order (headers
    only). A directory marked as a reduced-resolution copy or a mask is left out, so a
    scan stored with its preview is not read twice; the first frame always counts."""
    pages = []
    for index in range(int(image.n_frames)):
        image.seek(index)
        kind = image.tag_v2.get(_NEW_SUBFILE_TYPE, 0)
        if index == 0 or not (isinstance(kind, int) and kind & _NOT_A_PAGE):
            pages.append(index)
    image.seek(0)
    return pages


def page_count(stream: BinaryIO) -> int:
    """How many pages an image holds that are read one by one: those of a multi-page
    TIFF (a fax, a scanner's document). Every other image, an animated GIF included,
    counts as one, its first frame. The stream is left at its start."""
    try:
        image = open_header(stream)
        return len(tiff_pages(image)) if image.format == "TIFF" else 1
    except Exception:  # damaged (or a warning made an error): the one-image path says why
        return 1
    finally:
        stream.seek(0)


def decode_frame(image: Any, index: int) -> Any:
    """Frame `index` of an image opened with `open_header`, bounded in pixels, as RGB.

    Raises:
        ImageTooLarge: The frame's header announces more than `MAX_DECODE_PIXELS` pixels.
        OSError: The frame cannot be decoded.
    """
    image.seek(index)
    width, height = image.size
    if width * height > MAX_DECODE_PIXELS:
        raise ImageTooLarge(width, height)
    return bounded(_flatten(image))


def open_image(stream: BinaryIO) -> tuple[Any, dict[str, Any]]:
    """Decode the first frame of an image, bounded in pixels, as RGB for the engine.

    Returns the image and facts for its marker: `width`, `height` (as stored), `format`
    and `frames`.

    Raises:
        ImageTooLarge: The header announces more than `MAX_DECODE_PIXELS` pixels.
        OSError: Pillow cannot read it (damaged, or a format it does not know).
    """
    image = open_header(stream)
    width, height = image.size
    if width * height > MAX_DECODE_PIXELS:
        raise ImageTooLarge(width, height)
    facts = {
        "width": width,
        "height": height,
        "format": image.format or "image",
        "frames": getattr(image, "n_frames", 1),
    }
    if width * height > MAX_OCR_PIXELS and image.format == "JPEG":
        scale = math.sqrt(MAX_OCR_PIXELS / (width * height))
        image.draft("RGB", (max(1, int(width * scale)), max(1, int(height * scale))))
    image.seek(0)  # the first frame of a GIF (a multi-page TIFF is read by image_pages)
    image = _flatten(image)
    return bounded(image), facts


def _flatten(image: Any) -> Any:
    """RGB on white: transparent pixels of a screenshot are background, not black."""
    from PIL import Image

    if image.mode in {"RGBA", "LA", "P", "PA"}:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def bounded(image: Any) -> Any:
    """The image scaled down to at most `MAX_OCR_PIXELS` pixels (never scaled up)."""
    from PIL import Image

    width, height = image.size
    if width * height <= MAX_OCR_PIXELS:
        return image
    scale = math.sqrt(MAX_OCR_PIXELS / (width * height))
    size = (max(1, int(width * scale)), max(1, int(height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


class _Timer:
    """A CPU-time limit for this process: SIGPROF once `seconds` of CPU (every thread of
    the engine counted) are used. CPU time, not wall clock, so a busy machine does not
    cut off a page that merely waited for a core; the worker's wall-clock limit still
    bounds the waiting. RapidOCR wraps whatever a model run raises in its own error, so
    `fired` tells afterwards whether the limit was the cause."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False

    def _expired(self, signum: int, frame: object) -> None:
        self.fired = True
        raise PageTimeLimit

    @contextmanager
    def running(self) -> Iterator[None]:
        if self.seconds <= 0:
            yield
            return
        previous = signal.signal(signal.SIGPROF, self._expired)
        signal.setitimer(signal.ITIMER_PROF, self.seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)


def recognize(image: Any, seconds: float = PAGE_SECONDS) -> OcrPage:
    """Read the text of one RGB image, line by line, within `seconds` of CPU time.

    Raises:
        PageTimeLimit: The recognition used more than `seconds` of CPU time.
        OcrUnavailable: The engine cannot be loaded.
    """
    import time

    engine = _load_engine()
    started = time.monotonic()
    cpu = time.process_time()
    image = bounded(image)
    boxes: list[Any] = []
    timer = _Timer(seconds)
    try:
        with timer.running():
            for top, own_from, own_to, tile in _tiles(image):
                for points, text, score in engine(tile, use_cls=False)[0] or []:
                    centre = sum(float(point[1]) for point in points) / len(points) + top
                    if own_from <= centre < own_to:  # a line in an overlap is read once
                        moved = [(float(x), float(y) + top) for x, y in points]
                        boxes.append((moved, text, score))
    except Exception as error:
        if timer.fired:
            raise PageTimeLimit from error
        raise
    page = OcrPage(lines=_reading_order(boxes))
    page.seconds = time.monotonic() - started
    page.cpu_seconds = time.process_time() - cpu
    return page


def _tiles(image: Any) -> list[tuple[int, float, float, Any]]:
    """The image in pieces the engine reads at a useful scale: `(top, own_from, own_to,
    piece)`, the piece owning the lines centred in [own_from, own_to).

    The engine scales a whole image to `DETECTION_SIDE` on its longer side, which would
    shrink the text of a long scrolling screenshot (1080 x 8000) to a few pixels; so an
    image taller than `TALL_RATIO` times its width is cut into overlapping pieces about as
    tall as they are wide, each read on its own, the overlap large enough to hold any line.
    """
    width, height = image.size
    if height <= TALL_RATIO * width:
        return [(0, float("-inf"), float("inf"), image)]
    step = int(width * 1.2)
    overlap = max(int(width * 0.2), 1)
    pieces = []
    top = 0
    while True:
        bottom = min(top + step + overlap, height)
        own_from = float("-inf") if top == 0 else top + overlap / 2
        own_to = float("inf") if bottom == height else bottom - overlap / 2
        pieces.append((top, own_from, own_to, image.crop((0, top, width, bottom))))
        if bottom == height:
            return pieces
        top += step


def _reading_order(boxes: list[Any]) -> list[OcrLine]:
    """Join the engine's boxes into lines: boxes whose vertical centres are within half a
    line height of each other are one line, read left to right."""
    items = []
    for points, text, score in boxes:
        text = " ".join(str(text).split())
        if not text:
            continue
        ys = [float(point[1]) for point in points]
        xs = [float(point[0]) for point in points]
        items.append((min(ys), max(ys), min(xs), text, float(score)))
    if not items:
        return []
    typical = statistics.median(bottom - top for top, bottom, _, _, _ in items) or 1.0
    items.sort(key=lambda item: (item[0] + item[1]) / 2)
    rows: list[list[tuple[float, float, float, str, float]]] = []
    for item in items:
        centre = (item[0] + item[1]) / 2
        if rows:
            row = rows[-1]
            row_centre = statistics.fmean((top + bottom) / 2 for top, bottom, *_ in row)
            if abs(centre - row_centre) <= typical / 2:
                row.append(item)
                continue
        rows.append([item])
    lines = []
    for row in rows:
        row.sort(key=lambda item: item[2])
        text = " ".join(item[3] for item in row)
        weights = [len(item[3]) for item in row]
        confidence = sum(item[4] * w for item, w in zip(row, weights, strict=True)) / sum(weights)
        lines.append(OcrLine(text=text, confidence=confidence))
    return lines


def image_markdown(stream: BinaryIO, seconds: float = PAGE_SECONDS) -> tuple[str, OcrPage]:
    """An image as Markdown: one line with its size in pixels and how it was read, then
    the recognised text (or a note that none was found).

    Raises:
        ImageTooLarge, OSError: See `open_image`.
        PageTimeLimit, OcrUnavailable: See `recognize`.
    """
    from deerflow_web.services.conversion.page_marks import escape_text

    image, facts = open_image(stream)
    page = recognize(image, seconds)
    frames = f", first of {facts['frames']} frames" if facts["frames"] > 1 else ""
    header = (
        f"<!-- image: {facts['width']} x {facts['height']} pixels ({facts['format']}{frames}); "
        f"{describe(page)} -->"
    )
    body = escape_text(page.text) if page.lines else "[No text was found in this image.]"
    return f"{header}\n{body}\n", page
