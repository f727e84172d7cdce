"""Several files at once: one streamed zip of a selection, or of a whole tab.

The bulk bar's "Download selected" submits the selection here (GET, since nothing
changes), and each tab has a "Download all" link. Every file is resolved as its own
download would be before anything is sent (services/files/zip_download.py).
"""

from __future__ import annotations

from urllib.parse import quote

from flask import Blueprint
from flask import Response
from flask import abort
from flask import request
from flask import send_file
from flask.typing import ResponseReturnValue

from deerflow_web.errors import InvalidInput
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.services.files.freshness import open_checked
from deerflow_web.services.files.thumbnails import wants_thumbnail
from deerflow_web.services.files.zip_download import ZipMember
from deerflow_web.services.files.zip_download import area_paths
from deerflow_web.services.files.zip_download import members_for_paths
from deerflow_web.services.files.zip_download import stream_zip
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.web.security import artifact_csp
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("downloads", __name__)


def _requested_paths(thread: ThreadFolders) -> list[str]:
    """User-data paths from `path` (any area), `filenames` (uploads, as the bulk form
    names them) or, with neither, every file of the tab `area` (and `folder`)."""
    paths = request.args.getlist("path")
    paths += [f"{Area.UPLOADS.value}/{name}" for name in request.args.getlist("filenames") if name]
    if paths:
        return paths
    raw_area = request.args.get("area", Area.UPLOADS.value)
    try:
        area = Area(raw_area)
    except ValueError:
        raise InvalidInput("Unknown area.", ("query", "area"), raw_area) from None
    uploads = get_upload_service()
    return area_paths(
        thread,
        area,
        request.args.get("folder", ""),
        lambda: [record.filename for record in uploads.list_uploads(thread)],
    )


@bp.get("/threads/<thread_id>/thumbnails/<filename>")
def thumbnail(filename: str) -> ResponseReturnValue:
    """A small WebP of an uploaded raster image (never SVG), made once per content."""
    thread, uploads = current_thread(), get_upload_service()
    record = uploads.get_upload(thread, filename)
    if not wants_thumbnail(record.filename, record.size):
        abort(404)
    artifact = uploads.resolve_artifact(
        thread, f"{VIRTUAL_PATH_PREFIX}/{Area.UPLOADS.value}/{record.filename}"
    )
    try:
        checked = open_checked(uploads, thread, artifact.path)
    except OSError:
        abort(404)
    with checked.file:
        sha256 = checked.record.sha256 if checked.record is not None else record.sha256
        path = get_services().thumbnails.get(sha256, checked.file)
    if path is None:
        abort(404)
    response = send_file(path, mimetype="image/webp", etag=sha256, max_age=86400)
    response.headers["Cache-Control"] = "private, max-age=86400"
    response.headers["Content-Security-Policy"] = artifact_csp(None)
    return response


@bp.get("/threads/<thread_id>/zip")
def download_zip() -> ResponseReturnValue:
    """A zip of the chosen files, streamed; 404 (and nothing sent) if one cannot be had."""
    thread, uploads = current_thread(), get_upload_service()
    members = members_for_paths(
        lambda virtual: uploads.resolve_artifact(thread, virtual), _requested_paths(thread)
    )

    def open_member(member: ZipMember):  # noqa: ANN202 - a file object
        return open_checked(uploads, thread, member.artifact.path).file

    name = f"{thread.thread_id}.zip"
    response = Response(
        stream_zip(members, open_member), mimetype="application/zip", direct_passthrough=True
    )
    response.headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(name)}"
    response.headers["Content-Security-Policy"] = artifact_csp(None)
    response.headers["Cache-Control"] = "private, no-store"
    return response
