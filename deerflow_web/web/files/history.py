"""The file manager's history pages (issue 27): a thread's trash, a file's versions, and
the "Undo" offered right after a delete.

Plain forms that post and redirect back with a flash message, as every page of the file
manager works without JavaScript; the rules are `services/history`'s.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from flask import Blueprint
from flask import flash
from flask import redirect
from flask import render_template
from flask import request
from flask import session
from flask import url_for
from flask.typing import ResponseReturnValue
from flask_babel import gettext as _
from flask_babel import ngettext

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import NameConflict
from deerflow_web.services.history.hooks import ThreadHistory
from deerflow_web.services.history.trash import RESTORE_CONFLICTS
from deerflow_web.services.history.trash import restore_conflict
from deerflow_web.services.history.versions import versioned_file
from deerflow_web.web.messages import describe_error
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("history", __name__)

UNDO_KEY = "undo_delete"  # the session's note of what the last delete put in the trash


def _history() -> ThreadHistory:
    return get_services().history


def remember_undo(thread_id: str, names: list[str]) -> None:
    """After a delete into the trash: offer "Undo" on the next page of this thread."""
    trash = _history().trash_bin
    if not trash.enabled:
        return
    thread = current_thread()
    wanted = set(names)
    newest: dict[str, str] = {}
    for entry in trash.list(thread):  # newest first: the entry this delete just made
        if entry.filename in wanted:
            newest.setdefault(entry.filename, entry.trash_id)
    ids = list(newest.values())
    if ids:
        session[UNDO_KEY] = {"thread_id": thread_id, "trash_ids": ids, "names": names}


def pop_undo(thread_id: str) -> dict | None:
    """The undo offer for this thread's page, shown once."""
    offer = session.get(UNDO_KEY)
    if not offer or offer.get("thread_id") != thread_id:
        return None
    session.pop(UNDO_KEY, None)
    return offer


def _to_trash(thread_id: str) -> ResponseReturnValue:
    return redirect(url_for("history.trash_page", thread_id=thread_id))


@bp.get("/threads/<thread_id>/trash")
def trash_page() -> str:
    """The thread's trash: restore or delete for good, each file or all of them."""
    thread = current_thread()
    trash = _history().trash_bin
    entries = trash.list(thread)
    return render_template(
        "pages/trash.html",
        thread_id=thread.thread_id,
        entries=[(entry, trash.expires_at(entry)) for entry in entries],
        days=trash.settings.trash_days,
        enabled=trash.enabled,
        conflicts=list(RESTORE_CONFLICTS),
        now=time.time(),
    )


@bp.post("/threads/<thread_id>/trash/restore")
def restore_from_trash() -> ResponseReturnValue:
    """Put the chosen entries back (the Trash page's Restore, and the Undo after a delete)."""
    thread = current_thread()
    thread_id = thread.thread_id
    trash = _history().trash_bin
    ids = [value for value in request.form.getlist("trash_ids") if value]
    try:
        on_conflict = restore_conflict(request.form.get("on_conflict") or None)
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
        return _to_trash(thread_id)
    restored: list[str] = []
    for trash_id in ids:
        try:
            restored.append(trash.restore(thread, trash_id, on_conflict).filename)
        except NameConflict as error:
            flash(
                _(
                    "%(name)s was not restored: a file of that name exists now. "
                    "Choose “Keep both” or “Replace” in the trash.",
                    name=error.name,
                ),
                "error",
            )
        except DeerFlowError as error:
            flash(describe_error(error, get_upload_service().limits), "error")
    if restored:
        flash(
            ngettext(
                "Restored %(num)d file: %(names)s",
                "Restored %(num)d files: %(names)s",
                len(restored),
                names=", ".join(restored),
            ),
            "success",
        )
    target = request.form.get("back")
    if target == "trash" or not restored:
        return _to_trash(thread_id)
    return redirect(url_for("pages.thread_files", thread_id=thread_id))


@bp.post("/threads/<thread_id>/trash/delete")
def delete_from_trash() -> ResponseReturnValue:
    """Delete the chosen entries for good."""
    thread = current_thread()
    trash = _history().trash_bin
    count = 0
    for trash_id in [value for value in request.form.getlist("trash_ids") if value]:
        try:
            trash.delete(thread, trash_id)
            count += 1
        except DeerFlowError as error:
            flash(describe_error(error, get_upload_service().limits), "error")
    if count:
        flash(
            ngettext("Deleted %(num)d file for good.", "Deleted %(num)d files for good.", count),
            "success",
        )
    return _to_trash(thread.thread_id)


@bp.post("/threads/<thread_id>/trash/empty")
def empty_trash() -> ResponseReturnValue:
    """Empty the thread's trash."""
    thread = current_thread()
    count = _history().trash_bin.empty(thread)
    flash(
        ngettext("Deleted %(num)d file for good.", "Deleted %(num)d files for good.", count),
        "success",
    )
    return _to_trash(thread.thread_id)


@bp.get("/threads/<thread_id>/versions/<filename>")
def versions_page(filename: str) -> ResponseReturnValue:
    """One upload's earlier versions: download or restore each."""
    thread = current_thread()
    file = versioned_file(f"/mnt/user-data/uploads/{filename}")
    try:
        versions = _history().versions.list(thread, file)
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
        return redirect(url_for("pages.thread_files", thread_id=thread.thread_id))
    record = get_upload_service().get_upload(thread, filename)
    return render_template(
        "pages/versions.html",
        thread_id=thread.thread_id,
        record=record,
        versions=versions,
        keep_last=_history().versions.settings.keep_last,
        download_base=(
            f"/api/threads/{quote(thread.thread_id, safe='')}/uploads/"
            f"{quote(filename, safe='')}/versions/"
        ),
    )


@bp.post("/threads/<thread_id>/versions/<filename>/restore")
def restore_version(filename: str) -> ResponseReturnValue:
    """Make the chosen version current again; the current one becomes a version."""
    thread = current_thread()
    version_id = request.form.get("version_id", "")
    try:
        file = versioned_file(f"/mnt/user-data/uploads/{filename}")
        _history().versions.restore(thread, file, version_id)
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
    else:
        flash(
            _(
                "Restored an earlier version of %(name)s. The version it replaced is kept "
                "among the versions.",
                name=filename,
            ),
            "success",
        )
    return redirect(url_for("history.versions_page", thread_id=thread.thread_id, filename=filename))
