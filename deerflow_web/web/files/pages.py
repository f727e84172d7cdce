"""Server-rendered pages for people: the threads index, the file manager and previews.

Every page works without JavaScript (forms post, the server redirects back with a flash
message); `static/upload.js` and `static/files.js` only make the same actions smoother.
Views unwrap the request, call a service and render; the rules live in the services.
"""

from __future__ import annotations

import time
from functools import partial

from flask import Blueprint
from flask import abort
from flask import flash
from flask import make_response
from flask import redirect
from flask import render_template
from flask import request
from flask import url_for
from flask.typing import ResponseReturnValue
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_babel import ngettext
from markupsafe import Markup

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.models import OnConflict
from deerflow_web.models import validate_thread_id
from deerflow_web.services.files.artifact_edit import open_for_edit
from deerflow_web.services.files.artifacts import Presentation
from deerflow_web.services.files.browse import BROWSABLE_AREAS
from deerflow_web.services.files.browse import list_area
from deerflow_web.services.files.list_query import REMEMBERED
from deerflow_web.services.files.list_query import ListQuery
from deerflow_web.services.files.listing import SortKey
from deerflow_web.services.files.listing import build_listing
from deerflow_web.services.files.markdown_render import MAX_RENDER_BYTES
from deerflow_web.services.files.preview import PREVIEW_BYTES
from deerflow_web.services.files.preview import build_preview
from deerflow_web.services.prompt.outline import upload_outline
from deerflow_web.services.scanning.events import quarantined_in
from deerflow_web.services.threads.catalog import clean_title
from deerflow_web.services.threads.overview import list_threads
from deerflow_web.services.uploads.bulk_delete import delete_uploads
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.web import helpers
from deerflow_web.web.errors import status_for
from deerflow_web.web.extensions import csrf
from deerflow_web.web.files import history
from deerflow_web.web.files.forms import ConvertForm
from deerflow_web.web.files.forms import DeleteForm
from deerflow_web.web.files.forms import DeleteThreadForm
from deerflow_web.web.files.forms import ExtractForm
from deerflow_web.web.files.forms import RenameForm
from deerflow_web.web.files.forms import ThreadTitleForm
from deerflow_web.web.files.forms import UploadForm
from deerflow_web.web.i18n import LANG_COOKIE
from deerflow_web.web.i18n import LANGUAGES
from deerflow_web.web.marks import public
from deerflow_web.web.marks import thread_may_be_new
from deerflow_web.web.messages import describe_error
from deerflow_web.web.security import safe_next
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.transport.uploads import flash_form_errors
from deerflow_web.web.transport.uploads import save_form_files
from deerflow_web.web.wiring import current_owner
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("pages", __name__)

# What the share box offers (hours, label); the service takes any whole hour up to 30 days.
SHARE_LIFETIMES = (
    (1, _l("1 hour")),
    (8, _l("8 hours")),
    (24, _l("1 day")),
    (72, _l("3 days")),
    (168, _l("7 days")),
    (720, _l("30 days")),
)

LANG_COOKIE_AGE = 365 * 24 * 3600
LIST_VIEW_COOKIE = "files-view"  # the list's sort, order and view, kept across visits


def _back_to_thread(thread_id: str) -> ResponseReturnValue:
    """Post/redirect/get: every form of the file manager lands back on the list."""
    return redirect(url_for("pages.thread_files", thread_id=thread_id))


@bp.get("/")
def index() -> str:
    """List the caller's threads, newest change first, with their titles; `q` searches
    titles and ids."""
    query = request.args.get("q", "").strip()
    threads = list_threads(
        get_services().threads, get_upload_service().records, current_owner(), query=query
    )
    return render_template(
        "pages/index.html", threads=threads, query=query, new_form=ThreadTitleForm(formdata=None)
    )


@bp.post("/threads")
def new_thread() -> ResponseReturnValue:
    """Start a thread with a fresh id and the title asked for, and open it."""
    form = ThreadTitleForm()
    if not form.validate_on_submit():
        flash_form_errors(form)
        return redirect(url_for("pages.index"))
    try:
        title = clean_title(form.title.data, ("form", "title"))
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
        return redirect(url_for("pages.index"))
    record, _created = get_services().threads.create(current_owner(), title=title)
    flash(_("New thread created. Upload files to get started."), "success")
    return _back_to_thread(record.thread_id)


@bp.post("/threads/<thread_id>/title")
def rename_thread() -> ResponseReturnValue:
    """Change the thread's title (an empty one removes it)."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = ThreadTitleForm()
    if not form.validate_on_submit():
        flash_form_errors(form)
        return _back_to_thread(thread_id)
    try:
        title = clean_title(form.title.data, ("form", "title"))
        get_services().threads.update(thread, title=title, set_title=True)
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
        return _back_to_thread(thread_id)
    flash(_("Title saved.") if title else _("Title removed."), "success")
    return _back_to_thread(thread_id)


@bp.get("/threads/<thread_id>/delete-thread")
def confirm_delete_thread() -> str:
    """Ask before deleting a whole thread (the index's Delete link lands here)."""
    thread = current_thread()
    thread_id = thread.thread_id
    record = get_services().threads.get(thread)
    return render_template(
        "pages/confirm_delete_thread.html",
        thread_id=thread_id,
        thread=record,
        form=DeleteThreadForm(formdata=None),
    )


@bp.post("/threads/<thread_id>/delete-thread")
def delete_thread() -> ResponseReturnValue:
    """Delete the thread with all its files once confirmed; otherwise ask first."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = DeleteThreadForm()
    if not form.validate_on_submit() or form.confirmed.data != "yes":
        return redirect(url_for("pages.confirm_delete_thread", thread_id=thread_id))
    get_services().threads.delete(thread)
    get_services().share_links.forget_thread(thread.ref)
    flash(_("Deleted thread %(id)s and all its files.", id=thread_id), "success")
    return redirect(url_for("pages.index"))


@bp.get("/open")
def open_thread() -> ResponseReturnValue:
    """Open a thread by the id a person typed (the index's form sends it here)."""
    thread_id = request.args.get("thread_id", "").strip()
    try:
        validate_thread_id(thread_id)
    except InvalidThreadId:
        flash(_("Thread ids use 1-64 letters, digits, hyphens or underscores."), "error")
        return redirect(url_for("pages.index"))
    return _back_to_thread(thread_id)


@bp.get("/threads/<thread_id>")
@thread_may_be_new
def thread_files() -> ResponseReturnValue:
    """The file manager: upload form, the uploads list and the area tabs."""
    thread = current_thread()
    thread_id = thread.thread_id
    service = get_upload_service()
    query = ListQuery.from_request(request.args, request.cookies.get(LIST_VIEW_COOKIE))
    records = service.list_uploads(thread)
    listing = build_listing(
        records,
        query=query.q,
        kind=query.kind,
        sort=query.sort,
        descending=query.descending,
        page=query.page,
    )
    page = render_template(
        "pages/thread_files.html",
        thread_id=thread_id,
        thread=get_services().threads.find(thread),
        title_form=ThreadTitleForm(formdata=None),
        area=Area.UPLOADS,
        listing=listing,
        query=query,
        sort_keys=list(SortKey),
        limits=service.limits,
        resumable_threshold=get_services().settings.resumable.threshold_bytes,
        upload_form=UploadForm(),
        delete_form=DeleteForm(),
        rename_form=RenameForm(),
        quarantined=quarantined_in(get_services().scan_events, thread.scope),
        scanning_on=service.scanner is not None,
        share_links=get_services().share_links.list_for_thread(thread.ref),
        share_lifetimes=SHARE_LIFETIMES,
        now=time.time(),
        undo=history.pop_undo(thread_id),
        trash_count=len(get_services().history.trash_bin.list(thread)),
    )
    response = make_response(page)
    if any(key in request.args for key in REMEMBERED):  # a choice made now: keep it
        response.set_cookie(
            LIST_VIEW_COOKIE, query.remembered(), max_age=LANG_COOKIE_AGE, samesite="Lax"
        )
    return response


@bp.post("/threads/<thread_id>/upload")
@thread_may_be_new
@csrf.exempt  # save_form_files checks the token itself, without spooling the files
def upload_files() -> ResponseReturnValue:
    """Store the form's files (the no-JavaScript path; scripts use the JSON API)."""
    thread = current_thread()
    thread_id = thread.thread_id
    save_form_files(thread)
    return _back_to_thread(thread_id)


@bp.get("/threads/<thread_id>/delete")
def confirm_delete() -> str:
    """Ask before deleting the named files (a row's Delete link lands here)."""
    thread = current_thread()
    thread_id = thread.thread_id
    filenames = [name for name in request.args.getlist("filenames") if name]
    if not filenames:
        abort(400, _("No file was named."))
    return render_template(
        "pages/confirm_delete.html", thread_id=thread_id, filenames=filenames, form=DeleteForm()
    )


@bp.post("/threads/<thread_id>/delete")
def delete_files() -> ResponseReturnValue:
    """Delete the selected files once confirmed; an unconfirmed post shows what it would do."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = DeleteForm()
    filenames = [name for name in form.filenames.data or [] if name]
    if not filenames:
        flash(_("Select at least one file to delete."), "error")
        return _back_to_thread(thread_id)
    if form.confirmed.data != "yes":
        return render_template(
            "pages/confirm_delete.html", thread_id=thread_id, filenames=filenames, form=form
        )
    service = get_upload_service()
    result = delete_uploads(service, thread, filenames)
    history.remember_undo(thread_id, result.deleted)
    if result.deleted:
        flash(
            ngettext(
                "Deleted %(num)d file: %(names)s",
                "Deleted %(num)d files: %(names)s",
                len(result.deleted),
                names=", ".join(result.deleted),
            ),
            "success",
        )
    for _name, error in result.failed:
        flash(describe_error(error, service.limits), "error")
    return _back_to_thread(thread_id)


@bp.post("/threads/<thread_id>/convert")
def convert_file() -> ResponseReturnValue:
    """Convert a document to Markdown (the Convert button's path without JavaScript)."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = ConvertForm()
    if not form.validate_on_submit():
        flash_form_errors(form)
        return _back_to_thread(thread_id)
    name = form.filename.data
    try:
        status = get_services().conversions.convert(thread, name)
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
        return _back_to_thread(thread_id)
    if status.error is not None:
        flash(
            _("Could not convert %(name)s: %(detail)s", name=name, detail=str(status.error)),
            "error",
        )
    elif status.finished and status.companion is not None:
        flash(
            _("Converted %(name)s to %(markdown)s.", name=name, markdown=status.companion.filename),
            "success",
        )
    else:
        flash(
            _("Converting %(name)s. Reload the page to see when it is done.", name=name), "success"
        )
    return _back_to_thread(thread_id)


@bp.post("/threads/<thread_id>/extract")
def extract_file() -> ResponseReturnValue:
    """Extract an uploaded archive into workspace/<its name>/ (the Extract button)."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = ExtractForm()
    if not form.validate_on_submit():
        flash_form_errors(form)
        return _back_to_thread(thread_id)
    name = form.filename.data
    try:
        extraction = get_services().extractor.extract(thread, name)
    except DeerFlowError as error:
        flash(describe_error(error, get_upload_service().limits), "error")
        return _back_to_thread(thread_id)
    if extraction.folder is not None:
        flash(
            _(
                "Extracted %(num)d file(s) from %(name)s into %(folder)s.",
                num=len(extraction.files),
                name=name,
                folder=extraction.folder,
            ),
            "success",
        )
    if extraction.refused:
        reasons = "; ".join(refusal.reason for refusal in extraction.refused[:20])
        flash(
            _(
                "%(num)d member(s) of %(name)s were not extracted: %(reasons)s",
                num=len(extraction.refused),
                name=name,
                reasons=reasons,
            ),
            "error",
        )
    return _back_to_thread(thread_id)


@bp.get("/threads/<thread_id>/rename")
def rename_form() -> str:
    """Ask for a file's new name (a row's Rename link lands here)."""
    thread = current_thread()
    thread_id = thread.thread_id
    filename = request.args.get("filename", "")
    record = get_upload_service().get_upload(thread, filename)
    form = RenameForm(filename=record.filename, new_name=record.filename)
    return render_template("pages/rename.html", thread_id=thread_id, form=form, error=None)


@bp.post("/threads/<thread_id>/rename")
def rename_file() -> ResponseReturnValue:
    """Rename one upload; a taken name asks again with the choice of what to do."""
    thread = current_thread()
    thread_id = thread.thread_id
    form = RenameForm()
    service = get_upload_service()
    error_text = None
    status = 422  # the form itself was incomplete
    if form.validate_on_submit():
        try:
            record = service.rename_upload(
                thread,
                form.filename.data,
                form.new_name.data,
                on_conflict=OnConflict(form.on_conflict.data),
            )
        except DeerFlowError as error:
            error_text = describe_error(error, service.limits)
            status = status_for(error)
            if isinstance(error, UploadNotFound):
                flash(error_text, "error")
                return _back_to_thread(thread_id)
        else:
            flash(
                _("Renamed “%(old)s” to “%(new)s”.", old=form.filename.data, new=record.filename),
                "success",
            )
            return _back_to_thread(thread_id)
    return (
        render_template("pages/rename.html", thread_id=thread_id, form=form, error=error_text),
        status,
    )


@bp.get("/threads/<thread_id>/browse/<area>", defaults={"folder": ""})
@bp.get("/threads/<thread_id>/browse/<area>/<path:folder>")
@thread_may_be_new
def browse_area(area: str, folder: str) -> ResponseReturnValue:
    """Read-only view of what the agent wrote to outputs/ or workspace/."""
    thread = current_thread()
    thread_id = thread.thread_id
    if area == Area.UPLOADS:
        return _back_to_thread(thread_id)
    if area not in BROWSABLE_AREAS:
        abort(404)
    listing = list_area(thread, Area(area), folder)
    return render_template(
        "pages/browse.html",
        thread_id=thread_id,
        thread=get_services().threads.find(thread),
        title_form=ThreadTitleForm(formdata=None),
        area=Area(area),
        listing=listing,
    )


def _image_url(thread: ThreadFolders, user_data_path: str) -> str | None:
    """A same-origin URL for an image a Markdown file shows, if it is one of the thread's."""
    try:
        artifact = get_upload_service().resolve_artifact(
            thread, f"{VIRTUAL_PATH_PREFIX}/{user_data_path}"
        )
    except DeerFlowError:
        return None
    if artifact.presentation is not Presentation.IMAGE:
        return None
    return helpers.artifact_href(thread.thread_id, user_data_path)


MAX_PDF_PAGE = 100_000


def _pdf_page(value: str | None) -> int | None:
    """`?page=N` of a PDF preview: the page to open at (a citation's "page 3"). Anything
    that is not a page number opens the PDF at its start, as a PDF viewer treats a bad
    `#page=` fragment."""
    if value is None or not value.isdigit() or len(value) > 6:
        return None
    number = int(value)
    return number if 1 <= number <= MAX_PDF_PAGE else None


@bp.get("/threads/<thread_id>/files/<path:path>")
def preview_file(path: str) -> str:
    """Show one file of the thread: rendered, as text, as media, or as a download card."""
    thread = current_thread()
    thread_id = thread.thread_id
    service = get_upload_service()
    artifact_virtual = f"{VIRTUAL_PATH_PREFIX}/{path}"
    artifact = service.resolve_artifact(thread, artifact_virtual)
    preview = build_preview(artifact, user_data_path=path, image_url=partial(_image_url, thread))
    area, _sep, rest = path.partition("/")
    record, outline_source, outline = None, None, []
    neighbours: tuple[str | None, str | None] = (None, None)
    companion = None
    if area == Area.UPLOADS and "/" not in rest:
        records = service.list_uploads(thread)
        record = next((r for r in records if r.filename == rest), None)
        if record is not None:
            folder = thread.uploads_dir()
            outline_source, outline = upload_outline(folder, record, records)
            neighbours = _neighbours(records, record.filename)
            companion = next((r for r in records if r.converted_from == record.filename), None)
    return render_template(
        "pages/preview.html",
        thread_id=thread_id,
        path=path,
        area=area if area in set(Area) else None,
        folder=rest.rpartition("/")[0],
        preview=preview,
        rendered=Markup(preview.html),  # markdown_render's output: sanitised by construction
        show_source=request.args.get("view") == "source",
        pdf_page=_pdf_page(request.args.get("page")),
        record=record,
        outline=[entry for entry in outline if "title" in entry],
        outline_truncated=any(entry.get("truncated") for entry in outline),
        outline_source=outline_source,
        preview_limit=PREVIEW_BYTES,
        render_limit=MAX_RENDER_BYTES,
        editor=open_for_edit(thread, artifact_virtual) if area == Area.OUTPUTS else None,
        previous_name=neighbours[0],
        next_name=neighbours[1],
        companion=companion,
        convert_form=ConvertForm(formdata=None),
        share_lifetimes=SHARE_LIFETIMES,
        scanning_on=service.scanner is not None,
    )


def _neighbours(records: list, name: str) -> tuple[str | None, str | None]:
    """The files before and after `name` in the list as the person last sorted it (the
    remembered sort; filters are left out: the preview shows one file, not a search)."""
    query = ListQuery.from_request({}, request.cookies.get(LIST_VIEW_COOKIE))
    listing = build_listing(records, sort=query.sort, descending=query.descending)
    names = [row.filename for group in listing.groups for row in group.rows()]
    if name not in names:
        return None, None
    index = names.index(name)
    return (
        names[index - 1] if index > 0 else None,
        names[index + 1] if index + 1 < len(names) else None,
    )


@bp.get("/language/<code>")
@public
def set_language(code: str) -> ResponseReturnValue:
    """Remember the chosen language in a cookie and go back to the page it was chosen on."""
    if code not in LANGUAGES:
        abort(404)
    response = redirect(safe_next(request.args.get("next"), url_for("pages.index")))
    response.set_cookie(LANG_COOKIE, code, max_age=LANG_COOKIE_AGE, samesite="Lax", httponly=True)
    return response
