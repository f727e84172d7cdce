"""What the chat preview page tests share: their thread, its chat page and the app's
upload service."""

from __future__ import annotations

from typing import Any

from flask import Flask

from deerflow_web.services.uploads.service import UploadService
from deerflow_web.web.wiring import EXTENSION_KEY

T = "t1"
CHAT = f"/threads/{T}/chat"


def uploads_of(app: Flask) -> UploadService:
    return app.extensions[EXTENSION_KEY].uploads


def text(response: Any) -> str:
    return response.get_data(as_text=True)
