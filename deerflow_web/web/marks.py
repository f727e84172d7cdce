"""Exceptions to the app-wide gates, declared by each view where it is defined.

The hooks that guard every request (the sign-in gate of web/accounts/gate.py, the origin
check of web/security.py, the thread gate of web/thread_access.py and the worker's limits
for unauthenticated bodies in web/transport/server.py) cover a route added later without
anything being done. The few views that are exceptions carry a decorator from here, which
sets an attribute on the view function; the hooks read it from `app.view_functions`, so a
view that is renamed or moved keeps its exception and no list elsewhere goes stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flask import Flask
from flask import current_app
from flask import request

View = TypeVar("View", bound=Callable[..., object])

PUBLIC = "deerflow_public"
PROBE = "deerflow_probe"
CSRF_EXEMPT = "deerflow_csrf_exempt"
BEFORE_PASSWORD_CHANGE = "deerflow_before_password_change"
BEFORE_PASSWORD_CHANGE_BY_TOKEN = "deerflow_before_password_change_by_token"
THREAD_MAY_BE_NEW = "deerflow_thread_may_be_new"
# Flask's own static route is not ours to decorate; its files are public.
STATIC_ENDPOINT = "static"


def _marking(*names: str) -> Callable[[View], View]:
    def mark(view: View) -> View:
        for name in names:
            setattr(view, name, True)
        return view

    return mark


def public(view: View) -> View:
    """Reached without signing in (SPEC 7.3): sign-in, set-up, the language switch, the
    API description. Credentials that come along are still read, so such a view knows
    who is there; the worker also gives its body the small unauthenticated limits."""
    return _marking(PUBLIC)(view)


def probe(view: View) -> View:
    """A health probe (SPEC D20): answered for any `Host` (probes come by the instance's
    address) and without reading any credential, so a stale one never fails a probe."""
    return _marking(PROBE)(view)


def csrf_exempt(view: View) -> View:
    """Takes a session cookie without the `X-CSRF-Token` header (DeerFlow's login, set-up,
    registration and logout): the browser's `Origin` is checked instead, and a foreign one
    is refused in DeerFlow's words (web/security.py)."""
    return _marking(CSRF_EXEMPT)(view)


def before_password_change(*, by_token: bool = False) -> Callable[[View], View]:
    """Open to an account that must change its password, signed in by its session (and,
    with `by_token`, by an API token too): the change itself and what leads to it."""
    if by_token:
        return _marking(BEFORE_PASSWORD_CHANGE, BEFORE_PASSWORD_CHANGE_BY_TOKEN)
    return _marking(BEFORE_PASSWORD_CHANGE)


def thread_may_be_new(view: View) -> View:
    """Serves a thread the caller does not have yet (see web/thread_access.py)."""
    return _marking(THREAD_MAY_BE_NEW)(view)


def endpoint_has(app: Flask, endpoint: str | None, mark: str) -> bool:
    """Whether the view of `endpoint` carries `mark` (static files count as public)."""
    if endpoint is None:
        return False
    if endpoint == STATIC_ENDPOINT:
        return mark == PUBLIC
    return bool(getattr(app.view_functions.get(endpoint), mark, False))


def request_has(mark: str) -> bool:
    """Whether the view the current request is routed to carries `mark`."""
    return endpoint_has(current_app, request.endpoint, mark)
