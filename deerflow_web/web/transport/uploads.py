"""The one upload entry point of the web layer: read a request's multipart body as it
streams in and hand its files to the upload intake (save, then automatic conversion).

The JSON API calls `receive_uploads`; the file manager's and the chat preview's forms call
`save_form_files`, which runs the same two steps (`open_upload_request`, `accept_uploads`)
with the CSRF check in between and reports in flash messages.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from collections.abc import Mapping

from flask import current_app
from flask import flash
from flask import request
from flask_babel import gettext as _
from flask_babel import ngettext
from flask_wtf import FlaskForm
from werkzeug.datastructures import ImmutableMultiDict

from deerflow_web.errors import InvalidOption
from deerflow_web.errors import MissingFilesField
from deerflow_web.errors import UploadError
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.services.uploads.intake import AcceptedUploads
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.web.extensions import csrf
from deerflow_web.web.messages import describe_error
from deerflow_web.web.transport.multipart import multipart_reader
from deerflow_web.web.transport.multipart import upload_body_limit
from deerflow_web.web.wiring import get_services

# What a multipart body may hold besides its files' bytes (boundaries, part headers, form
# fields), so the early quota check never refuses a body whose files would fit.
MULTIPART_FRAMING_SLACK = 64 * 1024
# Bodies from this size are checked against the quota before they are read.
EARLY_QUOTA_CHECK_BYTES = 1024 * 1024


class NoFileChosen(Exception):
    """A form was posted without a file: no `files` part, or one nameless part."""


def receive_uploads(thread: ThreadFolders) -> AcceptedUploads:
    """Read the request's files and save them; convert them when the settings say so.

    Raises:
        MissingFilesField: the body has no `files` part.
        UploadError, InvalidOption: nothing was written.
    """
    fields, files = open_upload_request()
    return accept_uploads(thread, fields, files)


def open_upload_request(
    *, from_form: bool = False
) -> tuple[Mapping[str, str], Iterator[IncomingFile]]:
    """Read the body up to its first file; return the fields sent before it and the files.

    A form's CSRF token is checked on those fields, so before a byte of any file is
    written, and even when the body has no file. Errors raised here come before the token
    could be checked.

    Raises:
        MissingFilesField: the body has no `files` part.
        NoFileChosen: (forms) the file input was empty.
    """
    fields: Mapping[str, str] = {}
    try:
        reader = multipart_reader(request, _body_limit())
        fields = reader.fields  # filled as the body is read
        parts = iter(reader)
        first = next(parts)
    except MissingFilesField:
        if from_form:
            _check_form_fields(fields)
        raise
    if from_form:
        _check_form_fields(fields)
        if not first.filename:  # an empty file input sends one nameless part
            raise NoFileChosen
    return fields, itertools.chain([first], parts)


def accept_uploads(
    thread: ThreadFolders, fields: Mapping[str, str], files: Iterator[IncomingFile]
) -> AcceptedUploads:
    """Stream `files` into the upload intake; `on_conflict` from the query or the fields."""
    field = OnConflict.named(fields.get("on_conflict"), OnConflict.REPLACE)
    on_conflict = OnConflict.named(request.args.get("on_conflict"), field)  # the query wins
    _refuse_over_quota(thread, on_conflict)
    return get_services().intake.accept(thread, files, on_conflict=on_conflict)


def _refuse_over_quota(thread: ThreadFolders, on_conflict: OnConflict) -> None:
    """413 before a file byte is read when the declared body (of 1 MiB or more) cannot fit
    in the owner's quota, less its multipart framing and, for `replace`, what the thread's
    files could free (the commit decides exactly, `UploadService._commit`)."""
    uploads = get_services().uploads
    length = request.content_length
    if uploads.quotas is None or length is None or length < EARLY_QUOTA_CHECK_BYTES:
        return  # a small body costs less to read than the look: the commit decides

    def replaceable() -> int:
        if on_conflict is not OnConflict.REPLACE:
            return 0
        return sum(record.size for record in uploads.records_of(thread))

    uploads.quotas.refuse_early(thread.ref.user_id, length - MULTIPART_FRAMING_SLACK, replaceable)


def flash_form_errors(form: FlaskForm) -> None:
    """Every validation message of a form, as error flashes."""
    for errors in form.errors.values():
        for message in errors:
            flash(str(message), "error")


def save_form_files(thread: ThreadFolders) -> list[str]:
    """Store the files of an upload form as they stream in; return the names stored (none
    on any failure).

    Werkzeug's form parser would first spool every file to a temporary file for the upload
    service to copy again, and CSRFProtect runs that parser to find the token. So the
    upload views are exempt from CSRFProtect and read the body with the API's streaming
    reader: the templates put the token and the conflict choice before the file input, so
    the token is checked before a byte of any file is written. A post whose token comes
    only after its files is refused as one without a token. Errors found before the token
    could be checked answer with an error page, not a flash, so a cross-site post cannot
    even leave a message in the person's session.
    """
    try:
        fields, files = open_upload_request(from_form=True)
    except (MissingFilesField, NoFileChosen):
        flash(_("Choose a file."), "error")
        return []
    try:
        accepted = accept_uploads(thread, fields, files)
    except (UploadError, InvalidOption) as error:
        flash(describe_error(error, get_services().uploads.limits), "error")
        return []
    result = accepted.result
    count = len(result.files)
    flash(ngettext("Uploaded %(num)d file.", "Uploaded %(num)d files.", count), "success")
    if result.skipped_files:
        names = ", ".join(result.skipped_files)
        flash(_("Skipped because the name is unsafe: %(names)s", names=names), "error")
    for rejected in result.rejected_files:  # the page escapes controls in the name
        flash(
            _(
                "Not uploaded: “%(name)s”. %(reason)s.",
                name=rejected.filename,
                reason=rejected.reason,
            ),
            "error",
        )
    return [saved.record.filename for saved in result.files]


def _check_form_fields(fields: Mapping[str, str]) -> None:
    """Run CSRFProtect's own check on the fields sent before the files.

    It looks for the token in `request.form`; setting that to these fields keeps Werkzeug
    from parsing the rest of the body to build it. A failed check raises CSRFError (400).
    """
    if current_app.config["WTF_CSRF_ENABLED"]:
        request.form = ImmutableMultiDict(fields)
        csrf.protect()


def _body_limit() -> int:
    """Every byte of an upload body counts: file data, fields, part headers."""
    limits = get_services().uploads.limits
    return upload_body_limit(limits.max_total_size, current_app.config.get("MAX_CONTENT_LENGTH"))
