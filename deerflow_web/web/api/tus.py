"""Resumable uploads over tus 1.0.0 (SPEC 8): thin views over the resumable upload service.

Core protocol plus the creation, termination, checksum and expiration extensions. Every
response says `Tus-Resumable: 1.0.0`, errors included; a request that does not say it
(OPTIONS aside) is refused with 412. The blueprint is nested in the API's (`api.tus`), so
the API's own request checks run first.
"""

from __future__ import annotations

import re

from flask import Blueprint
from flask import Response
from flask import request
from flask import url_for
from flask.typing import ResponseReturnValue
from werkzeug.http import http_date

from deerflow_web.errors import InvalidTusRequest
from deerflow_web.errors import TusVersionMissing
from deerflow_web.errors import UnsupportedChunkType
from deerflow_web.models import ResumableUpload
from deerflow_web.services.uploads.resumable import CHECKSUM_ALGORITHMS
from deerflow_web.services.uploads.resumable import Checksum
from deerflow_web.services.uploads.resumable import ResumableUploadService
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.thread_access import thread_may_be_new
from deerflow_web.web.transport.request_body import WsgiBody
from deerflow_web.web.transport.request_body import request_body
from deerflow_web.web.wiring import get_services

bp = Blueprint("tus", __name__)

TUS_VERSION = "1.0.0"
TUS_EXTENSIONS = "creation,termination,checksum,expiration"
CHUNK_TYPE = "application/offset+octet-stream"
UPLOADS = "/threads/<thread_id>/uploads/tus"
UPLOAD = "/threads/<thread_id>/uploads/tus/<upload_id>"
_TUS_PATH = re.compile(r"/api/threads/[^/]+/uploads/tus(?:/|$)")


def _service() -> ResumableUploadService:
    return get_services().resumable


@bp.before_request
def check_version() -> None:
    """Refuse clients that do not speak tus 1.0.0."""
    if request.method != "OPTIONS" and request.headers.get("Tus-Resumable") != TUS_VERSION:
        raise TusVersionMissing()


@bp.after_app_request
def add_tus_headers(response: Response) -> Response:
    """Every tus response, errors too (routing's 404 and 405 among them), names the
    protocol version it speaks."""
    if not _TUS_PATH.match(request.path):
        return response
    response.headers["Tus-Resumable"] = TUS_VERSION
    if response.status_code == 412:
        response.headers["Tus-Version"] = TUS_VERSION
    return response


# The largest size or offset the database stores (a signed 64-bit column).
MAX_HEADER_NUMBER = 2**63 - 1


def _header_int(name: str) -> int:
    """A tus header's non-negative decimal number; 400 for anything else.

    Checked by length before it is converted: a number of thousands of digits is refused
    as too large, never handed to `int` (which refuses over 4,300 digits, and would spend
    its time on a value no upload can have).
    """
    raw = request.headers.get(name, "")
    if not raw.isascii() or not raw.isdigit():
        raise InvalidTusRequest(f"{name} must be a non-negative integer")
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(MAX_HEADER_NUMBER)) or int(digits) > MAX_HEADER_NUMBER:
        raise InvalidTusRequest(f"{name} is too large: at most {MAX_HEADER_NUMBER}")
    return int(digits)


def _progress_headers(upload: ResumableUpload) -> dict[str, str]:
    return {
        "Upload-Offset": str(upload.offset),
        "Upload-Expires": http_date(upload.expires_at),
    }


@bp.route(UPLOADS, methods=["OPTIONS"])
@thread_may_be_new
def server_options() -> ResponseReturnValue:
    """What this tus server supports."""
    headers = {
        "Tus-Version": TUS_VERSION,
        "Tus-Extension": TUS_EXTENSIONS,
        "Tus-Max-Size": str(_service().max_size),
        "Tus-Checksum-Algorithm": ",".join(CHECKSUM_ALGORITHMS),
    }
    return Response(status=204, headers=headers)


@bp.post(UPLOADS, provide_automatic_options=False)
@thread_may_be_new
def create_upload() -> ResponseReturnValue:
    """Start a resumable upload; the name and size are checked now, not at the end."""
    if "Upload-Defer-Length" in request.headers:
        raise InvalidTusRequest("Upload-Defer-Length is not supported: send Upload-Length")
    thread = current_thread()
    outcome = _service().create(
        thread, _header_int("Upload-Length"), request.headers.get("Upload-Metadata", "")
    )
    location = url_for(
        ".upload_status", thread_id=thread.thread_id, upload_id=outcome.upload.upload_id
    )
    headers = {"Location": location, **_progress_headers(outcome.upload)}
    return Response(status=201, headers=headers)


@bp.route(UPLOAD, methods=["HEAD"])
def upload_status(upload_id: str) -> ResponseReturnValue:
    """How many bytes the server has, so the client knows where to resume."""
    upload = _service().status(current_thread(), upload_id)
    headers = {
        **_progress_headers(upload),
        "Upload-Length": str(upload.length),
        "Cache-Control": "no-store",
    }
    if upload.metadata:
        headers["Upload-Metadata"] = upload.metadata
    return Response(status=200, headers=headers)


@bp.patch(UPLOAD)
def upload_chunk(upload_id: str) -> ResponseReturnValue:
    """Append one chunk, streamed to disk; the last one commits the file (still 204)."""
    if request.mimetype != CHUNK_TYPE:
        raise UnsupportedChunkType()
    offset = _header_int("Upload-Offset")
    header = request.headers.get("Upload-Checksum")
    checksum = Checksum.parse(header) if header else None
    length = request.content_length
    body = (
        request_body(request.environ, length)
        if length is not None
        else WsgiBody(request.stream, None)  # chunked: Werkzeug knows where it ends
    )
    outcome = _service().append(
        current_thread(),
        upload_id,
        offset=offset,
        body=body,
        content_length=length,
        checksum=checksum,
    )
    return Response(status=204, headers=_progress_headers(outcome.upload))


@bp.delete(UPLOAD)
def terminate_upload(upload_id: str) -> ResponseReturnValue:
    """Abandon an upload: its bytes go, and later requests for it answer 404."""
    _service().terminate(current_thread(), upload_id)
    return Response(status=204)
