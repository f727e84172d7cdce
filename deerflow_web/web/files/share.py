"""Share links: the owner's forms on the thread page, and the public pages that open them.

The owner's routes live under the thread (`/threads/<id>/share...`), behind the same gate
as every thread page. The visitor's routes (`/s/<secret>...`) need no account: they are
public endpoints, rate limited per address, and answer 404 alike for an unknown, expired
or revoked link (services/files/share_links.py). A file is sent by the same rules as the
artifact route: passive types inline under the artifact CSP, everything else as a
download, never through a link on disk.
"""

from __future__ import annotations

import hmac

from flask import Blueprint
from flask import Response
from flask import abort
from flask import current_app
from flask import flash
from flask import redirect
from flask import render_template
from flask import request
from flask import url_for
from flask.typing import ResponseReturnValue
from flask_babel import gettext as _

from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import ShareLinkNotFound
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.freshness import open_checked
from deerflow_web.services.files.share_links import ShareLink
from deerflow_web.services.files.share_links import parse_hours
from deerflow_web.services.files.zip_download import ZipMember
from deerflow_web.services.files.zip_download import members_for_paths
from deerflow_web.services.files.zip_download import stream_zip
from deerflow_web.web.marks import public
from deerflow_web.web.messages import describe_error
from deerflow_web.web.security import artifact_csp
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.transport.send import send_artifact
from deerflow_web.web.wiring import get_services
from deerflow_web.web.wiring import get_upload_service

bp = Blueprint("share", __name__)

UNLOCK_COOKIE = "share-unlocked-"
PRIVATE = "private, no-store"


def _links():  # noqa: ANN202 - ShareLinks, built in wiring
    return get_services().share_links


def _back(thread_id: str) -> ResponseReturnValue:
    return redirect(url_for("pages.thread_files", thread_id=thread_id))


# -- the owner's side -------------------------------------------------------------------


@bp.post("/threads/<thread_id>/share")
def create_link() -> ResponseReturnValue:
    """Make a link to the selected files (each must be one the owner can download now)."""
    thread = current_thread()
    thread_id = thread.thread_id
    paths = request.form.getlist("path")
    paths += [f"uploads/{name}" for name in request.form.getlist("filenames") if name]
    password = request.form.get("password") or None
    uploads = get_upload_service()
    try:
        hours = parse_hours(request.form.get("hours", ""))
        for path in paths:
            uploads.resolve_artifact(thread, f"{VIRTUAL_PATH_PREFIX}/{path}")
        link, token = _links().create(thread.ref, paths, hours=hours, password=password)
    except DeerFlowError as error:
        flash(describe_error(error, uploads.limits), "error")
        return _back(thread_id)
    url = url_for("share.open_link", token=token, _external=True)
    response = Response(
        render_template("pages/share_created.html", thread_id=thread_id, link=link, url=url)
    )
    response.headers["Cache-Control"] = PRIVATE  # the secret is on this page, once
    return response


@bp.post("/threads/<thread_id>/share/<link_id>/revoke")
def revoke_link(link_id: str) -> ResponseReturnValue:
    """End a link now; whoever holds it gets the same 404 as for any unknown link."""
    thread = current_thread()
    thread_id = thread.thread_id
    try:
        _links().revoke(thread.ref, link_id)
    except ShareLinkNotFound:
        flash(_("That share link does not exist any more."), "error")
        return _back(thread_id)
    flash(_("Share link revoked. It no longer opens."), "success")
    return _back(thread_id)


# -- the visitor's side -----------------------------------------------------------------


def _address() -> str:
    return request.remote_addr or ""


def _cookie_name(link: ShareLink) -> str:
    return f"{UNLOCK_COOKIE}{link.id}"


def _unlocked(link: ShareLink) -> bool:
    if not link.has_password:
        return True
    given = request.cookies.get(_cookie_name(link), "")
    expected = _links().unlock_proof(link.id, current_app.secret_key or "")
    return hmac.compare_digest(given, expected)


def _private(response: Response) -> Response:
    response.headers["Cache-Control"] = PRIVATE
    response.headers["Referrer-Policy"] = "no-referrer"  # the secret is in the URL
    response.headers["X-Robots-Tag"] = "noindex, nofollow"
    return response


def _resolve(link: ShareLink, index: int, *, from_bucket: bool = False) -> tuple[str, Artifact]:
    if not 0 <= index < len(link.paths):
        raise ShareLinkNotFound()
    path = link.paths[index]
    try:
        artifact = get_upload_service().resolve_artifact(
            link.thread, f"{VIRTUAL_PATH_PREFIX}/{path}", from_bucket=from_bucket
        )
    except DeerFlowError:
        raise ArtifactNotFound(path.partition("/")[2]) from None
    return path, artifact


def _entries(link: ShareLink) -> list[dict[str, object]]:
    """What the link still holds: a file deleted since is shown as gone."""
    entries = []
    for index, path in enumerate(link.paths):
        try:
            _path, artifact = _resolve(link, index)
        except DeerFlowError:
            entries.append({"index": index, "name": path.rpartition("/")[2], "artifact": None})
            continue
        entries.append({"index": index, "name": artifact.name, "artifact": artifact})
    return entries


def _page(link: ShareLink, token: str, *, error: str | None = None, status: int = 200) -> Response:
    locked = not _unlocked(link)
    response = Response(
        render_template(
            "pages/share_open.html",
            link=link,
            token=token,
            locked=locked,
            error=error,
            entries=[] if locked else _entries(link),
        ),
        status,
    )
    return _private(response)


@bp.get("/s/<token>")
@public  # opened without an account; rate limited per address
def open_link(token: str) -> ResponseReturnValue:
    """The link's page: its files, or first the password it asks for."""
    link = _links().open(token, _address())
    return _page(link, token)


@bp.post("/s/<token>")
@public  # opened without an account; rate limited per address
def unlock_link(token: str) -> ResponseReturnValue:
    """Check the password; a right one leaves a cookie for this link only."""
    links = _links()
    link = links.open(token, _address())
    if not link.has_password:
        return redirect(url_for("share.open_link", token=token))
    if not links.check_password(link.id, request.form.get("password", ""), _address()):
        return _page(link, token, error=_("That password is not right."), status=403)
    response = redirect(url_for("share.open_link", token=token))
    response.set_cookie(
        _cookie_name(link),
        links.unlock_proof(link.id, current_app.secret_key or ""),
        max_age=max(1, int(link.expires_at - links.now())),
        path=f"/s/{token}",
        secure=request.is_secure,
        httponly=True,
        samesite="Strict",
    )
    return _private(response)


@bp.get("/s/<token>/all.zip")
@public  # opened without an account; rate limited per address
def link_zip(token: str) -> ResponseReturnValue:
    """Every file of the link as one streamed zip (services/files/zip_download.py)."""
    link = _links().open(token, _address())
    if not _unlocked(link):
        return redirect(url_for("share.open_link", token=token))
    uploads = get_upload_service()
    members = members_for_paths(lambda virtual: _resolve_virtual(link, virtual), link.paths)

    def open_member(member: ZipMember):  # noqa: ANN202 - a file object
        return open_checked(uploads, link.thread, member.artifact.path).file

    response = Response(
        stream_zip(members, open_member), mimetype="application/zip", direct_passthrough=True
    )
    response.headers["Content-Disposition"] = "attachment; filename*=UTF-8''shared-files.zip"
    response.headers["Content-Security-Policy"] = artifact_csp(None)
    return _private(response)


def _resolve_virtual(link: ShareLink, virtual: str) -> Artifact:
    path = virtual.removeprefix(f"{VIRTUAL_PATH_PREFIX}/")
    return _resolve(link, link.paths.index(path))[1]


@bp.get("/s/<token>/<int:index>")
@public  # opened without an account; rate limited per address
def link_file(token: str, index: int) -> ResponseReturnValue:
    """One file of the link, by the artifact route's rules (passive types inline only)."""
    link = _links().open(token, _address())
    if not _unlocked(link):
        return redirect(url_for("share.open_link", token=token))
    _path, artifact = _resolve(link, index, from_bucket=True)
    download = request.args.get("download") in ("1", "true")
    try:
        response = send_artifact(
            get_upload_service(), link.thread, artifact, attachment=artifact.as_attachment(download)
        )
    except OSError:
        abort(404)
    return _private(response)
