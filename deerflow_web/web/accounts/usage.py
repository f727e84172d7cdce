"""Storage usage for people: the header line of every page, `usage` in `/auth/me`, and the
admins' quota settings (page and API). The rules are `services/quotas`'."""

from __future__ import annotations

from flask import Flask
from flask import g

from deerflow_web.models import SINGLE_USER
from deerflow_web.services.quotas.policy import Usage
from deerflow_web.web.wiring import get_services


def owner_usage(owner: str) -> Usage:
    """What the owner stores and may store."""
    return get_services().quotas.usage(owner)


def header_usage() -> Usage | None:
    """The page header's usage: the signed-in account's, the one owner's with accounts
    off, None for a visitor (the sign-in page). Read once per request."""
    from deerflow_web.web.accounts.gate import auth_enabled
    from deerflow_web.web.accounts.gate import signed_in

    if "header_usage" not in g:
        if not auth_enabled():
            g.header_usage = owner_usage(SINGLE_USER)
        else:
            user = signed_in()
            g.header_usage = owner_usage(user.id) if user is not None else None
    return g.header_usage


def init_app(app: Flask) -> None:
    """Give templates `storage_usage()`."""
    app.add_template_global(header_usage, "storage_usage")
