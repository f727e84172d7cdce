"""What the browser tests share: the live server handle and the watched page."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from io import BytesIO
from pathlib import Path

from flask import Flask
from playwright.sync_api import BrowserContext
from playwright.sync_api import Page

from deerflow_web.models import IncomingFile
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.web.wiring import EXTENSION_KEY

SCREENSHOTS: list[tuple[str, Path]] = []


@dataclass
class LiveServer:
    """A running app and helpers to put files in it without a browser."""

    app: Flask
    url: str

    @property
    def service(self) -> UploadService:
        return self.app.extensions[EXTENSION_KEY].uploads

    def seed(self, thread_id: str, files: dict[str, bytes]) -> None:
        """Store files through the upload service (any name, even ones browsers re-encode)."""
        incoming = [IncomingFile(name, BytesIO(body)) for name, body in files.items()]
        self.service.save_uploads(thread_id, incoming)

    def names(self, thread_id: str) -> list[str]:
        return [record.filename for record in self.service.list_uploads(thread_id)]

    def read(self, thread_id: str, name: str) -> bytes:
        return (self.service.uploads_dir(thread_id) / name).read_bytes()


@dataclass
class Watched:
    """A browser page plus what it logged: console errors, dialogs, requests."""

    page: Page
    context: BrowserContext
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)
    screenshot_dir: Path | None = None
    allowed_errors: list[str] = field(default_factory=list)

    def shoot(self, name: str, *, full_page: bool = True) -> Path:
        """Save a screenshot into the run's temporary folder and remember its path."""
        assert self.screenshot_dir is not None
        path = self.screenshot_dir / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        SCREENSHOTS.append((name, path))
        print(f"screenshot {name}: {path}")
        return path


def gradient_png(width: int = 96, height: int = 64) -> bytes:
    """A small RGB PNG with a visible gradient, built with the standard library."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + b"".join(bytes((x * 255 // width, y * 255 // height, 160)) for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
