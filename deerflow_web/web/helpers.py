"""Template globals and filters of the pages: URLs, sizes, times and translated labels.

Templates build every link through these (and so through `url_for`), never by hand.
"""

from __future__ import annotations

from datetime import UTC
from datetime import datetime

from flask import Flask
from flask import url_for
from flask_babel import format_datetime
from flask_babel import lazy_gettext as _l

from deerflow_web.models import ACTIVE_CONVERSION_STATES
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.models import ConversionState
from deerflow_web.models import UploadRecord
from deerflow_web.services.files.kinds import FileKind
from deerflow_web.services.files.sizes import human_size
from deerflow_web.services.files.thumbnails import wants_thumbnail
from deerflow_web.services.prompt.untrusted import escape_controls

KIND_LABELS = {
    FileKind.DOCUMENT: _l("Document"),
    FileKind.SPREADSHEET: _l("Spreadsheet"),
    FileKind.PRESENTATION: _l("Presentation"),
    FileKind.TEXT: _l("Text"),
    FileKind.DATA: _l("Data"),
    FileKind.CODE: _l("Code"),
    FileKind.IMAGE: _l("Image"),
    FileKind.AUDIO: _l("Audio"),
    FileKind.VIDEO: _l("Video"),
    FileKind.ARCHIVE: _l("Archive"),
    FileKind.OTHER: _l("Other"),
}

AREA_LABELS = {
    Area.UPLOADS: _l("Uploads"),
    Area.OUTPUTS: _l("Outputs"),
    Area.WORKSPACE: _l("Workspace"),
}

CONVERSION_LABELS = {
    ConversionState.QUEUED: _l("Waiting to convert"),
    ConversionState.CONVERTING: _l("Converting…"),
    ConversionState.DONE: _l("Converted"),
    ConversionState.FAILED: _l("Conversion failed"),
}


def virtual_path(user_data_path: str) -> str:
    """`uploads/a.txt` → `mnt/user-data/uploads/a.txt` (the artifact route's path)."""
    return f"{VIRTUAL_PATH_PREFIX.lstrip('/')}/{user_data_path}"


def artifact_href(thread_id: str, user_data_path: str, download: bool = False) -> str:
    """The file itself: inline where safe, or as a download."""
    args = {"download": "true"} if download else {}
    return url_for(
        "api.get_artifact", thread_id=thread_id, virtual_path=virtual_path(user_data_path), **args
    )


def preview_href(thread_id: str, user_data_path: str) -> str:
    """The preview page of a file."""
    return url_for("pages.preview_file", thread_id=thread_id, path=user_data_path)


def convert_href(thread_id: str, filename: str) -> str:
    """The explicit-conversion endpoint of an upload (SPEC 3.4)."""
    return url_for("api.convert_upload", thread_id=thread_id, filename=filename)


def thumbnail_href(thread_id: str, record: UploadRecord) -> str | None:
    """The thumbnail of an upload that can have one (raster images, never SVG), keyed by
    its content so a replaced picture is fetched anew."""
    if not wants_thumbnail(record.filename, record.size):
        return None
    return url_for(
        "downloads.thumbnail", thread_id=thread_id, filename=record.filename, v=record.sha256[:16]
    )


def timestamp(value: float | None, style: str = "short") -> str:
    """A POSIX time in the reader's locale (UTC unless a time zone is configured)."""
    if not value:
        return ""
    return format_datetime(datetime.fromtimestamp(value, UTC), style)


def iso_time(value: float | None) -> str:
    """A POSIX time as ISO 8601, for `<time datetime>`."""
    if not value:
        return ""
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")


def visible(value: object) -> str:
    """A user-derived value (a name on disk) as a page shows it: controls, line breaks and
    bidi marks escaped, so it keeps one line and displays in its real order."""
    return "" if value is None else escape_controls(str(value))


def register(app: Flask) -> None:
    """Make the helpers available to every template of the app (called by `create_app`)."""
    for function in (artifact_href, preview_href, convert_href, thumbnail_href):
        app.add_template_global(function)
    app.add_template_global(KIND_LABELS, "kind_labels")
    app.add_template_global(AREA_LABELS, "area_labels")
    app.add_template_global(CONVERSION_LABELS, "conversion_labels")
    app.add_template_global(sorted(ACTIVE_CONVERSION_STATES), "active_conversion_states")
    app.add_template_filter(human_size)
    app.add_template_filter(timestamp)
    app.add_template_filter(iso_time)
    app.add_template_filter(visible)
