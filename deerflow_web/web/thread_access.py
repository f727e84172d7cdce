"""Which thread a request with a `thread_id` in its URL may touch (SPEC 7.4), in both modes.

Thread ids are per user: every route works on the caller's own thread of that id (the
folder `users/{uid}/threads/{id}`, or the flat layout's `threads/{id}` with accounts off),
so no request can reach, claim or even detect another user's thread of the same id, and
another user's id answers exactly as an id nobody uses.

An app-wide hook, so a route added later, in any blueprint, is covered without doing
anything: a route acts on an existing thread and answers 404 `Thread {id} not found`
when the caller has none of that id, before the view runs, so a failed request creates
nothing. The few views that also serve a thread not made yet are marked where they are
defined (`thread_may_be_new`, web/marks.py): those that create one on success (uploads, a resumable
upload's creation, a first chat preview turn) and those that show an empty thread (the
uploads list, the limits, the file manager's and the chat preview's pages, the tools
panel, which only reads).

It runs after the sign-in gate (it needs the user) and after the API's origin check, so a
cross-site request is refused before anything about its thread is looked up.
"""

from __future__ import annotations

from flask import request

from deerflow_web.errors import ThreadNotFound
from deerflow_web.storage.paths import validate_thread_id
from deerflow_web.web.marks import THREAD_MAY_BE_NEW
from deerflow_web.web.marks import request_has
from deerflow_web.web.wiring import current_user_id
from deerflow_web.web.wiring import get_services


def check_thread_access() -> None:
    """422 for a malformed id; 404 for a thread the caller does not have (see the module)."""
    args = request.view_args or {}
    if "thread_id" not in args or request.endpoint is None:
        return
    thread_id = validate_thread_id(args["thread_id"])
    if request.method == "OPTIONS" and request.url_rule is not None:
        if request.url_rule.provide_automatic_options:
            return  # Flask answers it without running a view
    if request_has(THREAD_MAY_BE_NEW):
        return
    if not get_services().threads.exists(current_user_id(), thread_id):
        raise ThreadNotFound(thread_id)
