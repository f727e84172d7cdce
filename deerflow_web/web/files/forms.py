"""Flask-WTF forms of the HTML pages: every one carries a CSRF token.

The forms check only what HTML can get wrong (a missing field, an unknown choice); the
upload, rename and delete rules stay in `UploadService`, so a form can never accept what
the API refuses.
"""

from __future__ import annotations

from flask import request
from flask_babel import lazy_gettext as _l
from flask_wtf import FlaskForm
from flask_wtf.file import FileRequired
from flask_wtf.file import MultipleFileField
from wtforms import HiddenField
from wtforms import SelectField
from wtforms import SelectMultipleField
from wtforms import StringField
from wtforms.validators import DataRequired
from wtforms.validators import InputRequired
from wtforms.validators import Length

from deerflow_web.models import OnConflict


def upload_conflict_choices() -> list[tuple[str, object]]:
    """What an upload does with a name that exists (SPEC D13), in words."""
    return [
        (OnConflict.REPLACE.value, _l("Replace the existing file")),
        (OnConflict.RENAME.value, _l("Keep both (number the new file)")),
        (OnConflict.REJECT.value, _l("Stop and upload nothing")),
    ]


def rename_conflict_choices() -> list[tuple[str, object]]:
    """What a rename does with a name that exists; refusing is the safe default."""
    return [
        (OnConflict.REJECT.value, _l("Do not rename")),
        (OnConflict.RENAME.value, _l("Keep both (number the new name)")),
        (OnConflict.REPLACE.value, _l("Replace the existing file")),
    ]


class PageForm(FlaskForm):
    """A form of the pages: it reads HTML form posts only.

    Flask-WTF also reads a JSON body as form data, and fails with a TypeError (a 500)
    when that body is not an object; no page posts JSON, so such a body is ignored and
    the form simply fails to validate.
    """

    class Meta(FlaskForm.Meta):
        def wrap_formdata(self, form: FlaskForm, formdata: object) -> object:
            if request and request.is_json and not request.form and not request.files:
                formdata = request.form  # empty: JSON never stands in for a form post
            return super().wrap_formdata(form, formdata)


class UploadForm(PageForm):
    """Several files at once, and what to do when a name is taken.

    Only rendered: the post is read as a stream by `save_form_files`, which checks the
    token and the choice itself (FileRequired still marks the input `required`).
    """

    files = MultipleFileField(_l("Files"), validators=[FileRequired(_l("Choose a file."))])
    on_conflict = SelectField(
        _l("If a file with the same name exists"),
        choices=upload_conflict_choices,
        default=OnConflict.REPLACE.value,
    )


class DeleteForm(PageForm):
    """The names to delete (repeated `filenames` fields, as checkboxes send them).

    `confirmed` is set only by the confirmation step, so a bare post shows the names and
    asks first, with or without JavaScript.
    """

    filenames = SelectMultipleField(validate_choice=False)
    confirmed = HiddenField()


class RenameForm(PageForm):
    """One file's new name."""

    filename = HiddenField(validators=[InputRequired()])
    new_name = StringField(_l("New name"), validators=[DataRequired(_l("Enter a name."))])
    on_conflict = SelectField(
        _l("If a file with that name exists"),
        choices=rename_conflict_choices,
        default=OnConflict.REJECT.value,
    )


class ConvertForm(PageForm):
    """The document to convert (the Convert button's form when JavaScript is off)."""

    filename = HiddenField(validators=[DataRequired()])


class ExtractForm(PageForm):
    """The archive to extract (the Extract button's form)."""

    filename = HiddenField(validators=[DataRequired()])


class ThreadTitleForm(PageForm):
    """A thread's title: asked by "New thread" (optional) and changed on the thread's page.

    The catalog applies the rules (one line, at most 256 characters); the length here
    only lets the browser say so first.
    """

    title = StringField(_l("Title"), validators=[Length(max=256)])


class DeleteThreadForm(PageForm):
    """Deleting a whole thread: the confirmation page posts `confirmed=yes`."""

    confirmed = HiddenField()


class CsrfOnlyForm(PageForm):
    """A button that changes state (New thread) still needs a CSRF token."""
