"""One table from domain errors to HTTP statuses; JSON under /api/, HTML pages elsewhere."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from typing import Any

from flask import Flask
from flask import render_template
from flask import request
from flask.typing import ResponseReturnValue
from gunicorn.http.errors import ParseException
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from deerflow_web.errors import AlreadyInitialized
from deerflow_web.errors import ArchiveMemberNotFound
from deerflow_web.errors import ArchiveMemberRefused
from deerflow_web.errors import ArchiveRefused
from deerflow_web.errors import ArtifactChanged
from deerflow_web.errors import ArtifactEditTooLarge
from deerflow_web.errors import ArtifactEditUnsupported
from deerflow_web.errors import ArtifactNotEditable
from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import ArtifactPrefixError
from deerflow_web.errors import AuthError
from deerflow_web.errors import ChecksumMismatch
from deerflow_web.errors import ConfigError
from deerflow_web.errors import ConversionError
from deerflow_web.errors import ConversionOverQuota
from deerflow_web.errors import ConversionQueueFull
from deerflow_web.errors import ConversionTimedOut
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import EmailTaken
from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import InfectedFile
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import InvalidEmail
from deerflow_web.errors import InvalidInput
from deerflow_web.errors import InvalidObjectKey
from deerflow_web.errors import InvalidOption
from deerflow_web.errors import InvalidPath
from deerflow_web.errors import InvalidQuota
from deerflow_web.errors import InvalidTusRequest
from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import LockedOut
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NoFilesProvided
from deerflow_web.errors import NotAFile
from deerflow_web.errors import NotAnArchive
from deerflow_web.errors import NotConvertible
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.errors import OffsetMismatch
from deerflow_web.errors import PastUploadLength
from deerflow_web.errors import PathTraversal
from deerflow_web.errors import PendingUploadsCap
from deerflow_web.errors import PermissionDenied
from deerflow_web.errors import QuotaExceeded
from deerflow_web.errors import RegistrationDisabled
from deerflow_web.errors import RequestTimedOut
from deerflow_web.errors import ResumableExpired
from deerflow_web.errors import ResumableNotFound
from deerflow_web.errors import ScannerUnavailable
from deerflow_web.errors import SelfDisable
from deerflow_web.errors import SelfReset
from deerflow_web.errors import ShareLinkNotFound
from deerflow_web.errors import ShareLinkRateLimited
from deerflow_web.errors import StorageFailure
from deerflow_web.errors import ThreadNotFound
from deerflow_web.errors import TokenNotFound
from deerflow_web.errors import TooLargeToScan
from deerflow_web.errors import TooManyFiles
from deerflow_web.errors import TotalTooLarge
from deerflow_web.errors import TrashEntryNotFound
from deerflow_web.errors import TusVersionMissing
from deerflow_web.errors import UnsafeFilename
from deerflow_web.errors import UnsafeFolder
from deerflow_web.errors import UnsupportedChunkType
from deerflow_web.errors import UploadBusy
from deerflow_web.errors import UploadNotFound
from deerflow_web.errors import UserNotFound
from deerflow_web.errors import VersionNotFound
from deerflow_web.errors import WeakPassword
from deerflow_web.errors import WrongPassword
from deerflow_web.storage.database import is_storage_full
from deerflow_web.storage.database import is_unavailable
from deerflow_web.web.transport.request_body import BodyTooSlow
from deerflow_web.web.transport.request_body import timed_out

logger = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[DeerFlowError], int] = {
    InvalidInput: 422,
    InvalidOption: 400,
    InvalidUserId: 400,
    NoFilesProvided: 400,
    MalformedUpload: 400,
    UnsafeFilename: 400,
    InvalidPath: 400,
    ArtifactPrefixError: 400,
    NotAFile: 400,
    NotConvertible: 400,
    PathTraversal: 403,
    UnsafeFolder: 403,
    UploadNotFound: 404,
    VersionNotFound: 404,
    TrashEntryNotFound: 404,
    ArtifactNotFound: 404,
    RequestTimedOut: 408,
    NameConflict: 409,
    TooManyFiles: 413,
    FileTooLarge: 413,
    TotalTooLarge: 413,
    QuotaExceeded: 413,  # the owner's storage quota (issue 27)
    InvalidQuota: 400,
    ConversionOverQuota: 413,
    ConversionError: 422,
    NotAnArchive: 400,
    ArchiveRefused: 422,
    ArchiveMemberRefused: 422,
    ArchiveMemberNotFound: 404,
    ConversionQueueFull: 429,
    StorageFailure: 500,
    ConfigError: 503,
    ConversionTimedOut: 504,
    InsufficientStorage: 507,
    # virus scanning: refused content is 422 (understood, and refused for what it holds),
    # a scanner that cannot answer 503 with Retry-After, a file it cannot take 413
    InfectedFile: 422,
    ScannerUnavailable: 503,
    TooLargeToScan: 413,
    # object storage (S3): out of reach for now is 503 with Retry-After, like the database
    ObjectStoreUnavailable: 503,
    ObjectNotFound: 404,
    InvalidObjectKey: 400,
    # tus 1.0.0 (SPEC 8)
    InvalidTusRequest: 400,
    PastUploadLength: 400,
    ResumableNotFound: 404,
    OffsetMismatch: 409,
    UploadBusy: 409,
    ResumableExpired: 410,
    PendingUploadsCap: 429,
    TusVersionMissing: 412,
    UnsupportedChunkType: 415,
    ChecksumMismatch: 460,
    ThreadNotFound: 404,
    AuthError: 401,  # not_authenticated, invalid_credentials, token_invalid, token_expired
    AlreadyInitialized: 409,
    SelfDisable: 409,  # a well-formed request the account's own state forbids
    SelfReset: 409,
    EmailTaken: 400,
    RegistrationDisabled: 403,
    UserNotFound: 404,
    WeakPassword: 400,
    InvalidEmail: 400,
    WrongPassword: 400,
    PermissionDenied: 403,
    TokenNotFound: 404,
    LockedOut: 429,
    ShareLinkNotFound: 404,  # unknown, expired and revoked alike
    ShareLinkRateLimited: 429,
    # artifact edits (SPEC 2.6)
    ArtifactNotEditable: 400,
    ArtifactChanged: 412,
    ArtifactEditTooLarge: 413,
    ArtifactEditUnsupported: 415,
}


NAME_TOO_LONG = "Name too long: a file or folder name is at most 255 bytes"
NUL_IN_NAME = "Names and paths may not contain a NUL byte"
DATABASE_UNAVAILABLE = "The database is unavailable; try again shortly"
DATABASE_RETRY_AFTER_SECONDS = 5
STORAGE_FULL = "Storage is full: nothing was changed; try again once space has been freed"
MALFORMED_BODY = "Malformed request body: the chunked transfer encoding is broken"


def client_fault(error: BaseException) -> str | None:
    """The message for a failure the request's own bytes caused, wherever it surfaced.

    A name the file system refuses (over 255 bytes, a NUL byte) or a broken chunked body
    is the client's doing, whichever route, service or wrapping error it reached: the
    whole chain of causes is searched, so no route needs its own check.
    """
    for seen in causes(error):
        if isinstance(seen, OSError) and seen.errno == errno.ENAMETOOLONG:
            return NAME_TOO_LONG
        if isinstance(seen, ValueError) and "null" in str(seen) and "embedded" in str(seen):
            return NUL_IN_NAME  # os and pathlib: "embedded null byte/character"
        if isinstance(seen, ParseException):
            return MALFORMED_BODY  # gunicorn reading a body: bad chunk size, missing CRLF
    return None


def causes(error: BaseException) -> Iterator[BaseException]:
    """The error, then what caused it, and so on: a fault deep in a library reaches the
    handlers wrapped in whatever the layers above raised."""
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def body_too_slow(error: BaseException) -> BodyTooSlow | None:
    """The worker's cut of a body that came too slowly, anywhere in the chain of causes
    (Werkzeug's form parsing turns it into a 400 "client disconnected")."""
    return next((seen for seen in causes(error) if isinstance(seen, BodyTooSlow)), None)


def storage_full(error: BaseException) -> bool:
    """Whether the database could not write for lack of disk space, anywhere in the chain
    of causes: 507, like a file that does not fit, not 503 (the database is there)."""
    return any(is_storage_full(seen) for seen in causes(error))


def database_unreachable(error: BaseException) -> bool:
    """Whether the failure is the database being out of reach (a restart, a failover, a
    network cut), anywhere in the chain of causes: the request may simply be retried."""
    return any(is_unavailable(seen) for seen in causes(error))


def status_for(error: DeerFlowError) -> int:
    """The status of the most specific class in the table (500 if none matches)."""
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


def validation_detail(error: InvalidInput) -> list[dict[str, Any]]:
    """DeerFlow's (FastAPI's) list-shaped 422 `detail` for request validation errors."""
    value = (
        error.value if error.value is None or isinstance(error.value, str) else repr(error.value)
    )
    return [{"type": error.kind, "loc": list(error.location), "msg": str(error), "input": value}]


def register_error_handlers(app: Flask) -> None:
    """Register app-level handlers; blueprint handlers never see routing 404/405."""

    @app.errorhandler(DeerFlowError)
    def handle_domain_error(error: DeerFlowError) -> ResponseReturnValue:
        status = status_for(error)
        if status >= 500 and (fault := client_fault(error)) is not None:
            return render_error(400, fault)
        if status >= 500:
            logger.error("request failed: %s", error, exc_info=error)
        if isinstance(error, InvalidInput) and _wants_json():
            return {"detail": validation_detail(error)}, 422
        if isinstance(error, AuthError) and _wants_json():
            return {"detail": {"code": error.code, "message": str(error)}}, status
        headers = []
        if isinstance(
            error,
            ConversionQueueFull
            | LockedOut
            | ScannerUnavailable
            | ShareLinkRateLimited
            | ObjectStoreUnavailable,
        ):
            headers.append(("Retry-After", str(error.retry_after)))
        if not _wants_json() or request.headers.get(PAGE_SCRIPT_HEADER):
            return render_error(status, _for_a_person(error), headers)
        return render_error(status, str(error), headers)

    @app.errorhandler(HTTPException)  # routing 404/405, 413 from the server, CSRF, 416
    def handle_http_error(error: HTTPException) -> ResponseReturnValue:
        if (slow := body_too_slow(error)) is not None:  # Werkzeug's "client disconnected"
            return render_error(408, str(timed_out(slow)))
        status = error.code or 500
        message = (
            HTTP_STATUS_CODES.get(status, "Error") if status in (404, 405) else error.description
        )
        headers = [(k, v) for k, v in error.get_headers() if k.lower() != "content-type"]
        if not _wants_json():
            message = _http_sentence(status, error) or message
        return render_error(status, message, headers)

    @app.errorhandler(Exception)
    def handle_unexpected(error: Exception) -> ResponseReturnValue:
        if (fault := client_fault(error)) is not None:
            return render_error(400, fault)
        if (slow := body_too_slow(error)) is not None:
            return render_error(408, str(timed_out(slow)))
        if storage_full(error):
            logger.warning("request failed: storage full: %s", error)
            return render_error(507, STORAGE_FULL)
        if database_unreachable(error):
            logger.warning("request failed: database unreachable: %s", error)
            return render_error(
                503, DATABASE_UNAVAILABLE, [("Retry-After", str(DATABASE_RETRY_AFTER_SECONDS))]
            )
        logger.exception("unhandled error")
        return render_error(500, "Internal server error")


# Sent by our pages' own scripts (static/common.js): the `detail` they get is shown to a
# person, so it comes as a sentence in the page's language. Other clients (DeerFlow's) keep
# the API's own English text.
PAGE_SCRIPT_HEADER = "X-DeerFlow-Page"


def _http_sentence(status: int, error: HTTPException) -> str | None:
    """What a page says for an HTTP error of the framework, in the reader's language."""
    from flask_babel import gettext as _

    if status == 400 and "CSRF" in (error.description or ""):
        return _("This form has expired. Go back, reload the page and try again.")
    sentences = {
        404: lambda: _("This page or file does not exist."),
        405: lambda: _("This address does not accept that kind of request."),
        413: lambda: _("This is more than the server accepts in one request."),
        429: lambda: _("Too many requests. Wait a moment and try again."),
    }
    sentence = sentences.get(status)
    return sentence() if sentence else None


def _for_a_person(error: DeerFlowError) -> str:
    from deerflow_web.web.messages import describe_error
    from deerflow_web.web.wiring import get_upload_service

    try:
        return describe_error(error, get_upload_service().limits)
    except Exception:  # noqa: BLE001 - an error page must never fail on its own words
        return str(error)


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def render_error(status: int, message: str | None, headers: Any = None) -> ResponseReturnValue:
    """`{"detail": ...}` for the API, an HTML page for people."""
    text = message or HTTP_STATUS_CODES.get(status, "Unknown Error")
    if _wants_json():
        return {"detail": text}, status, headers or []
    return render_template("errors/error.html", status=status, message=text), status, headers or []
