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

from deerflow_web.services.artifacts import Presentation

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


# Every artifact response is a sandboxed document that may load nothing: should a browser
# ever render a thread's file as a page, it runs no script, has no origin and sends nothing.
ARTIFACT_BASE_CSP = (
    "default-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'self'",  # the preview page frames PDFs
)
# What the browser's own viewer for each inline kind needs (its UA styles, the file itself).
ARTIFACT_VIEWER_CSP = {
    Presentation.IMAGE: ("img-src 'self'", "style-src 'unsafe-inline'"),
    Presentation.TEXT: ("style-src 'unsafe-inline'",),
    Presentation.AUDIO: ("media-src 'self'", "style-src 'unsafe-inline'"),
    Presentation.VIDEO: ("media-src 'self'", "style-src 'unsafe-inline'"),
}
# Chromium's media viewer loads its file with CORS, which fails from the opaque origin a
# plain `sandbox` gives; `allow-same-origin` keeps the origin but still allows no script.
SANDBOX_FOR = {
    Presentation.AUDIO: "sandbox allow-same-origin",
    Presentation.VIDEO: "sandbox allow-same-origin",
}


def artifact_csp(presentation: Presentation | None) -> str:
    """The Content-Security-Policy of an artifact shown as `presentation` (None: download)."""
    directives = [
        *ARTIFACT_BASE_CSP,
        *ARTIFACT_VIEWER_CSP.get(presentation, ()),
        SANDBOX_FOR.get(presentation, "sandbox"),
    ]
    return "; ".join(directives)


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
    """Headers every response gets; pages and API answers each get a strict CSP."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if request.path.startswith("/api/"):
        # JSON, errors and files alike: nothing under /api/ is ever a page that may act.
        response.headers.setdefault("Content-Security-Policy", artifact_csp(None))
    elif response.mimetype == "text/html":
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
    return response
