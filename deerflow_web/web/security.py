"""Cross-site protections that apply to the whole app or whole blueprints.

The app answers only for the hosts it serves (`server.allowed_hosts`): a page on another
site that rebinds its own name to this server's address sends its own name as `Host`, and
gets 400 for every request, before any route runs (DNS rebinding).

The JSON API takes no CSRF token: DeerFlow's frontend, curl and scripts call it without a
session. A browser, though, announces where a request comes from, so a state-changing API
request is refused when its `Sec-Fetch-Site` says `cross-site` or its `Origin` is none of:
the allowed hosts with the scheme and port as served, `server.allowed_origins`, or the
request's own scheme and `Host` when that `Host` is an allowed host. The last one is what a
proxy that passes the browser's `Host` through (port included) but no `X-Forwarded-Host` or
`-Port` needs, as DeerFlow's own nginx does: behind it the app's bound port is not the one
the browser sees. It is safe because a browser, not the page, writes both headers: a page
on another site sends its own `Origin` with this server's `Host`, and a rebinding page
sends its own name as `Host`, which is refused with 400 before this check. A client that
forges both is no browser and carries no ambient credentials. Requests without those
headers (curl, scripts) pass for the same reason.

The origin check is one app-wide hook for every route under `/api/` (`check_api_origin`),
run once per request after the sign-in gate and before the thread gate, so a cross-site
request is refused before anything about its thread is looked up. The views that take a
session cookie without the CSRF header (`csrf_exempt`, web/marks.py: DeerFlow's login,
set-up, registration and logout) answer that refusal in DeerFlow's words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from flask import Response
from flask import request
from werkzeug.exceptions import BadRequest
from werkzeug.exceptions import Forbidden

from deerflow_web.services.files.artifacts import Presentation
from deerflow_web.web.marks import CSRF_EXEMPT
from deerflow_web.web.marks import request_has
from deerflow_web.web.wiring import get_services

API_DOCS_PAGE = "api_docs.api_docs"  # the one page under /api/ (Swagger UI)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CROSS_SITE_AUTH = "Cross-site auth request denied."  # DeerFlow's words, on its four routes

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


class UnknownHost(BadRequest):
    """The request names a host this server does not serve."""

    description = "Unknown host: this server answers only for the names in server.allowed_hosts"


# host (a name, an IPv4 address or a bracketed IPv6 address) and an optional port
_HOST_RE = re.compile(r"(?P<name>[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")


def host_allowed(header: str | None, allowed_hosts: Iterable[str]) -> bool:
    """Whether a `Host` header names an allowed host (any port; `.example.com` = subdomains).

    Werkzeug's `TRUSTED_HOSTS` would do this, but it cannot match an IPv6 literal such as
    `[::1]`, one of the defaults, so the same rule is written out here.
    """
    if not header:
        return False
    match = _HOST_RE.fullmatch(header.lower())
    if match is None:
        return False
    name = match["name"].rstrip(".") if not match["name"].startswith("[") else match["name"]
    for allowed in allowed_hosts:
        if allowed.startswith("."):
            if name.endswith(allowed) or name == allowed[1:]:
                return True
        elif name == allowed:
            return True
    return False


def refuse_unknown_host(allowed_hosts: Iterable[str]) -> None:
    """Raise 400 unless the request's `Host` is one of the allowed hosts."""
    if not host_allowed(request.headers.get("Host"), allowed_hosts):
        raise UnknownHost()


def own_origins(allowed_hosts: Iterable[str], scheme: str, port: str) -> set[str]:
    """The origins this app is served under: each allowed host with the scheme and port."""
    default = "443" if scheme == "https" else "80"
    suffix = "" if port == default else f":{port}"
    return {f"{scheme}://{host}{suffix}" for host in allowed_hosts if not host.startswith(".")}


def _without_default_port(origin: str) -> str:
    """`http://a:80` and `https://a:443` as a browser writes them: `http://a`, `https://a`."""
    for scheme, port in (("http", ":80"), ("https", ":443")):
        if origin.startswith(f"{scheme}://") and origin.endswith(port):
            return origin.removesuffix(port)
    return origin


def requested_origin(allowed_hosts: Iterable[str], scheme: str, host: str | None) -> str | None:
    """The origin a browser is addressing (scheme and `Host`), when that host is allowed."""
    if host is None or not host_allowed(host, allowed_hosts):
        return None
    return _without_default_port(f"{scheme}://{host.strip().lower()}")


def refuse_cross_site(allowed_hosts: Iterable[str], allowed_origins: Iterable[str]) -> None:
    """Raise 403 for a state-changing browser request that comes from another origin."""
    if request.method in SAFE_METHODS:
        return
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        raise CrossSiteRequest()
    origin = request.headers.get("Origin")
    if origin is None:
        return
    origin = origin.strip().rstrip("/").lower()
    if origin in allowed_origins:
        return
    addressed = requested_origin(allowed_hosts, request.scheme, request.headers.get("Host"))
    if addressed is not None and _without_default_port(origin) == addressed:
        return
    port = str(request.environ.get("SERVER_PORT") or "")
    if origin not in own_origins(allowed_hosts, request.scheme, port):
        raise CrossSiteRequest()


def safe_next(target: str | None, default: str) -> str:
    """A path on this site to go back to (`next=`), else `default`: never an open redirect.

    Another scheme or host, `//x` and `/\\x` (browsers read both as another host) and
    any control character (browsers drop tabs and line breaks, so `/\\t/x` is `//x`) all
    go to `default`.
    """
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return default
    if "\\" in target or any(ord(char) < 32 for char in target):
        return default
    return target


def check_api_origin() -> None:
    """The app's hook: `refuse_cross_site` for every route under `/api/` (see the module).

    Routing errors are left to the error handlers, as no route's check ran for them.
    """
    if request.endpoint is None or not request.path.startswith("/api/"):
        return
    settings = get_services().settings
    try:
        refuse_cross_site(settings.allowed_hosts, settings.allowed_origins)
    except CrossSiteRequest:
        if request_has(CSRF_EXEMPT):
            raise Forbidden(CROSS_SITE_AUTH) from None
        raise


def add_security_headers(response: Response) -> Response:
    """Headers every response gets; pages and API answers each get a strict CSP."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if request.path.startswith("/api/") and request.endpoint != API_DOCS_PAGE:
        # JSON, errors and files alike: nothing under /api/ is ever a page that may act.
        response.headers.setdefault("Content-Security-Policy", artifact_csp(None))
    elif response.mimetype == "text/html":  # pages, and the API docs page
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
    return response
