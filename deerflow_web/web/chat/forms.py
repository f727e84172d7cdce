"""Flask-WTF forms of the chat preview page; every one carries a CSRF token.

The forms check only what HTML can get wrong (an unknown mode, an oversized message). Which
attached names count is the middleware's rule (`services/prompt/turn.py`), so the
attachment list is not validated against the thread's files here.
"""

from __future__ import annotations

from flask_babel import lazy_gettext as _l
from flask_wtf.file import FileRequired
from flask_wtf.file import MultipleFileField
from wtforms import BooleanField
from wtforms import IntegerField
from wtforms import SelectField
from wtforms import SelectMultipleField
from wtforms import StringField
from wtforms import TextAreaField
from wtforms.validators import Length
from wtforms.validators import NumberRange
from wtforms.validators import Optional

from deerflow_web.web.files.forms import PageForm

# Form fields are read into memory (MAX_FORM_MEMORY_SIZE is 64 KiB); a Chinese character
# takes 3 bytes in UTF-8, so this stays well inside the limit.
MAX_MESSAGE_CHARS = 20_000


def mode_choices() -> list[tuple[str, object]]:
    """The two injection modes of SPEC D11, in words."""
    return [
        ("current", _l("Current: announce the files attached to this message")),
        ("incremental", _l("Incremental: announce every upload not shown in an earlier turn")),
    ]


class ChatPreviewForm(PageForm):
    """A message, the files attached to it and the injection mode."""

    message = TextAreaField(
        _l("Message"),
        validators=[Length(max=MAX_MESSAGE_CHARS, message=_l("The message is too long."))],
    )
    attach = SelectMultipleField(_l("Attach files"), validate_choice=False)
    mode = SelectField(_l("Injection mode"), choices=mode_choices, default="current")
    vision = BooleanField(_l("The model accepts pictures"))


class ChatUploadForm(PageForm):
    """New files for the thread, attached to the next message once stored.

    Only rendered: the post is read as a stream by `save_form_files`.
    """

    files = MultipleFileField(_l("Files"), validators=[FileRequired(_l("Choose a file."))])


def tool_choices() -> list[tuple[str, object]]:
    """The file tools whose answers the tools panel shows."""
    return [("read_file", "read_file"), ("grep", "grep"), ("view_image", "view_image")]


class ToolPreviewForm(PageForm):
    """A `read_file` or `grep` call to run as the agent would.

    The path and pattern are not judged here: what the tool answers to a bad one is
    exactly what the panel is for.
    """

    tool = SelectField(_l("Tool"), choices=tool_choices, default="read_file")
    path = SelectField(_l("File"), validate_choice=False)
    start_line = IntegerField(
        _l("From line"), validators=[Optional(), NumberRange(min=1, max=10**9)]
    )
    end_line = IntegerField(_l("To line"), validators=[Optional(), NumberRange(min=1, max=10**9)])
    pattern = StringField(_l("Pattern (grep)"), validators=[Length(max=1000)])
