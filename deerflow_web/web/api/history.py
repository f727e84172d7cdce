"""A thread's history over the JSON API (issue 27): versions of replaced files, the trash.

Thin views over `services/history`. A version is downloaded as the file itself would be
(its own name's type, passive kinds inline and everything else an attachment, nosniff
and the artifacts' CSP); the file's versions are only reachable through the file, in its
own thread (the thread gate decides whose it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from flask import Blueprint
from flask import request
from flask import send_file
from flask.typing import ResponseReturnValue

from deerflow_web.errors import InvalidInput
from deerflow_web.models import Area
from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.artifacts import classify
from deerflow_web.services.history.hooks import ThreadHistory
from deerflow_web.services.history.trash import restore_conflict
from deerflow_web.services.history.versions import VersionedFile
from deerflow_web.services.history.versions import versioned_file
from deerflow_web.services.uploads.info import UploadInfoFormatter
from deerflow_web.settings import parse_flag
from deerflow_web.web.security import artifact_csp
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("history_api", __name__)

BODY_LIMIT = 16 * 1024  # a restore's options are a few bytes


@bp.before_request
def limit_body() -> None:
    request.max_content_length = BODY_LIMIT


def _history() -> ThreadHistory:
    return get_services().history


def _formatter() -> UploadInfoFormatter:
    return UploadInfoFormatter.for_thread(current_thread())


def _options() -> Mapping[str, Any]:
    """The JSON object (or form) a POST may carry; none at all is no options."""
    if request.is_json:
        if not request.get_data(cache=True):
            return {}
        body = request.get_json()
        if not isinstance(body, Mapping):
            raise InvalidInput("Input should be a valid dictionary", ("body",), body)
        return body
    return request.form


def _upload(filename: str) -> VersionedFile:
    return versioned_file(f"/mnt/user-data/{Area.UPLOADS.value}/{filename}")


def _by_path() -> VersionedFile:
    raw = request.args.get("path")
    if not raw:
        raise InvalidInput("Field required", ("query", "path"))
    return versioned_file(raw)


def _listing(file: VersionedFile) -> dict[str, Any]:
    versions = _history().versions.list(current_thread(), file)
    return {
        "filename": file.name,
        "path": file.virtual_path,
        "versions": [v.as_dict() for v in versions],
        "count": len(versions),
    }


def _download(file: VersionedFile, version_id: str) -> ResponseReturnValue:
    version, path = _history().versions.get(current_thread(), file, version_id)
    name = PurePosixPath(file.name).name
    content_type, active, presentation = classify(path, name)
    artifact = Artifact(path, name, content_type, active, version.size, presentation)
    raw = request.args.get("download")
    attachment = artifact.as_attachment(bool(raw is not None and parse_flag(raw)))
    response = send_file(
        path,
        mimetype=artifact.response_type(attachment),
        as_attachment=attachment,
        download_name=quote(name, safe=""),  # replaced below; a name may hold CR or LF
        etag=version.sha256,
        conditional=True,
    )
    kind = "attachment" if attachment else "inline"
    response.headers["Content-Disposition"] = f"{kind}; filename*=UTF-8''{quote(name, safe='')}"
    response.headers["Content-Security-Policy"] = artifact_csp(
        None if attachment else artifact.presentation
    )
    response.headers["Cache-Control"] = "private, no-store"
    return response


def _restore(file: VersionedFile, version_id: str) -> ResponseReturnValue:
    thread = current_thread()
    version = _history().versions.restore(thread, file, version_id)
    answer: dict[str, Any] = {
        "success": True,
        "message": f"Restored the version of {file.name} from {version.created_at:.0f}",
        "version": version.as_dict(),
    }
    if file.area is Area.UPLOADS:
        thread.forget_records()
        record = get_upload_service().get_upload(thread, file.name)
        answer["file"] = _formatter()(record)
    return answer


@bp.get("/threads/<thread_id>/uploads/<filename>/versions")
def list_upload_versions(filename: str) -> ResponseReturnValue:
    """The upload's earlier versions, newest first."""
    return _listing(_upload(filename))


@bp.get("/threads/<thread_id>/uploads/<filename>/versions/<version_id>")
def download_upload_version(filename: str, version_id: str) -> ResponseReturnValue:
    """The bytes of one earlier version, served as the upload itself would be."""
    return _download(_upload(filename), version_id)


@bp.post("/threads/<thread_id>/uploads/<filename>/versions/<version_id>/restore")
def restore_upload_version(filename: str, version_id: str) -> ResponseReturnValue:
    """Make a version current again; the current bytes become a version first."""
    return _restore(_upload(filename), version_id)


@bp.get("/threads/<thread_id>/versions")
def list_versions() -> ResponseReturnValue:
    """The earlier versions of any file that has them (`path`: its virtual path, in
    uploads/ or outputs/: an edited artifact's versions are here)."""
    return _listing(_by_path())


@bp.get("/threads/<thread_id>/versions/<version_id>")
def download_version(version_id: str) -> ResponseReturnValue:
    """The bytes of one earlier version of the file at `path`."""
    return _download(_by_path(), version_id)


@bp.post("/threads/<thread_id>/versions/<version_id>/restore")
def restore_version(version_id: str) -> ResponseReturnValue:
    """Make a version of the file at `path` current again."""
    return _restore(_by_path(), version_id)


@bp.get("/threads/<thread_id>/trash")
def list_trash() -> ResponseReturnValue:
    """The thread's deleted files, most recent first, with when each expires."""
    trash = _history().trash_bin
    entries = trash.list(current_thread())
    return {
        "files": [entry.as_dict(trash.expires_at(entry)) for entry in entries],
        "count": len(entries),
        "days": trash.settings.trash_days,
    }


@bp.post("/threads/<thread_id>/trash/<trash_id>/restore")
def restore_trashed(trash_id: str) -> ResponseReturnValue:
    """Put a deleted file back; `on_conflict` (fail, rename, replace) for a name taken."""
    on_conflict = restore_conflict(_options().get("on_conflict"))
    record = _history().trash_bin.restore(current_thread(), trash_id, on_conflict)
    return {
        "success": True,
        "message": f"Restored {record.filename}",
        "file": _formatter()(record),
    }


@bp.delete("/threads/<thread_id>/trash")
def empty_trash() -> ResponseReturnValue:
    """Delete everything in the thread's trash for good."""
    count = _history().trash_bin.empty(current_thread())
    return {"success": True, "message": f"Deleted {count} file(s) for good", "count": count}


@bp.delete("/threads/<thread_id>/trash/<trash_id>")
def delete_trashed(trash_id: str) -> ResponseReturnValue:
    """Delete one entry of the trash for good."""
    _history().trash_bin.delete(current_thread(), trash_id)
    return {"success": True, "message": "Deleted for good"}
