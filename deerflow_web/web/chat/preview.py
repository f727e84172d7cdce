"""The chat preview page: what the model would receive for a message in this thread.

A person composes a message, attaches files of the thread (or uploads new ones inline)
and picks the injection mode; the page shows the final message content, the state the
uploads middleware writes and what `list_uploaded_files` returns now, turn after turn.
The answers come from `services/prompt/chat_preview.py`, which runs the functions the LangChain
side runs; this module never imports the agent package (STYLE, import direction).
Everything works without JavaScript (post, redirect, get).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from flask import Blueprint
from flask import flash
from flask import redirect
from flask import render_template
from flask import request
from flask import url_for
from flask.typing import ResponseReturnValue
from flask_babel import ngettext

from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import UploadRecord
from deerflow_web.services.files.listing import build_listing
from deerflow_web.services.prompt.chat_preview import PreviewTurn
from deerflow_web.services.prompt.tool_preview import ToolPreview
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.web.chat.forms import ChatPreviewForm
from deerflow_web.web.chat.forms import ChatUploadForm
from deerflow_web.web.chat.forms import ToolPreviewForm
from deerflow_web.web.extensions import csrf
from deerflow_web.web.files.forms import CsrfOnlyForm
from deerflow_web.web.marks import thread_may_be_new
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.transport.uploads import save_form_files
from deerflow_web.web.wiring import get_chat_preview_service
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_tool_preview_service
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("chat", __name__)


@bp.app_template_filter("pretty_json")
def pretty_json(value: Any) -> str:
    """Indented JSON with non-ASCII kept readable (Jinja escapes it for HTML)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def _back(thread_id: str, **args: Any) -> ResponseReturnValue:
    return redirect(url_for("chat.chat_preview", thread_id=thread_id, **args))


def _selected(turns: Sequence[PreviewTurn], turn_id: int | None) -> int | None:
    """The index of the turn to show: the one asked for, else the latest."""
    for index, turn in enumerate(turns):
        if turn.turn_id == turn_id:
            return index
    return len(turns) - 1 if turns else None


def _vision_default(turns: Sequence[PreviewTurn]) -> bool:
    """Tick "the model accepts pictures" as the last turn did, else as `agent.vision`
    says (`auto` cannot ask a model here, so it starts unticked)."""
    if turns:
        return turns[-1].vision
    return get_services().settings.agent.vision is True


def _tool_form(records: Sequence[UploadRecord], form: ToolPreviewForm | None) -> ToolPreviewForm:
    """The tools panel's form, offering the thread's uploads and the whole folder."""
    form = form or ToolPreviewForm(formdata=None)
    form.path.choices = [(record.virtual_path, record.filename) for record in records]
    form.path.choices.append((VIRTUAL_UPLOADS_DIR, f"{VIRTUAL_UPLOADS_DIR}/"))
    return form


def _render(
    thread: ThreadFolders,
    form: ChatPreviewForm,
    turns: list[PreviewTurn],
    status: int = 200,
    *,
    tool_form: ToolPreviewForm | None = None,
    tool_preview: ToolPreview | None = None,
) -> ResponseReturnValue:
    records = get_upload_service().list_uploads(thread)
    index = _selected(turns, request.args.get("turn", type=int))
    selected = turns[index] if index is not None else None
    pictures = []
    if selected is not None and selected.pictures:
        pictures = get_chat_preview_service().pictures(thread, selected)
    page = render_template(
        "pages/chat_preview.html",
        thread_id=thread.thread_id,
        form=form,
        upload_form=ChatUploadForm(formdata=None),
        clear_form=CsrfOnlyForm(formdata=None),
        tool_form=_tool_form(records, tool_form),
        tool_preview=tool_preview,
        groups=build_listing(records).groups,
        turns=turns,
        index=index,
        selected=selected,
        pictures=pictures,
        vision_setting=get_services().settings.agent.vision,
        scanning_on=get_upload_service().scanner is not None,
    )
    return page, status


@bp.get("/threads/<thread_id>/chat")
@thread_may_be_new
def chat_preview() -> ResponseReturnValue:
    """Show the compose form, the selected turn's result and the history of turns."""
    thread = current_thread()
    turns = get_chat_preview_service().history(thread)
    form = ChatPreviewForm(
        formdata=None,
        mode=turns[-1].mode if turns else "current",  # stepping through a mode is the usual
        attach=request.args.getlist("attach"),
        vision=_vision_default(turns),
    )
    return _render(thread, form, turns)


@bp.post("/threads/<thread_id>/chat")
@thread_may_be_new
def preview_message() -> ResponseReturnValue:
    """Preview the composed message as the next turn, then show it; a first turn in a
    thread the caller does not have yet makes it theirs, as a first upload does."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = ChatPreviewForm()
    service = get_chat_preview_service()
    if not form.validate_on_submit():
        # Render instead of redirecting, so what the person typed is not lost.
        return _render(thread, form, service.history(thread), 422)
    # Browsers send a textarea's line breaks as CRLF; a chat client sends "\n".
    text = (form.message.data or "").replace("\r\n", "\n")
    attached = [name for name in form.attach.data or [] if name]
    turn = service.preview(thread, text, attached, form.mode.data, vision=bool(form.vision.data))
    get_services().threads.create(thread.ref.user_id, thread_id)  # after it succeeded
    return _back(thread_id, turn=turn.turn_id, _anchor="result")


@bp.post("/threads/<thread_id>/chat/tools")
@thread_may_be_new
def preview_tool() -> ResponseReturnValue:
    """Show what `read_file`, `grep` or `view_image` returns to the model for the chosen file."""
    thread = current_thread()
    turns = get_chat_preview_service().history(thread)
    compose = ChatPreviewForm(
        formdata=None,
        mode=turns[-1].mode if turns else "current",
        vision=_vision_default(turns),
    )
    form = ToolPreviewForm()
    if not form.validate_on_submit():
        return _render(thread, compose, turns, 422, tool_form=form)
    service = get_tool_preview_service()
    path = form.path.data or VIRTUAL_UPLOADS_DIR
    if form.tool.data == "grep":
        preview = service.grep(thread, form.pattern.data or "", path)
    elif form.tool.data == "view_image":
        preview = service.view_image(thread, path)
    else:
        preview = service.read_file(thread, path, form.start_line.data, form.end_line.data)
    return _render(thread, compose, turns, tool_form=form, tool_preview=preview)


@bp.post("/threads/<thread_id>/chat/upload")
@thread_may_be_new
@csrf.exempt  # save_form_files checks the token itself, without spooling the files
def upload_files() -> ResponseReturnValue:
    """Store new files in the thread and come back with them attached to the message."""
    thread = current_thread()
    return _back(thread.thread_id, attach=save_form_files(thread))


@bp.post("/threads/<thread_id>/chat/clear")
def clear_history() -> ResponseReturnValue:
    """Forget the thread's previewed turns (the uploads stay)."""
    thread = current_thread()
    thread_id = thread.thread_id
    if CsrfOnlyForm().validate_on_submit():
        count = get_chat_preview_service().clear(thread)
        flash(
            ngettext("Cleared %(num)d previewed turn.", "Cleared %(num)d previewed turns.", count),
            "success",
        )
    return _back(thread_id)
