"""Who is asking, and may they (SPEC 7.1, 7.3): sessions, Bearer tokens, CSRF.

Everything here is enforced by app-level hooks rather than per view, so a route added
later, in any blueprint, is covered without doing anything:

- every request except the public ones needs a live server-side session (Flask-Login) or
  an API token; `/api` answers 401 `not_authenticated`, pages redirect to `/login`
  (or to `/setup` while no admin exists);
- a state-changing API request authenticated by the session cookie must echo the
  `csrf_token` cookie in `X-CSRF-Token` (DeerFlow's double submit).

Which thread a `thread_id` names is decided after this gate, in both modes, by
`web/thread_access.py`: ids are per user, so nobody's request reaches another's thread.

With accounts off (`DEER_FLOW_AUTH_DISABLED=1`) none of this is installed and the app
behaves as the single-user first release did.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from flask import Flask
from flask import Response
from flask import current_app
from flask import g
from flask import redirect
from flask import request
from flask import session
from flask import url_for
from flask.sessions import SecureCookieSessionInterface
from flask.typing import ResponseReturnValue
from flask_login import LoginManager
from flask_login import UserMixin
from flask_login import current_user
from werkzeug.exceptions import Forbidden

from deerflow_web.errors import NotAuthenticated
from deerflow_web.services.accounts.service import SESSION_SECONDS
from deerflow_web.services.accounts.service import Account
from deerflow_web.web.security import SAFE_METHODS

CSRF_COOKIE = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
JSON_BODY_LIMIT = 64 * 1024  # account requests are tiny; a megabyte of JSON is refused

# Reached without signing in (SPEC 7.3). Endpoint names, so a moved URL stays public.
PUBLIC_ENDPOINTS = frozenset(
    {
        "static",
        "auth_api.setup_status",
        "auth_api.initialize",
        "auth_api.login_local",
        "auth_api.register",
        "auth_api.logout",
        "account_pages.login",
        "account_pages.setup",
        "pages.set_language",
        "api_docs.openapi_json",
        "api_docs.api_docs",
    }
)
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
# Cookie-authenticated but exempt from the CSRF header: they check the Origin instead.
CSRF_EXEMPT_ENDPOINTS = frozenset(
    {"auth_api.initialize", "auth_api.login_local", "auth_api.register", "auth_api.logout"}
)
# Where an account that must change its password may still go.
PASSWORD_CHANGE_ENDPOINTS = frozenset(
    {
        "account_pages.account",
        "account_pages.change_password",
        "account_pages.logout",
        "auth_api.me",
        "auth_api.change_password",
    }
)

login_manager = LoginManager()


@dataclass(frozen=True)
class SignedInUser(UserMixin):
    """The account behind a request, as Flask-Login wants it.

    `session_secret` is the server-side session's key (None for a Bearer token): it is
    what Flask-Login keeps in the signed cookie, so ending the row ends the session.
    """

    account: Account
    session_secret: str | None

    @property
    def id(self) -> str:  # noqa: A003 - Flask-Login's name
        return self.account.id

    @property
    def is_active(self) -> bool:
        return not self.account.disabled

    def get_id(self) -> str | None:
        return self.session_secret


class RequestSecureSessionInterface(SecureCookieSessionInterface):
    """Marks the session cookie Secure when the request came over HTTPS (SPEC 7.3).

    Behind a trusted proxy ProxyFix has already made `request.is_secure` reflect the
    client's scheme, so one install serves plain HTTP on loopback and HTTPS in front.
    """

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure


def auth_enabled() -> bool:
    """Whether accounts are on for the current app."""
    return current_app.extensions["deerflow_web"].settings.auth.enabled


def signed_in() -> SignedInUser | None:
    """The request's user, or None (accounts off, or nobody signed in)."""
    if not auth_enabled():
        return None
    user = current_user
    if user is None or not user.is_authenticated:
        return None
    return user._get_current_object()  # type: ignore[attr-defined]


def csrf_value(session_secret: str) -> str:
    """The double-submit token of one session: derived, so a planted cookie never matches."""
    key = str(current_app.config["SECRET_KEY"]).encode()
    return hmac.new(key, b"csrf:" + session_secret.encode(), hashlib.sha256).hexdigest()


def safe_next(target: str | None, default: str) -> str:
    """A local path to return to after signing in; other hosts and `//x` go to `default`."""
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return default
    if "\\" in target or any(ord(char) < 32 for char in target):
        return default
    return target


def _accounts():  # noqa: ANN202 - the service type lives in wiring
    return current_app.extensions["deerflow_web"].accounts


def start_session(account: Account, remember: bool) -> tuple[str, str]:
    """Open a server-side session, put it in the cookie; returns (secret, csrf value)."""
    from flask_login import login_user

    secret = _accounts().open_session(account.id)
    session.clear()
    session.permanent = bool(remember)
    login_user(SignedInUser(account, secret))
    return secret, csrf_value(secret)


def end_session() -> None:
    """End the current session server-side and forget it in the cookie."""
    from flask_login import logout_user

    user = signed_in()
    if user is not None and user.session_secret:
        _accounts().end_session(user.session_secret)
    logout_user()
    session.clear()
    g.clear_csrf_cookie = True


def set_csrf_cookie(response: Response, value: str) -> None:
    response.set_cookie(
        CSRF_COOKIE,
        value,
        max_age=SESSION_SECONDS if session.permanent else None,
        secure=request.is_secure,
        httponly=False,  # the page's script reads it and echoes it in X-CSRF-Token
        samesite="Strict",
    )


def _bearer_token() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _sep, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip()


def _identify() -> None:
    """Resolve the Bearer token (if any) before anyone reads `current_user`."""
    token = _bearer_token()
    g.auth_via = None
    if token is not None:
        account = _accounts().token_user(token)  # raises 401 token_invalid / token_expired
        login_manager._update_request_context_with_user(SignedInUser(account, None))
        g.auth_via = "token"
    elif signed_in() is not None:
        g.auth_via = "session"


def _needs_login() -> ResponseReturnValue | None:
    if request.path.startswith("/api/"):
        raise NotAuthenticated()
    if _accounts().needs_setup():
        return redirect(url_for("account_pages.setup"))
    return redirect(url_for("account_pages.login", next=request.full_path.rstrip("?")))


def _check_csrf() -> None:
    if request.method in SAFE_METHODS or request.endpoint in CSRF_EXEMPT_ENDPOINTS:
        return
    if not request.path.startswith("/api/"):
        return  # pages' forms carry Flask-WTF tokens
    user = signed_in()
    assert user is not None and user.session_secret is not None
    header = request.headers.get(CSRF_HEADER, "")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    expected = csrf_value(user.session_secret)
    if not (
        header and hmac.compare_digest(header, cookie) and hmac.compare_digest(header, expected)
    ):
        raise Forbidden(
            "CSRF token missing or invalid: send the csrf_token cookie's value in X-CSRF-Token"
        )


def authenticate_request() -> ResponseReturnValue | None:
    """The app-wide gate (see the module docstring)."""
    if request.endpoint is None or request.path in PUBLIC_PATHS:
        return None  # routing errors are answered by the error handlers
    if request.path.startswith("/api/v1/"):
        request.max_content_length = JSON_BODY_LIMIT
    _identify()
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    user = signed_in()
    if user is None:
        return _needs_login()
    if g.auth_via == "session":
        _check_csrf()
        if user.account.needs_setup and request.endpoint not in PASSWORD_CHANGE_ENDPOINTS:
            if request.path.startswith("/api/"):
                raise Forbidden("Password change required: POST /api/v1/auth/change-password")
            return redirect(url_for("account_pages.account"))
    return None


def refresh_csrf_cookie(response: Response) -> Response:
    """Keep the double-submit cookie in step with the session (set, renewed or cleared)."""
    if getattr(g, "clear_csrf_cookie", False):
        response.delete_cookie(CSRF_COOKIE, samesite="Strict", secure=request.is_secure)
        return response
    if getattr(g, "auth_via", None) != "session":
        return response
    user = signed_in()
    if user is None or user.session_secret is None:
        return response
    expected = csrf_value(user.session_secret)
    if request.cookies.get(CSRF_COOKIE) != expected and CSRF_COOKIE not in _set_cookies(response):
        set_csrf_cookie(response, expected)
    return response


def _set_cookies(response: Response) -> set[str]:
    return {value.split("=", 1)[0] for value in response.headers.getlist("Set-Cookie")}


def _load_session_user(secret: str) -> SignedInUser | None:
    account = _accounts().session_user(secret)
    return None if account is None else SignedInUser(account, secret)


def init_app(app: Flask) -> None:
    """Install sessions, the request gate and the cookie settings of SPEC 7.3."""
    app.session_interface = RequestSecureSessionInterface()
    app.config["PERMANENT_SESSION_LIFETIME"] = timedelta(seconds=SESSION_SECONDS)
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    login_manager.init_app(app)
    login_manager.session_protection = None  # the server-side session row is the authority
    login_manager.user_loader(_load_session_user)
    app.before_request(authenticate_request)
    app.after_request(refresh_csrf_cookie)
