"""Files sent through an HTML form (the file manager's and the chat preview's), stored and
reported to the person in flash messages."""

from __future__ import annotations

from flask import flash
from flask_babel import gettext as _
from flask_babel import ngettext
from flask_wtf import FlaskForm

from deerflow_web.errors import UploadError
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.web.messages import describe_error
from deerflow_web.web.wiring import current_user_id
from deerflow_web.web.wiring import get_upload_service


def flash_form_errors(form: FlaskForm) -> None:
    """Every validation message of a form, as error flashes."""
    for errors in form.errors.values():
        for message in errors:
            flash(str(message), "error")


def save_form_files(thread_id: str, form: FlaskForm) -> list[str]:
    """Store a submitted form's `files`; return the names stored (none on any failure).

    The form's `on_conflict` choice applies when it has one; without it, an existing
    name is replaced, as on the JSON API.
    """
    if not form.validate_on_submit():
        flash_form_errors(form)
        return []
    service = get_upload_service()
    incoming = [IncomingFile(f.filename or "", f.stream) for f in form.files.data]
    choice = getattr(form, "on_conflict", None)
    on_conflict = OnConflict(choice.data) if choice is not None else OnConflict.REPLACE
    try:
        result = service.save_uploads(
            thread_id, incoming, on_conflict=on_conflict, user_id=current_user_id()
        )
    except UploadError as error:
        flash(describe_error(error, service.limits), "error")
        return []
    count = len(result.files)
    flash(ngettext("Uploaded %(num)d file.", "Uploaded %(num)d files.", count), "success")
    if result.skipped_files:
        names = ", ".join(result.skipped_files)
        flash(_("Skipped because the name is unsafe: %(names)s", names=names), "error")
    return [saved.record.filename for saved in result.files]
