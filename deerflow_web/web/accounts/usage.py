"""Storage usage for people: the line in every page's header, and the usage `/auth/me` and
the admin views show. The rules and the arithmetic are `services/quotas`'."""

from __future__ import annotations

import logging
import sqlite3

from flask import Flask
from flask import g
from sqlalchemy.exc import DBAPIError

from deerflow_web.models import SINGLE_USER
from deerflow_web.services.quotas.policy import Usage
from deerflow_web.web.wiring import get_services

logger = logging.getLogger(__name__)


def owner_usage(owner: str) -> Usage:
    """What the owner stores and may store."""
    return get_services().quotas.usage(owner)


def header_usage() -> Usage | None:
    """The page header's usage: the signed-in account's, the one owner's with accounts
    off, None for a visitor (the sign-in page). Read once per request."""
    from deerflow_web.web.accounts.gate import auth_enabled
    from deerflow_web.web.accounts.gate import signed_in

    if "header_usage" not in g:
        g.header_usage = None
        try:
            if not auth_enabled():
                g.header_usage = owner_usage(SINGLE_USER)
            elif (user := signed_in()) is not None:
                g.header_usage = owner_usage(user.id)
        except (DBAPIError, sqlite3.Error):
            # The database is out of reach: the page (often the error page saying so)
            # still renders, without the line.
            logger.warning("storage usage not shown: database unavailable")
    return g.header_usage


def init_app(app: Flask) -> None:
    """Give templates `storage_usage()`."""
    app.add_template_global(header_usage, "storage_usage")
