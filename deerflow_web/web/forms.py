"""Flask-WTF forms of the HTML pages: every one carries a CSRF token.

The forms check only what HTML can get wrong (a missing field, an unknown choice); the
upload, rename and delete rules stay in `UploadService`, so a form can never accept what
the API refuses.
"""

from __future__ import annotations

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


class UploadForm(FlaskForm):
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


class DeleteForm(FlaskForm):
    """The names to delete (repeated `filenames` fields, as checkboxes send them).

    `confirmed` is set only by the confirmation step, so a bare post shows the names and
    asks first, with or without JavaScript.
    """

    filenames = SelectMultipleField(validate_choice=False)
    confirmed = HiddenField()


class RenameForm(FlaskForm):
    """One file's new name."""

    filename = HiddenField(validators=[InputRequired()])
    new_name = StringField(_l("New name"), validators=[DataRequired(_l("Enter a name."))])
    on_conflict = SelectField(
        _l("If a file with that name exists"),
        choices=rename_conflict_choices,
        default=OnConflict.REJECT.value,
    )


class ConvertForm(FlaskForm):
    """The document to convert (the Convert button's form when JavaScript is off)."""

    filename = HiddenField(validators=[DataRequired()])


class CsrfOnlyForm(FlaskForm):
    """A button that changes state (New thread) still needs a CSRF token."""
