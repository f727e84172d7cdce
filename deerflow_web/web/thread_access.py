"""Which thread a request with a `thread_id` in its URL may touch (SPEC 7.4), in both modes.

Thread ids are per user: every route works on the caller's own thread of that id (the
folder `users/{uid}/threads/{id}`, or the flat layout's `threads/{id}` with accounts off),
so no request can reach, claim or even detect another user's thread of the same id, and
another user's id answers exactly as an id nobody uses.

An app-wide hook, so a route added later, in any blueprint, is covered without doing
anything: a route acts on an existing thread and answers 404 `Thread {id} not found`
when the caller has none of that id, before the view runs, so a failed request creates
nothing. The few views that also serve a thread not made yet are marked where they are
defined (`thread_may_be_new`): those that create one on success (uploads, a resumable
upload's creation, a first chat preview turn) and those that show an empty thread (the
uploads list, the limits, the file manager's and the chat preview's pages, the tools
panel, which only reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flask import current_app
from flask import request

from deerflow_web.errors import ThreadNotFound
from deerflow_web.storage.paths import validate_thread_id
from deerflow_web.web.security import refuse_cross_site
from deerflow_web.web.wiring import current_user_id
from deerflow_web.web.wiring import get_services

View = TypeVar("View", bound=Callable[..., object])

_MARK = "thread_may_be_new"


def thread_may_be_new(view: View) -> View:
    """Mark a view that serves a thread the caller does not have yet (see the module)."""
    setattr(view, _MARK, True)
    return view


def check_thread_access() -> None:
    """422 for a malformed id; 404 for a thread the caller does not have (see the module)."""
    args = request.view_args or {}
    if "thread_id" not in args or request.endpoint is None:
        return
    if request.path.startswith("/api/"):
        # The API's origin check comes first, as it would in the API's own hook: a
        # cross-site request is refused before anything about its thread is looked up.
        settings = get_services().settings
        refuse_cross_site(settings.allowed_hosts, settings.allowed_origins)
    thread_id = validate_thread_id(args["thread_id"])
    if request.method == "OPTIONS" and request.url_rule is not None:
        if request.url_rule.provide_automatic_options:
            return  # Flask answers it without running a view
    view = current_app.view_functions.get(request.endpoint)
    if getattr(view, _MARK, False):
        return
    if not get_services().threads.exists(current_user_id(), thread_id):
        raise ThreadNotFound(thread_id)
