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

The id is settled once per request: a URL value preprocessor takes it out of the view's
arguments, and the hook, which runs after the host check, the sign-in gate and the API's
origin check (so their answers come first, and a cross-site request is refused before
anything about its thread is looked up), validates it, checks ownership and puts the thread's
handle on `g` (`current_thread()`): its reference, its folders walked once and the
records listed once, for every service the view calls. Views take no `thread_id`.
"""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask import g
from flask import request

from deerflow_web.errors import ThreadNotFound
from deerflow_web.models import ThreadRef
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.web.marks import THREAD_MAY_BE_NEW
from deerflow_web.web.marks import request_has
from deerflow_web.web.wiring import current_owner
from deerflow_web.web.wiring import get_services

_RAW_ID = "thread_id_in_url"


def take_thread_id(endpoint: str | None, values: dict[str, Any] | None) -> None:
    """Take the URL's `thread_id` out of the view arguments, for `check_thread_access`."""
    if values and "thread_id" in values:
        setattr(g, _RAW_ID, values.pop("thread_id"))


def check_thread_access() -> None:
    """422 for a malformed id; 404 for a thread the caller does not have (see the module)."""
    if not hasattr(g, _RAW_ID) or request.endpoint is None:
        return
    raw = getattr(g, _RAW_ID)
    if request.method == "OPTIONS" and request.url_rule is not None:
        if request.url_rule.provide_automatic_options:
            ThreadRef.single_user(raw)  # a malformed id is still 422
            return  # Flask answers it without running a view
    # The ownership check and the view share one walk of the thread's folders.
    thread = get_services().uploads.folders(ThreadRef(raw, current_owner()))
    if not request_has(THREAD_MAY_BE_NEW) and not get_services().threads.exists(thread):
        raise ThreadNotFound(thread.thread_id)
    g.thread = thread


def current_thread() -> ThreadFolders:
    """The handle of the thread the request's URL names (set by `check_thread_access`)."""
    thread: ThreadFolders = g.thread
    return thread


def init_app(app: Flask) -> None:
    """Install the preprocessor and the hook; the hook after the sign-in gate's and the
    API's origin check."""
    app.url_value_preprocessor(take_thread_id)
    app.before_request(check_thread_access)
