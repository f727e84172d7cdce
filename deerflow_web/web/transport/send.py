"""How one file leaves: the artifact route and share links send it through here.

Conditional requests and `Range` are werkzeug's (`make_conditional`), with the ETag the
record vouches for, and the name and the sandbox CSP set the same way for every sender.
An upload on the S3 backend that this instance's copy lacks is sent from the bucket as it
arrives (`Artifact.in_bucket`), in werkzeug's own file wrapper rather than the server's:
gunicorn's cannot seek, so a `Range` request would read the object from its first byte,
while a seek on a bucket object is a ranged GET.
"""

from __future__ import annotations

from urllib.parse import quote

from flask import Response
from flask import request
from flask import send_file
from werkzeug.exceptions import RequestedRangeNotSatisfiable
from werkzeug.wsgi import FileWrapper

from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import StorageFailure
from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.freshness import open_artifact
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.objects.base import READ_CHUNK
from deerflow_web.storage.objects.base import ObjectFile
from deerflow_web.storage.paths import Thread
from deerflow_web.web.security import artifact_csp


def send_artifact(
    uploads: UploadService, thread: Thread, artifact: Artifact, *, attachment: bool
) -> Response:
    """The response that sends `artifact`, inline only when `attachment` is False.

    Raises:
        OSError: The file is gone or cannot be opened (the caller's 404).
        RequestedRangeNotSatisfiable: A `Range` outside the file.
    """
    checked = open_artifact(uploads, thread, artifact)
    response = send_file(
        checked.file,
        mimetype=artifact.response_type(attachment),
        conditional=False,  # below, with the size of the open file
        as_attachment=attachment,
        download_name=quote(artifact.name, safe=""),  # replaced below; a name may hold CR or LF
        etag=checked.etag,
        last_modified=checked.facts.mtime_ns / 1e9,
    )
    in_bucket = isinstance(checked.file, ObjectFile)
    if in_bucket:
        # werkzeug's wrapper seeks (see the module docstring), in the bucket's chunks.
        response.response = FileWrapper(checked.file, READ_CHUNK)
    response.content_length = checked.facts.size
    try:
        response = response.make_conditional(
            request, accept_ranges=True, complete_length=checked.facts.size
        )
    except RequestedRangeNotSatisfiable:
        checked.file.close()
        raise
    if in_bucket and request.method == "GET":
        _open_now(checked.file, response, artifact.name)
    kind = "attachment" if attachment else "inline"
    response.headers["Content-Disposition"] = (
        f"{kind}; filename*=UTF-8''{quote(artifact.name, safe='')}"
    )
    response.headers["Content-Security-Policy"] = artifact_csp(
        None if attachment else artifact.presentation
    )
    return response


def _open_now(file: ObjectFile, response: Response, name: str) -> None:
    """Ask the bucket for the bytes the response sends before its headers leave: an
    outage is then a 503 with `Retry-After`, not a body cut short."""
    if response.status_code == 206 and response.content_range is not None:
        file.seek(response.content_range.start or 0)
    elif response.status_code != 200:
        return  # 304, 412: nothing to send
    try:
        file.open_now()
    except ObjectNotFound as error:  # a record whose bytes are gone: not the client's fault
        file.close()
        raise StorageFailure(f"the stored bytes of {name} are missing from the bucket") from error
    except BaseException:
        file.close()
        raise
