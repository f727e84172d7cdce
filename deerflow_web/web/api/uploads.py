"""The JSON API, wire-compatible with DeerFlow's gateway (SPEC 2): thin views over services."""

from __future__ import annotations

from collections.abc import Mapping

from flask import Blueprint
from flask import Response
from flask import request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest
from werkzeug.exceptions import RequestedRangeNotSatisfiable
from werkzeug.http import parse_range_header
from werkzeug.routing import PathConverter

from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import InvalidInput
from deerflow_web.models import OnConflict
from deerflow_web.services.files.artifact_edit import MAX_EDITABLE_BYTES
from deerflow_web.services.files.artifact_edit import edit_artifact
from deerflow_web.services.files.artifact_edit import parse_edit
from deerflow_web.services.uploads.info import UploadInfoFormatter
from deerflow_web.settings import parse_flag
from deerflow_web.web.api import history as history_api
from deerflow_web.web.api import threads as threads_api
from deerflow_web.web.api import tus
from deerflow_web.web.marks import thread_may_be_new
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.transport.send import send_artifact
from deerflow_web.web.transport.uploads import receive_uploads
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("api", __name__, url_prefix="/api")
# The JSON of an edit: 2 MiB of text, escaped (`\u0001` is six bytes for one), and its frame.
EDIT_BODY_LIMIT = 6 * MAX_EDITABLE_BYTES + 64 * 1024
# The resumable (tus) routes and the thread records live under /api as nested blueprints,
# so whatever guards this blueprint covers them too. (The origin check is app-wide, for
# every route under /api/: web/security.py.)
bp.register_blueprint(tus.bp)
bp.register_blueprint(threads_api.bp)
bp.register_blueprint(history_api.bp)


class VirtualPathConverter(PathConverter):
    """Werkzeug's `path` that also takes a leading slash, as DeerFlow's `{path:path}` does.

    So `.../artifacts//mnt/user-data/x` (a client joining the URL and a virtual path) finds
    the file instead of no route; and a name holding a line break (names keep control
    characters) still matches, which `.` would not.
    """

    regex = r"/?[^/][\s\S]*?"


bp.record_once(lambda state: state.app.url_map.converters.setdefault("vpath", VirtualPathConverter))


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


def _formatter() -> UploadInfoFormatter:
    return UploadInfoFormatter.for_thread(current_thread())


@bp.post("/threads/<thread_id>/uploads")
@thread_may_be_new
def upload_files() -> ResponseReturnValue:
    """Store the request's files in the thread's uploads folder, streaming each part."""
    accepted = receive_uploads(current_thread())
    body = _formatter().upload_response(accepted.result, accepted.companions, accepted.extractions)
    # Nothing stored and the virus scanner is why: 422 (the content was understood and
    # refused for what it holds), with DeerFlow's body and a `detail`. When clean parts of
    # the request were stored, 200 with `success: false`, as for a part refused for its name.
    return (body, 422) if "detail" in body else body


@bp.get("/threads/<thread_id>/uploads/limits")
@thread_may_be_new
def upload_limits() -> ResponseReturnValue:
    """The limits the upload route enforces, so clients can check before sending."""
    return get_upload_service().limits.as_dict()


@bp.get("/threads/<thread_id>/uploads/list")
@thread_may_be_new
def list_uploads() -> ResponseReturnValue:
    """The thread's uploads, by name, from the records (reconciled with the folder)."""
    records = get_upload_service().list_uploads(current_thread())
    files = _formatter().listing(records)
    return {"files": files, "count": len(files)}


@bp.delete("/threads/<thread_id>/uploads/<filename>")
def delete_upload(filename: str) -> ResponseReturnValue:
    """Move one upload and the Markdown companion converted from it into the thread's
    trash (DeerFlow's answer unchanged); `permanent=true` deletes them for good."""
    permanent = _query_bool("permanent")
    get_upload_service().delete_upload(current_thread(), filename, permanent=permanent)
    return {"success": True, "message": f"Deleted {filename}"}


@bp.post("/threads/<thread_id>/uploads/<filename>/rename")
def rename_upload(filename: str) -> ResponseReturnValue:
    """Rename one upload; `new_name` and `on_conflict` come as a JSON object or form fields."""
    # JSON when the client says so (a malformed body is 400), else form fields
    body = request.get_json() if request.is_json else request.form
    if not isinstance(body, Mapping):
        raise InvalidInput("Input should be a valid dictionary", ("body",), None)
    new_name = body.get("new_name")
    if not isinstance(new_name, str) or not new_name:
        raise InvalidInput("Field required", ("body", "new_name"))
    on_conflict = OnConflict.named(body.get("on_conflict"), OnConflict.REJECT)
    record = get_upload_service().rename_upload(
        current_thread(), filename, new_name, on_conflict=on_conflict
    )
    info = _formatter()(record)
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
def convert_upload(filename: str) -> ResponseReturnValue:
    """Convert a document to Markdown now: 200 when done in time, 202 while it runs."""
    status = get_services().conversions.convert(current_thread(), filename)
    if status.error is not None:
        raise status.error
    info = _formatter()(status.record, companion=status.companion)
    return info, 200 if status.finished else 202


@bp.post("/threads/<thread_id>/uploads/<filename>/extract")
def extract_upload(filename: str) -> ResponseReturnValue:
    """Extract an uploaded archive into `workspace/<its name>/`; refusals are listed."""
    body = request.get_json() if request.is_json else request.form
    if not isinstance(body, Mapping):
        raise InvalidInput("Input should be a valid dictionary", ("body",), None)
    on_conflict = OnConflict.named(body.get("on_conflict"), OnConflict.RENAME)
    extraction = get_services().extractor.extract(
        current_thread(), filename, on_conflict=on_conflict
    )
    return extraction.as_dict()


@bp.get("/threads/<thread_id>/artifacts/<vpath:virtual_path>")
def get_artifact(virtual_path: str) -> ResponseReturnValue:
    """Send one file of the thread's user-data folder: passive kinds inline, else a download."""
    download = _query_bool("download")
    uploads, thread = get_upload_service(), current_thread()
    if download and (url := uploads.presigned_download(thread, virtual_path)) is not None:
        # The bucket serves it; who may have it was checked. No body: nothing to render.
        return Response(status=302, headers={"Location": url})
    artifact = uploads.resolve_artifact(thread, virtual_path, from_bucket=True)
    if (refusal := _refuse_range(artifact.size)) is not None:
        return refusal
    try:  # the bytes sent are those of this open file, its ETag checked against them
        return send_artifact(uploads, thread, artifact, attachment=artifact.as_attachment(download))
    except OSError:
        raise ArtifactNotFound(virtual_path.lstrip("/")) from None


@bp.put("/threads/<thread_id>/artifacts/<vpath:virtual_path>")
def edit_artifact_content(virtual_path: str) -> ResponseReturnValue:
    """Replace a text file under outputs/ if it is still the version the editor opened."""
    request.max_content_length = EDIT_BODY_LIMIT  # the JSON is read whole: bound it first
    try:
        body = request.get_json(force=True)
    except BadRequest:
        body = None  # malformed JSON: the same 400 as a body of the wrong shape
    content, expected_sha256 = parse_edit(body)
    if (scanner := get_services().scanner) is not None:  # refuses what it finds, or 503
        scanner.require_clean(content.encode("utf-8"), virtual_path.rsplit("/", 1)[-1])
    versions = get_services().history.versions
    edited = edit_artifact(
        current_thread(),
        virtual_path,
        content,
        expected_sha256,
        versions=versions if versions.enabled else None,
        quotas=get_upload_service().quotas,
    )
    return edited.as_dict()
