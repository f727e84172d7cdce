"""Pictures for vision models: which uploads go to the model as images, and their bytes.

A model that accepts images gets the current message's image uploads as image content
blocks beside the upload block, and a `view_image` tool for earlier ones. The bytes it
gets are never the upload's own: every picture is decoded, turned upright by its EXIF
orientation, shrunk to `agent.image_max_edge` and encoded again, which leaves every piece
of metadata (EXIF, GPS position, ICC profile, text chunks) behind. The uploads middleware,
the tool and the chat preview page all call `encode_image`, so the preview shows the very
bytes the model would get.

An upload is untrusted: only raster formats are decoded (SVG is a document that can carry
scripts and is never rendered here), Pillow is limited to those formats (no plugin that
shells out, such as EPS), and the pixel count is read from the header and refused before
anything is decoded, so a small file that expands to gigabytes (a decompression bomb)
costs nothing. Names that reach the model go through the untrusted-text neutraliser.

The blocks are LangChain's standard (v1) image blocks, plain dicts:
`{"type": "image", "base64": ..., "mime_type": ...}`. No LangChain and no Flask here.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import math
import os
import stat
import warnings
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import BinaryIO

from PIL import Image
from PIL import ImageOps
from PIL import UnidentifiedImageError

from deerflow_web.concurrency import off_loop
from deerflow_web.errors import ImageNotUsable
from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import ImageLimits
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize

MIN_MAX_EDGE = 16
DEFAULT_LIMITS = ImageLimits()

# Pillow format name -> the extensions it goes by. Only these are ever decoded.
RASTER_FORMATS: dict[str, tuple[str, ...]] = {
    "JPEG": (".jpg", ".jpeg", ".jpe", ".jfif"),
    "PNG": (".png",),
    "GIF": (".gif",),
    "WEBP": (".webp",),
    "BMP": (".bmp",),
    "TIFF": (".tif", ".tiff"),
}
IMAGE_EXTENSIONS = frozenset(ext for exts in RASTER_FORMATS.values() for ext in exts)
SVG_EXTENSIONS = frozenset({".svg", ".svgz"})
# Sources whose pictures are usually drawn (screenshots, diagrams): kept lossless, so small
# text stays legible. Photos (JPEG, WebP, TIFF scans) are sent as JPEG.
_LOSSLESS_SOURCES = frozenset({"PNG", "GIF", "BMP"})
_JPEG_QUALITY = 85
MAX_LOSSLESS_BYTES = 3_500_000  # 4.7 MB as base64
_SNIFF_BYTES = 512
_SVG_HEAD = (b"<svg", b"<?xml", b"<!doctype svg")

SVG_REFUSED = (
    "{path} is an SVG drawing, which is not shown as a picture: SVG is a document that can "
    "carry scripts and is never rendered here. Read it as text with read_file."
)
NOT_AN_IMAGE = "{path} is not a picture in a supported format (JPEG, PNG, GIF, WebP, BMP, TIFF)."
TOO_MANY_PIXELS = (
    "{path} has {width}×{height} pixels, more than the {limit:,} that are decoded for the "
    "model; it was not opened. A smaller version of it can be uploaded instead."
)
DAMAGED = "{path} could not be decoded as a picture (the file looks damaged or truncated)."


@dataclass(frozen=True)
class EncodedImage:
    """A picture as the model gets it: the re-encoded bytes and what they came from."""

    data: bytes
    mime_type: str
    width: int
    height: int
    source_format: str
    source_width: int
    source_height: int

    @property
    def sha256(self) -> str:
        """The digest of the bytes sent, to tell whether a later encoding is the same."""
        return hashlib.sha256(self.data).hexdigest()

    @property
    def resized(self) -> bool:
        """Whether the picture was shrunk (rotation alone does not count)."""
        return max(self.width, self.height) < max(self.source_width, self.source_height)

    def base64(self) -> str:
        """The bytes as base64 text, as the content block carries them."""
        return base64.b64encode(self.data).decode("ascii")

    def content_block(self) -> dict[str, Any]:
        """LangChain's standard image block (base64 data with its MIME type)."""
        return {"type": "image", "base64": self.base64(), "mime_type": self.mime_type}

    def data_url(self) -> str:
        """The bytes as a `data:` URL, for the preview page's thumbnails."""
        return f"data:{self.mime_type};base64,{self.base64()}"

    def size_text(self) -> str:
        """`1568×1176 px, JPEG` plus where it came from when it was shrunk."""
        text = f"{self.width}×{self.height} px, {self.mime_type.removeprefix('image/').upper()}"
        if self.resized:
            text += f", resized from {self.source_width}×{self.source_height}"
        return text

    def describe(self) -> dict[str, Any]:
        """Everything about the block but its bytes, as plain data (JSON-ready)."""
        return {
            "mime_type": self.mime_type,
            "width": self.width,
            "height": self.height,
            "bytes": len(self.data),
            "sha256": self.sha256,
            "source_format": self.source_format,
            "source_width": self.source_width,
            "source_height": self.source_height,
        }


def is_image_name(name: str) -> bool:
    """Whether the name says raster picture (the bytes are checked when decoding)."""
    return Path(name).suffix.lower() in IMAGE_EXTENSIONS


def is_svg_name(name: str) -> bool:
    """Whether the name says SVG drawing."""
    return Path(name).suffix.lower() in SVG_EXTENSIONS


def _looks_like_svg(head: bytes) -> bool:
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").lower().startswith(_SVG_HEAD)


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in {"RGBA", "LA", "PA", "RGBa", "La"} or (
        image.mode == "P" and "transparency" in image.info
    )


def _open(handle: BinaryIO, shown: str, limits: ImageLimits) -> Image.Image:
    """Open (header only) a raster picture; refuse anything else or too many pixels."""
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb guard warns, then raises, far above our limit; ours wins.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(handle, formats=list(RASTER_FORMATS))
    except Image.DecompressionBombError as error:
        raise ImageNotUsable(
            f"{shown} has more pixels than can be decoded safely; it was not opened."
        ) from error
    except (UnidentifiedImageError, ValueError, OSError) as error:
        raise ImageNotUsable(NOT_AN_IMAGE.format(path=shown)) from error
    width, height = image.size
    if width * height > limits.max_pixels:
        image.close()
        raise ImageNotUsable(
            TOO_MANY_PIXELS.format(path=shown, width=width, height=height, limit=limits.max_pixels)
        )
    return image


_ORIENTATION_TAG = 0x0112
_QUARTER_TURNS = frozenset({5, 6, 7, 8})  # orientations that swap width and height


def _upright_size(image: Image.Image) -> tuple[int, int]:
    """The picture's size once turned upright, from its header."""
    width, height = image.size
    try:
        orientation = image.getexif().get(_ORIENTATION_TAG)
    except (OSError, ValueError, SyntaxError):
        orientation = None
    return (height, width) if orientation in _QUARTER_TURNS else (width, height)


def _target_size(size: tuple[int, int], max_edge: int) -> tuple[int, int]:
    """The size a picture shrinks to (aspect kept, never enlarged)."""
    width, height = size
    ratio = min(1.0, max_edge / max(width, height, 1))
    return max(1, math.ceil(width * ratio)), max(1, math.ceil(height * ratio))


def _upright(image: Image.Image, max_edge: int) -> Image.Image:
    """Decode (a JPEG at a reduced scale when it is much larger) and apply EXIF rotation."""
    if image.format == "JPEG":
        image.draft("RGB", _target_size(image.size, max_edge))  # 1/2..1/8 scale, never below
    image.load()
    rotated = ImageOps.exif_transpose(image)
    return rotated if rotated is not None else image


def _encode(image: Image.Image, lossless: bool) -> tuple[bytes, str]:
    """Encode without any metadata: a fresh image carries no EXIF, ICC or text chunks.

    A lossless encoding larger than `MAX_LOSSLESS_BYTES` (a photo saved as PNG) is sent as
    JPEG instead, transparency flattened onto white: providers cap one picture at about
    5 MB of base64.
    """
    clean = Image.new(image.mode, image.size)
    clean.paste(image)
    if lossless:
        out = io.BytesIO()
        clean.save(out, format="PNG")
        if out.tell() <= MAX_LOSSLESS_BYTES:
            return out.getvalue(), "image/png"
    if clean.mode == "RGBA":
        flat = Image.new("RGB", clean.size, (255, 255, 255))
        flat.paste(clean, mask=clean.getchannel("A"))
        clean = flat
    out = io.BytesIO()
    clean.save(out, format="JPEG", quality=_JPEG_QUALITY, optimize=True)
    return out.getvalue(), "image/jpeg"


def encode_image_bytes(
    data: bytes, limits: ImageLimits = DEFAULT_LIMITS, *, label: str = "This file"
) -> EncodedImage:
    """Prepare a picture for the model: upright, at most `max_edge`, no metadata.

    Args:
        data: The file's bytes (untrusted).
        limits: The edge and pixel limits.
        label: How messages name the file (already neutralised).

    Raises:
        ImageNotUsable: SVG, not a supported raster format, too many pixels, or damaged.
    """
    return _encode_stream(io.BytesIO(data), limits, label)


def _encode_stream(handle: BinaryIO, limits: ImageLimits, label: str) -> EncodedImage:
    """Encode from a seekable stream, read only as far as Pillow needs (header first)."""
    if _looks_like_svg(handle.read(_SNIFF_BYTES)):
        raise ImageNotUsable(SVG_REFUSED.format(path=label))
    handle.seek(0)
    max_edge = max(limits.max_edge, MIN_MAX_EDGE)
    source = _open(handle, label, limits)
    try:
        source_format = source.format or "unknown"
        try:
            source_width, source_height = _upright_size(source)
            image = _upright(source, max_edge)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            raise ImageNotUsable(DAMAGED.format(path=label)) from error
        alpha = _has_alpha(image)
        if alpha:
            image = image.convert("RGBA")
        elif image.mode not in {"RGB", "L"}:
            image = image.convert("RGB")
        image.thumbnail((max_edge, max_edge), Image.Resampling.LANCZOS)
        encoded, mime_type = _encode(image, lossless=alpha or source_format in _LOSSLESS_SOURCES)
    finally:
        source.close()
    return EncodedImage(
        data=encoded,
        mime_type=mime_type,
        width=image.width,
        height=image.height,
        source_format=source_format,
        source_width=source_width,
        source_height=source_height,
    )


def encode_image(
    path: Path, limits: ImageLimits = DEFAULT_LIMITS, *, label: str | None = None
) -> EncodedImage:
    """`encode_image_bytes` for a file; an SVG name is refused without reading it.

    The file is read as Pillow goes (a refused header costs a few bytes), and the work
    runs off the event loop: decoding and resizing a large photo takes a while.

    Raises:
        ImageNotUsable: See `encode_image_bytes`.
        OSError: The file cannot be read.
    """
    shown = label if label is not None else neutralize(path.name)
    if is_svg_name(path.name):
        raise ImageNotUsable(SVG_REFUSED.format(path=shown))
    return off_loop(_encode_file, path, limits, shown)


def _encode_file(path: Path, limits: ImageLimits, label: str) -> EncodedImage:
    with path.open("rb") as handle:
        return _encode_stream(handle, limits, label)


@dataclass(frozen=True)
class TurnImage:
    """One picture of a message: the block sent, or why it was not sent."""

    filename: str
    path: str
    image: EncodedImage | None = None
    refused: str | None = None

    def describe(self) -> dict[str, Any]:
        """The picture as plain data, for the chat preview's history (no bytes)."""
        data: dict[str, Any] = {"filename": self.filename, "path": self.path}
        if self.image is not None:
            data.update(self.image.describe())
        if self.refused is not None:
            data["refused"] = self.refused
        return data


@dataclass(frozen=True)
class TurnImages:
    """The pictures of one message: those sent as blocks, and those only named.

    Attributes:
        sent: Pictures sent as image blocks, in the message's order.
        refused: Pictures that could not be sent (SVG, damaged, too large), with reasons.
        left_out: Pictures beyond `max_images`, only named so `view_image` can show them.
    """

    sent: tuple[TurnImage, ...] = ()
    refused: tuple[TurnImage, ...] = ()
    left_out: tuple[TurnImage, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.sent or self.refused or self.left_out)

    def content_parts(self) -> list[dict[str, Any]]:
        """The content blocks that go after the message's text: a caption, then each
        picture's block; then one note for pictures that were not sent."""
        parts: list[dict[str, Any]] = []
        total = len(self.sent)
        for number, turn_image in enumerate(self.sent, start=1):
            assert turn_image.image is not None
            parts.append({"type": "text", "text": caption(turn_image, number, total)})
            parts.append(turn_image.image.content_block())
        notes = [item.refused for item in self.refused if item.refused]
        if self.left_out:
            names = ", ".join(neutralize(item.path) for item in self.left_out)
            notes.append(
                f"{len(self.left_out)} more picture(s) of this message were not attached "
                f"(at most {total} per message): {names}. Use view_image to look at one."
            )
        if notes:
            parts.append({"type": "text", "text": "\n".join(notes)})
        return parts

    def describe(self) -> list[dict[str, Any]]:
        """Every picture of the message as plain data, sent ones first."""
        return [item.describe() for item in (*self.sent, *self.refused, *self.left_out)]


def caption(turn_image: TurnImage, number: int, total: int) -> str:
    """The text in front of a picture's block, so the model knows which file it is."""
    assert turn_image.image is not None
    return (
        f"Picture {number} of {total} attached to this message: "
        f"{neutralize(turn_image.path)} ({turn_image.image.size_text()})"
    )


NOT_OURS = (
    "{path} is not a regular file of this thread's uploads (a link, or a file that is not "
    "listed); it was not opened."
)


def _open_upload(path: Path, listed: Collection[str] | None, shown: str) -> BinaryIO:
    """Open a file directly in uploads/, never through a symlink, and only a hard-linked
    one the upload listing knows (its bytes may belong to another thread otherwise).

    Checked on the open descriptor, so the name cannot be swapped in between.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(descriptor)
        foreign = info.st_nlink > 1 and (listed is None or path.name not in listed)
        if not stat.S_ISREG(info.st_mode) or foreign:
            raise ImageNotUsable(NOT_OURS.format(path=shown))
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def encode_upload(
    path: Path, listed: Collection[str] | None, limits: ImageLimits, shown: str
) -> EncodedImage:
    """`encode_image` for a file directly in uploads/ (see `_open_upload`); call it off
    the event loop.

    Raises:
        ImageNotUsable: See `encode_image_bytes`, and links that are not the thread's.
        OSError: The file cannot be read (ELOOP: a symlink).
    """
    if is_svg_name(path.name):
        raise ImageNotUsable(SVG_REFUSED.format(path=shown))
    with _open_upload(path, listed, shown) as handle:
        return _encode_stream(handle, limits, shown)


def turn_images(
    uploads_dir: Path | None,
    uploaded_files: Sequence[Mapping[str, Any]],
    limits: ImageLimits = DEFAULT_LIMITS,
    *,
    listed: Collection[str] | None = None,
) -> TurnImages:
    """Encode the pictures among a turn's announced files (state `uploaded_files`).

    Only names with a raster extension are opened; an SVG gets a note. Pictures beyond
    `max_images` are not even decoded. A symlink is never followed, and a hard-linked file
    is only read when `listed` names it (as the file tools do).

    Args:
        uploads_dir: The thread's uploads folder; None (unknown thread) sends nothing.
        uploaded_files: The turn's files, as the uploads middleware announced them.
        limits: Edge, count and pixel limits.
        listed: The names of the thread's upload records; None when unknown.
    """
    if uploads_dir is None:
        return TurnImages()
    sent: list[TurnImage] = []
    refused: list[TurnImage] = []
    left_out: list[TurnImage] = []
    for entry in uploaded_files:
        filename = str(entry.get("filename") or "")
        if not filename or not (is_image_name(filename) or is_svg_name(filename)):
            continue
        path = f"{VIRTUAL_UPLOADS_DIR}/{filename}"
        if is_image_name(filename) and len(sent) >= max(limits.max_images, 0):
            left_out.append(TurnImage(filename, path))
            continue
        try:
            image = off_loop(
                encode_upload, uploads_dir / filename, listed, limits, neutralize(path)
            )
        except ImageNotUsable as error:
            refused.append(TurnImage(filename, path, refused=str(error)))
        except OSError as error:
            reason = (
                NOT_OURS.format(path=neutralize(path))
                if error.errno == errno.ELOOP
                else f"{neutralize(path)} could not be read: {error.strerror}"
            )
            refused.append(TurnImage(filename, path, refused=reason))
        else:
            sent.append(TurnImage(filename, path, image=image))
    return TurnImages(tuple(sent), tuple(refused), tuple(left_out))


def view_image_content(image: EncodedImage, shown_path: str) -> list[dict[str, Any]]:
    """What `view_image` returns to the model: a short text, then the picture's block."""
    return [
        {"type": "text", "text": f"{shown_path} ({image.size_text()})"},
        image.content_block(),
    ]
