"""Cross-site protections that apply to whole blueprints.

The JSON API takes no CSRF token: DeerFlow's frontend, curl and scripts call it without a
session. A browser, though, announces where a request comes from, so a state-changing API
request is refused when its `Sec-Fetch-Site` says `cross-site` or its `Origin` is not this
app's own (or one listed in `server.allowed_origins`). Requests without those headers
(curl, scripts) carry no ambient browser credentials and pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from flask import Response
from flask import request
from werkzeug.exceptions import Forbidden

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

PAGE_CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "media-src 'self' blob:",
        "object-src 'none'",
        "frame-src 'self'",
        "frame-ancestors 'self'",
        "base-uri 'none'",
        "form-action 'self'",
    )
)


class CrossSiteRequest(Forbidden):
    """A browser request from another site tried to change state."""

    description = "Cross-site request refused: this API only accepts same-origin browser requests"


def refuse_cross_site(allowed_origins: Iterable[str]) -> None:
    """Raise 403 for a state-changing browser request that comes from another origin."""
    if request.method in SAFE_METHODS:
        return
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        raise CrossSiteRequest()
    origin = request.headers.get("Origin")
    if origin is None:
        return
    own = request.host_url.rstrip("/")
    if origin.rstrip("/") != own and origin.rstrip("/") not in allowed_origins:
        raise CrossSiteRequest()


def add_security_headers(response: Response) -> Response:
    """Headers every response gets; pages also get a strict Content-Security-Policy."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if response.mimetype == "text/html":  # pages, and /api/docs
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
    return response
