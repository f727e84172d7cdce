"""The JSON API, wire-compatible with DeerFlow's gateway (SPEC 2): thin views over services."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from flask import Blueprint
from flask import Response
from flask import request
from flask import send_file
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import RequestedRangeNotSatisfiable
from werkzeug.http import parse_range_header
from werkzeug.routing import PathConverter

from deerflow_web.errors import InvalidInput
from deerflow_web.models import OnConflict
from deerflow_web.services.uploads.info import UploadInfoFormatter
from deerflow_web.settings import parse_flag
from deerflow_web.storage.paths import validate_thread_id
from deerflow_web.web import threads_api
from deerflow_web.web import tus
from deerflow_web.web.security import artifact_csp
from deerflow_web.web.security import refuse_cross_site
from deerflow_web.web.thread_access import thread_may_be_new
from deerflow_web.web.uploads import receive_uploads
from deerflow_web.web.wiring import current_user_id
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("api", __name__, url_prefix="/api")
# The resumable (tus) routes and the thread records live under /api as nested blueprints,
# so every check of this blueprint (the origin check below, and whatever guards the API)
# covers them too.
bp.register_blueprint(tus.bp)
bp.register_blueprint(threads_api.bp)


class VirtualPathConverter(PathConverter):
    """Werkzeug's `path` that also takes a leading slash, as DeerFlow's `{path:path}` does.

    So `.../artifacts//mnt/user-data/x` (a client joining the URL and a virtual path) finds
    the file instead of no route; and a name holding a line break (names keep control
    characters) still matches, which `.` would not.
    """

    regex = r"/?[^/][\s\S]*?"


bp.record_once(lambda state: state.app.url_map.converters.setdefault("vpath", VirtualPathConverter))


@bp.before_request
def check_origin() -> None:
    """Refuse state-changing browser requests from other sites (see web/security.py)."""
    settings = get_services().settings
    refuse_cross_site(settings.allowed_hosts, settings.allowed_origins)


def _query_bool(name: str) -> bool:
    raw = request.args.get(name)
    if raw is None:
        return False
    flag = parse_flag(raw)
    if flag is None:
        raise InvalidInput(
            "Input should be a valid boolean, unable to interpret input", ("query", name), raw
        )
    return flag


def _formatter(thread_id: str) -> UploadInfoFormatter:
    return UploadInfoFormatter(
        thread_id, get_upload_service().uploads_dir(thread_id, current_user_id())
    )


@bp.post("/threads/<thread_id>/uploads")
@thread_may_be_new
def upload_files(thread_id: str) -> ResponseReturnValue:
    """Store the request's files in the thread's uploads folder, streaming each part."""
    validate_thread_id(thread_id)
    accepted = receive_uploads(thread_id)
    result, companions = accepted.result, accepted.companions
    shape = _formatter(thread_id)
    files = [
        shape(
            saved.record,
            companion=companions.get(saved.record.filename),
            in_upload_response=True,
            duplicate_of=saved.duplicate_of,
        )
        for saved in result.files
    ]
    return {
        "success": result.success,
        "files": files,
        "message": result.message,
        "skipped_files": result.skipped_files,
        "rejected_files": [
            {"filename": rejected.filename, "reason": rejected.reason}
            for rejected in result.rejected_files
        ],
    }


@bp.get("/threads/<thread_id>/uploads/limits")
@thread_may_be_new
def upload_limits(thread_id: str) -> ResponseReturnValue:
    """The limits the upload route enforces, so clients can check before sending."""
    validate_thread_id(thread_id)
    return get_upload_service().limits.as_dict()


@bp.get("/threads/<thread_id>/uploads/list")
@thread_may_be_new
def list_uploads(thread_id: str) -> ResponseReturnValue:
    """The thread's uploads, by name, from the records (reconciled with the folder)."""
    records = get_upload_service().list_uploads(thread_id, current_user_id())
    files = _formatter(thread_id).listing(records)
    return {"files": files, "count": len(files)}


@bp.delete("/threads/<thread_id>/uploads/<filename>")
def delete_upload(thread_id: str, filename: str) -> ResponseReturnValue:
    """Delete one upload and the Markdown companion converted from it."""
    validate_thread_id(thread_id)
    get_upload_service().delete_upload(thread_id, filename, current_user_id())
    return {"success": True, "message": f"Deleted {filename}"}


@bp.post("/threads/<thread_id>/uploads/<filename>/rename")
def rename_upload(thread_id: str, filename: str) -> ResponseReturnValue:
    """Rename one upload; `new_name` and `on_conflict` come as a JSON object or form fields."""
    validate_thread_id(thread_id)
    # JSON when the client says so (a malformed body is 400), else form fields
    body = request.get_json() if request.is_json else request.form
    if not isinstance(body, Mapping):
        raise InvalidInput("Input should be a valid dictionary", ("body",), None)
    new_name = body.get("new_name")
    if not isinstance(new_name, str) or not new_name:
        raise InvalidInput("Field required", ("body", "new_name"))
    on_conflict = OnConflict.named(body.get("on_conflict"), OnConflict.REJECT)
    record = get_upload_service().rename_upload(
        thread_id, filename, new_name, on_conflict=on_conflict, user_id=current_user_id()
    )
    info = _formatter(thread_id)(record)
    return {"success": True, "message": f"Renamed {filename} to {record.filename}", "file": info}


def _refuse_range(size: int) -> Response | None:
    """400 for a Range header we cannot parse, 416 for any range of an empty file.

    Werkzeug serves both as a plain 200 (or 416 for a foreign unit); SPEC 2.5 wants
    the client told.
    """
    header = request.headers.get("Range")
    if header is None:
        return None
    parsed = parse_range_header(header)
    if parsed is None or parsed.units != "bytes":
        return Response("Invalid Range header\n", 400, mimetype="text/plain")
    if size == 0:
        raise RequestedRangeNotSatisfiable(length=0)
    return None


@bp.post("/threads/<thread_id>/uploads/<filename>/convert")
def convert_upload(thread_id: str, filename: str) -> ResponseReturnValue:
    """Convert a document to Markdown now: 200 when done in time, 202 while it runs."""
    validate_thread_id(thread_id)
    user_id = current_user_id()
    status = get_services().conversions.convert(thread_id, filename, user_id=user_id)
    if status.error is not None:
        raise status.error
    info = _formatter(thread_id)(status.record, companion=status.companion)
    return info, 200 if status.finished else 202


@bp.get("/threads/<thread_id>/artifacts/<vpath:virtual_path>")
def get_artifact(thread_id: str, virtual_path: str) -> ResponseReturnValue:
    """Send one file of the thread's user-data folder: passive kinds inline, else a download."""
    validate_thread_id(thread_id)
    download = _query_bool("download")
    artifact = get_upload_service().resolve_artifact(thread_id, virtual_path, current_user_id())
    if (refusal := _refuse_range(artifact.size)) is not None:
        return refusal
    attachment = artifact.as_attachment(download)
    response = send_file(
        artifact.path,
        mimetype=artifact.response_type(attachment),
        conditional=True,
        as_attachment=attachment,
        download_name=quote(artifact.name, safe=""),  # replaced below; a name may hold CR or LF
        etag=True,
    )
    kind = "attachment" if attachment else "inline"
    response.headers["Content-Disposition"] = (
        f"{kind}; filename*=UTF-8''{quote(artifact.name, safe='')}"
    )
    response.headers["Content-Security-Policy"] = artifact_csp(
        None if attachment else artifact.presentation
    )
    return response
