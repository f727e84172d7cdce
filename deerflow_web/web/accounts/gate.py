"""Who is asking, and may they (SPEC 7.1, 7.3): sessions, Bearer tokens, CSRF.

Everything here is enforced by app-level hooks rather than per view, so a route added
later, in any blueprint, is covered without doing anything:

- every request except the public ones (views marked `public` in web/marks.py, static
  files and the health probes) needs a live server-side session or an API token;
  `/api` answers 401 (`not_authenticated` without credentials, `token_invalid` or
  `token_expired` for a dead session cookie), pages redirect to `/login` (or to `/setup`
  while no admin exists);
- a state-changing API request authenticated by the session cookie must echo the
  `csrf_token` cookie in `X-CSRF-Token` (DeerFlow's double submit), unless its view is
  marked `csrf_exempt` (the Origin is checked instead);
- an account that must change its password can do nothing else, by session or by token,
  but what is marked `before_password_change`;
- every answer that depends on who is signed in is sent `Cache-Control: no-store`.

Which thread a `thread_id` names is decided after this gate, in both modes, by
`web/thread_access.py`: ids are per user, so nobody's request reaches another's thread.

The session cookie is DeerFlow's `access_token` (its Next.js page guard reads only that
name): an opaque random secret whose SHA-256 is the server-side session row, never a JWT,
with DeerFlow's companion `deerflow_session_persistent` ("1" or "0") beside it. Flask's
own signed cookie keeps only what pages need between two requests (flashed messages, the
form tokens of Flask-WTF) and no secret; it is named `__Host-session` over HTTPS, so a
sibling subdomain or a plain-HTTP page cannot plant one. The cookies DeerFlow's code reads
by name (`access_token`, `csrf_token`, `deerflow_session_persistent`) keep their names:
a planted `access_token` can only sign the browser into the planter's own account, and a
planted `csrf_token` never matches, since it is derived from the session's secret.

With accounts off (`DEER_FLOW_AUTH_DISABLED=1`) none of this is installed and the app
behaves as the single-user first release did.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

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
from itsdangerous import URLSafeTimedSerializer
from werkzeug.exceptions import Forbidden

from deerflow_web.errors import AuthError
from deerflow_web.errors import NotAuthenticated
from deerflow_web.errors import PermissionDenied
from deerflow_web.services.accounts.service import Account
from deerflow_web.web.marks import BEFORE_PASSWORD_CHANGE
from deerflow_web.web.marks import BEFORE_PASSWORD_CHANGE_BY_TOKEN
from deerflow_web.web.marks import CSRF_EXEMPT
from deerflow_web.web.marks import PROBE
from deerflow_web.web.marks import PUBLIC
from deerflow_web.web.marks import STATIC_ENDPOINT
from deerflow_web.web.marks import request_has
from deerflow_web.web.security import SAFE_METHODS

SESSION_COOKIE = "access_token"  # DeerFlow's name: its page guard reads only this cookie
PERSISTENT_COOKIE = "deerflow_session_persistent"  # DeerFlow's companion: "1" or "0"
CSRF_COOKIE = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
FLASK_SESSION_COOKIE = "session"  # Flask's own; `__Host-session` over HTTPS
HOST_PREFIX = "__Host-"
JSON_BODY_LIMIT = 64 * 1024  # account requests are tiny; a megabyte of JSON is refused
CSRF_MISSING = "CSRF token missing. Include X-CSRF-Token header."  # DeerFlow's words
CSRF_MISMATCH = "CSRF token mismatch."
PASSWORD_CHANGE_REQUIRED = "Password change required: POST /api/v1/auth/change-password"
NO_STORE = "no-store"

# Answers about accounts: never stored by a cache, whoever asks.
ACCOUNT_BLUEPRINTS = frozenset({"auth_api", "admin_api", "account_pages"})


@dataclass(frozen=True)
class SignedInUser:
    """The account behind a request.

    `session_secret` is the server-side session's key, the `access_token` cookie's value
    (None for a Bearer token); `persistent` whether that session was "remember me".
    """

    account: Account
    session_secret: str | None
    persistent: bool = True

    @property
    def id(self) -> str:  # noqa: A003 - the account id, as views and owners use it
        return self.account.id


class FlaskSessionInterface(SecureCookieSessionInterface):
    """Flask's cookie for flashes and form tokens: Secure and `__Host-` over HTTPS.

    Behind a trusted proxy ProxyFix has already made `request.is_secure` reflect the
    client's scheme, so one install serves plain HTTP on loopback and HTTPS in front.
    """

    _serializer: tuple[object, URLSafeTimedSerializer | None] | None = None

    def get_cookie_name(self, app: Flask) -> str:
        name = super().get_cookie_name(app)
        return HOST_PREFIX + name if request.is_secure else name

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure

    def get_signing_serializer(self, app: Flask) -> URLSafeTimedSerializer | None:
        """Flask's serializer, made once per key set rather than twice per request."""
        keys = (app.secret_key, tuple(app.config["SECRET_KEY_FALLBACKS"] or ()))
        if self._serializer is None or self._serializer[0] != keys:
            self._serializer = (keys, super().get_signing_serializer(app))
        return self._serializer[1]


def auth_enabled() -> bool:
    """Whether accounts are on for the current app."""
    return current_app.extensions["deerflow_web"].settings.auth.enabled


def signed_in() -> SignedInUser | None:
    """The request's user, or None (accounts off, or nobody signed in)."""
    if not auth_enabled():
        return None
    if "signed_in_user" not in g:  # a request the gate never saw: a routing 404, say
        try:
            _identify()
        except AuthError:
            g.signed_in_user = None
    return g.signed_in_user


def csrf_value(session_secret: str) -> str:
    """The double-submit token of one session: derived, so a planted cookie never matches."""
    key = str(current_app.config["SECRET_KEY"]).encode()
    return hmac.new(key, b"csrf:" + session_secret.encode(), hashlib.sha256).hexdigest()


def _accounts():  # noqa: ANN202 - the service type lives in wiring
    return current_app.extensions["deerflow_web"].accounts


def start_session(account: Account, remember: bool) -> SignedInUser:
    """Open a server-side session; its cookies are set on this request's response.

    Flask's own session is emptied too, so nothing from before signing in carries over.
    """
    secret = _accounts().open_session(account.id, persistent=bool(remember))
    if session:  # an empty one is left alone: clearing it would send a deletion cookie
        session.clear()
    user = SignedInUser(account, secret, bool(remember))
    g.signed_in_user = user
    g.auth_via = "session"
    g.new_session = user
    g.clear_session_cookies = False
    return user


def end_session() -> None:
    """End the current session server-side; its cookies are cleared on the response."""
    user = signed_in()
    if user is not None and user.session_secret:
        _accounts().end_session(user.session_secret)
    elif (secret := request.cookies.get(SESSION_COOKIE)) is not None:
        _accounts().end_session(secret)
    if session:
        session.clear()
    g.signed_in_user = None
    g.new_session = None
    g.clear_session_cookies = True


def keep_once(kind: str, label: str, value: str) -> None:
    """Keep a secret for the signed-in session to show on its next page, once.

    A page form sent with an API token instead of a session has nowhere to keep it: 403
    (the API answers such a secret in its own response).
    """
    user = signed_in()
    if user is None or user.session_secret is None:
        raise PermissionDenied("This page needs a signed-in session; scripts use the API")
    _accounts().keep_for_session(user.session_secret, kind, label, value)


def take_once(kind: str) -> list[tuple[str, str]]:
    """The secrets kept for this session (`keep_once`); gone once taken."""
    user = signed_in()
    if user is None or user.session_secret is None:
        return []
    return _accounts().take_for_session(user.session_secret, kind)


def _cookie_age(persistent: bool) -> int | None:
    return round(_accounts().session_lifetime) if persistent else None


def _set_session_cookies(response: Response, user: SignedInUser) -> None:
    """`access_token`, DeerFlow's persistence flag and `csrf_token`, with one lifetime."""
    assert user.session_secret is not None
    age = _cookie_age(user.persistent)
    secure = request.is_secure
    response.set_cookie(
        SESSION_COOKIE,
        user.session_secret,
        max_age=age,
        secure=secure,
        httponly=True,
        samesite="Lax",
    )
    response.set_cookie(
        PERSISTENT_COOKIE,
        "1" if user.persistent else "0",
        max_age=age,
        secure=secure,
        httponly=True,
        samesite="Lax",
    )
    _set_csrf_cookie(response, user)


def _set_csrf_cookie(response: Response, user: SignedInUser) -> None:
    assert user.session_secret is not None
    response.set_cookie(
        CSRF_COOKIE,
        csrf_value(user.session_secret),
        max_age=_cookie_age(user.persistent),
        secure=request.is_secure,
        httponly=False,  # the page's script reads it and echoes it in X-CSRF-Token
        samesite="Strict",
    )


def _clear_session_cookies(response: Response) -> None:
    secure = request.is_secure
    response.delete_cookie(SESSION_COOKIE, secure=secure, httponly=True, samesite="Lax")
    response.delete_cookie(PERSISTENT_COOKIE, secure=secure, httponly=True, samesite="Lax")
    response.delete_cookie(CSRF_COOKIE, secure=secure, samesite="Strict")


def _bearer_token() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _sep, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip()


def _identify() -> None:
    """Find the request's user: a Bearer token, else the `access_token` cookie.

    A bad token is refused at once (401). A dead session cookie is remembered as
    `g.session_error` and its cookies are cleared on the answer; a route that needs a
    user then answers with that error (a public one simply runs without a user).
    """
    g.auth_via = None
    g.signed_in_user = None
    g.session_error = None
    token = _bearer_token()
    if token is not None:
        account = _accounts().token_user(token)  # raises 401 token_invalid / token_expired
        g.signed_in_user = SignedInUser(account, None)
        g.auth_via = "token"
        return
    secret = request.cookies.get(SESSION_COOKIE)
    if secret is None:
        return
    try:
        live = _accounts().check_session(secret)
    except AuthError as error:
        g.session_error = error
        g.clear_session_cookies = True
        return
    g.signed_in_user = SignedInUser(live.account, secret, live.persistent)
    g.auth_via = "session"


def _needs_login() -> ResponseReturnValue | None:
    if request.path.startswith("/api/"):
        raise g.session_error or NotAuthenticated()
    if _accounts().needs_setup():
        return redirect(url_for("account_pages.setup"))
    return redirect(url_for("account_pages.login", next=request.full_path.rstrip("?")))


def _check_csrf() -> None:
    if request.method in SAFE_METHODS or request_has(CSRF_EXEMPT):
        return
    if not request.path.startswith("/api/"):
        return  # pages' forms carry Flask-WTF tokens
    user = signed_in()
    assert user is not None and user.session_secret is not None
    header = request.headers.get(CSRF_HEADER, "")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not header or not cookie:
        raise Forbidden(CSRF_MISSING)
    expected = csrf_value(user.session_secret)
    if not (hmac.compare_digest(header, cookie) and hmac.compare_digest(header, expected)):
        raise Forbidden(CSRF_MISMATCH)


def _check_password_change(user: SignedInUser) -> ResponseReturnValue | None:
    """An account with a temporary password does nothing else until it is changed."""
    if not user.account.needs_setup:
        return None
    allowed = BEFORE_PASSWORD_CHANGE if g.auth_via == "session" else BEFORE_PASSWORD_CHANGE_BY_TOKEN
    if request_has(allowed):
        return None
    if request.path.startswith("/api/") or g.auth_via == "token":
        raise Forbidden(PASSWORD_CHANGE_REQUIRED)
    return redirect(url_for("account_pages.account"))


def authenticate_request() -> ResponseReturnValue | None:
    """The app-wide gate (see the module docstring)."""
    if request.endpoint is None or request.endpoint == STATIC_ENDPOINT or request_has(PROBE):
        return None  # routing errors are answered by the error handlers
    if request.path.startswith("/api/v1/"):
        request.max_content_length = JSON_BODY_LIMIT
    _identify()
    if request_has(PUBLIC):
        return None
    user = signed_in()
    if user is None:
        return _needs_login()
    if g.auth_via == "session":
        _check_csrf()
    if (answer := _check_password_change(user)) is not None:
        return answer
    return None


def finish_response(response: Response) -> Response:
    """Cookies in step with the session (set, renewed or cleared) and no-store answers."""
    new_session = g.get("new_session")
    if new_session is not None:
        _set_session_cookies(response, new_session)
    elif g.get("clear_session_cookies"):
        _clear_session_cookies(response)
    elif g.get("auth_via") == "session":
        user = signed_in()
        if user is not None and request.cookies.get(CSRF_COOKIE) != csrf_value(
            user.session_secret or ""
        ):
            _set_csrf_cookie(response, user)
    if _depends_on_the_user():
        _no_store(response)
    return response


def _depends_on_the_user() -> bool:
    """Whether the answer is one user's: signed in, signing in or out, or about accounts."""
    if request.endpoint == STATIC_ENDPOINT:
        return False
    return (
        g.get("signed_in_user") is not None
        or g.get("new_session") is not None
        or bool(g.get("clear_session_cookies"))
        or request.blueprint in ACCOUNT_BLUEPRINTS
    )


def _no_store(response: Response) -> None:
    """`no-store`, unless the route chose to let only the user's own browser keep it."""
    if "private" in response.cache_control or response.cache_control.no_store:
        return
    response.headers["Cache-Control"] = NO_STORE


def init_app(app: Flask) -> None:
    """Install the request gate, Flask's cookie settings and the cookie/cache hook."""
    app.session_interface = FlaskSessionInterface()
    app.config["SESSION_COOKIE_NAME"] = FLASK_SESSION_COOKIE
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    app.config["SESSION_COOKIE_PATH"] = "/"  # `__Host-` needs Path=/ and no Domain
    app.config["SESSION_COOKIE_DOMAIN"] = None
    app.before_request(authenticate_request)
    app.after_request(finish_response)
