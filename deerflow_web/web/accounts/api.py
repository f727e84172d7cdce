"""DeerFlow's account endpoints (`/api/v1/auth`) and the admin API (`/api/v1/admin`), SPEC 7.2.

Paths, fields, status codes and the `{"detail": {"code", "message"}}` error shape follow
DeerFlow's gateway, so its frontend can sign in here; API tokens and the admin endpoints
are this project's additions. The rules live in `services/accounts`.

With accounts off, `single_user_bp` answers `/me` and `/setup-status` as DeerFlow does
with `DEER_FLOW_AUTH_DISABLED=1` (its synthetic admin `default@test.local`), because
DeerFlow's UI asks both on every page.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from flask import Response
from flask import jsonify
from flask import request
from flask.typing import ResponseReturnValue

from deerflow_web.errors import InvalidInput
from deerflow_web.errors import InvalidQuota
from deerflow_web.errors import NotAuthenticated
from deerflow_web.errors import PermissionDenied
from deerflow_web.errors import RegistrationDisabled
from deerflow_web.models import SINGLE_USER as NO_ACCOUNT
from deerflow_web.services.accounts.service import ADMIN
from deerflow_web.services.accounts.service import USER
from deerflow_web.services.accounts.service import Account
from deerflow_web.services.accounts.service import AccountService
from deerflow_web.services.accounts.service import ApiToken
from deerflow_web.services.quotas.policy import parse_quota
from deerflow_web.settings import parse_bool
from deerflow_web.web.accounts.gate import NO_STORE
from deerflow_web.web.accounts.gate import SignedInUser
from deerflow_web.web.accounts.gate import end_session
from deerflow_web.web.accounts.gate import signed_in
from deerflow_web.web.accounts.gate import start_session
from deerflow_web.web.accounts.usage import owner_usage
from deerflow_web.web.marks import before_password_change
from deerflow_web.web.marks import csrf_exempt
from deerflow_web.web.marks import public
from deerflow_web.web.wiring import get_services

bp = Blueprint("auth_api", __name__, url_prefix="/api/v1/auth")
admin_bp = Blueprint("admin_api", __name__, url_prefix="/api/v1/admin")
single_user_bp = Blueprint("single_user_auth", __name__, url_prefix="/api/v1/auth")

# DeerFlow's synthetic user of DEER_FLOW_AUTH_DISABLED=1 (`app/gateway/auth_disabled.py`).
SINGLE_USER = {
    "id": "default",
    "email": "default@test.local",
    "system_role": "admin",
    "needs_setup": False,
    "oauth_provider": None,
}


def _service() -> AccountService:
    return get_services().accounts


def json_body() -> dict[str, Any]:
    """The request's JSON object; anything else is a 422 with DeerFlow's list detail."""
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise InvalidInput("Input should be a valid dictionary", ("body",), None)
    return data


def _field(data: dict[str, Any], name: str) -> Any:
    if name not in data or data[name] is None:
        raise InvalidInput("Field required", ("body", name))
    if not isinstance(data[name], str):
        raise InvalidInput("Input should be a valid string", ("body", name), data[name])
    return data[name]


def _remember(value: object) -> bool:
    """DeerFlow's `remember_me`: persistent unless the client says otherwise."""
    return True if value is None else parse_bool(value)


def _json_remember(data: dict[str, Any]) -> bool | None:
    """`remember_me` of a JSON body: a boolean, or None when absent."""
    value = data.get("remember_me")
    if value is not None and not isinstance(value, bool):
        raise InvalidInput("Input should be a valid boolean", ("body", "remember_me"), value)
    return value


def _user() -> SignedInUser:
    user = signed_in()
    if user is None:
        raise NotAuthenticated()
    return user


def _with_session(account: Account, remember: bool, body: Any, status: int) -> Response:
    """Sign the account in: `access_token`, its companion and `csrf_token` are set."""
    start_session(account, remember)
    response = jsonify(body)
    response.status_code = status
    return response


def _token_json(token: ApiToken) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
        "last_used_at": token.last_used_at,
    }


@bp.get("/setup-status")
@public
def setup_status() -> ResponseReturnValue:
    """Whether the first admin still has to be created."""
    return {
        "needs_setup": _service().needs_setup(),
        "registration_enabled": get_services().settings.auth.registration_enabled,
    }


@bp.post("/initialize")
@public
@csrf_exempt
def initialize() -> ResponseReturnValue:
    """Create the first admin and sign them in (409 once an admin exists)."""
    data = json_body()
    remember = _remember(_json_remember(data))  # checked before anything is created
    account = _service().initialize(_field(data, "email"), _field(data, "password"))
    return _with_session(account, remember, account.as_response(), 201)


@bp.post("/login/local")
@public
@csrf_exempt
def login_local() -> ResponseReturnValue:
    """Form-encoded `username` (the email) and `password`, as DeerFlow's OAuth2 form."""
    username = request.form.get("username")
    password = request.form.get("password")
    if not username:
        raise InvalidInput("Field required", ("body", "username"))
    if not password:
        raise InvalidInput("Field required", ("body", "password"))
    account = _service().authenticate(username, password, request.remote_addr or "")
    remember = _remember(request.form.get("remember_me"))
    body = {
        "expires_in": round(_service().session_lifetime),
        "needs_setup": account.needs_setup,
    }
    return _with_session(account, remember, body, 200)


@bp.post("/logout")
@public
@csrf_exempt
def logout() -> ResponseReturnValue:
    """End the session here and on the server; cookies are cleared."""
    end_session()
    return {"message": "Successfully logged out"}


@bp.get("/me")
@before_password_change()
def me() -> ResponseReturnValue:
    """The signed-in account, with what it stores and may store."""
    user = _user()
    return {**user.account.as_response(), "usage": owner_usage(user.id).as_dict()}


@bp.post("/change-password")
@before_password_change(by_token=True)
def change_password() -> ResponseReturnValue:
    """Change the password (and, with `new_email`, the email); every other session ends.

    A session caller gets a fresh session (new cookies, its persistence kept unless
    `remember_me` says otherwise); `revoke_tokens: true` revokes every API token too.
    """
    data = json_body()
    user = _user()
    remember = _json_remember(data)
    new_email = data.get("new_email")
    revoke = data.get("revoke_tokens", False)
    if not isinstance(revoke, bool):
        raise InvalidInput("Input should be a valid boolean", ("body", "revoke_tokens"), revoke)
    service = _service()
    revoked = service.change_password(
        user.id,
        _field(data, "current_password"),
        _field(data, "new_password"),
        address=request.remote_addr or "",
        new_email=new_email,
        revoke_tokens=revoke,
    )
    if user.session_secret is not None:
        start_session(
            service.get_user(user.id), user.persistent if remember is None else _remember(remember)
        )
    return {"message": "Password changed successfully", "revoked_tokens": revoked}


@bp.post("/register")
@public
@csrf_exempt
def register() -> ResponseReturnValue:
    """Self-registration, only with `auth.registration_enabled: true`."""
    if not get_services().settings.auth.registration_enabled:
        raise RegistrationDisabled()
    data = json_body()
    remember = _remember(_json_remember(data))  # checked before anything is created
    account = _service().create_user(_field(data, "email"), _field(data, "password"))
    return _with_session(account, remember, account.as_response(), 201)


@bp.post("/tokens")
def create_token() -> ResponseReturnValue:
    """A personal API token; its secret is in this answer and never again."""
    data = json_body()
    created = _service().create_token(_user().id, data.get("name"), data.get("expires_in_days"))
    body = _token_json(created.token)
    body.pop("last_used_at")
    body["token"] = created.secret
    return body, 201


@bp.get("/tokens")
def list_tokens() -> ResponseReturnValue:
    """The caller's tokens, without their secrets."""
    return {"tokens": [_token_json(token) for token in _service().list_tokens(_user().id)]}


@bp.delete("/tokens/<token_id>")
def revoke_token(token_id: str) -> ResponseReturnValue:
    """Revoke one of the caller's tokens (someone else's is 404)."""
    _service().revoke_token(_user().id, token_id)
    return "", 204


def _admin() -> SignedInUser:
    user = _user()
    if not user.account.is_admin:
        raise PermissionDenied("Permission denied: admin role required")
    return user


@admin_bp.get("/users")
def list_users() -> ResponseReturnValue:
    """Every account."""
    _admin()
    return {
        "users": [
            {**account.as_response(), "disabled": account.disabled}
            for account in _service().list_users()
        ]
    }


@admin_bp.post("/users")
def create_user() -> ResponseReturnValue:
    """Create an account with a role."""
    _admin()
    data = json_body()
    role = data.get("system_role", USER)
    if role not in (ADMIN, USER):
        raise InvalidInput("Input should be 'admin' or 'user'", ("body", "system_role"), role)
    account = _service().create_user(_field(data, "email"), _field(data, "password"), role=role)
    return account.as_response(), 201


@admin_bp.post("/users/<user_id>/disable")
def disable_user(user_id: str) -> ResponseReturnValue:
    """Disable an account: its sessions end and its API tokens are revoked, at once."""
    admin = _admin()
    change = _service().set_disabled(user_id, True, acting_user_id=admin.id)
    return {
        **change.account.as_response(),
        "disabled": True,
        "revoked_tokens": change.revoked_tokens,
    }


@admin_bp.post("/users/<user_id>/enable")
def enable_user(user_id: str) -> ResponseReturnValue:
    """Enable a disabled account again (its revoked tokens stay revoked)."""
    _admin()
    change = _service().set_disabled(user_id, False)
    return {**change.account.as_response(), "disabled": False}


@admin_bp.post("/users/<user_id>/reset-password")
def reset_password(user_id: str) -> ResponseReturnValue:
    """A temporary password the user must change at their next sign-in; their sessions
    end and their API tokens are revoked."""
    admin = _admin()
    reset = _service().reset_password(user_id, acting_user_id=admin.id)
    return {
        "temporary_password": reset.temporary_password,
        "revoked_tokens": reset.revoked_tokens,
        "message": "Temporary password set; the user's sessions ended and API tokens were revoked",
    }


def _quota_json(user_id: str) -> dict[str, Any]:
    policy = get_services().quotas
    has_own, _own = policy.overrides.get(user_id)
    usage = owner_usage(user_id)
    return {
        "user_id": user_id,
        "quota_bytes": usage.quota_bytes,
        "default": not has_own,
        "usage": usage.as_dict(),
    }


@admin_bp.get("/users/<user_id>/quota")
def get_quota(user_id: str) -> ResponseReturnValue:
    """An account's storage quota and usage."""
    _admin()
    _service().get_user(user_id)  # 404 for an unknown account
    return _quota_json(user_id)


@admin_bp.put("/users/<user_id>/quota")
def set_quota(user_id: str) -> ResponseReturnValue:
    """Give an account its own quota (`quota_bytes`: bytes, 0 or null for unlimited)."""
    _admin()
    data = json_body()
    if "quota_bytes" not in data:
        raise InvalidQuota("quota_bytes is required: a whole number of bytes, 0 or null")
    quota = parse_quota(data["quota_bytes"])
    _service().get_user(user_id)
    get_services().quotas.overrides.set(user_id, quota)
    return _quota_json(user_id)


@admin_bp.delete("/users/<user_id>/quota")
def clear_quota(user_id: str) -> ResponseReturnValue:
    """Let the configured default quota apply to the account again."""
    _admin()
    _service().get_user(user_id)
    get_services().quotas.overrides.clear(user_id)
    return _quota_json(user_id)


def _single_user(body: dict[str, Any]) -> Response:
    response = jsonify(body)
    response.headers["Cache-Control"] = NO_STORE
    return response


@single_user_bp.get("/me")
def single_user_me() -> ResponseReturnValue:
    """The one local user of the single-user mode, as DeerFlow answers it, with what the
    one owner stores and may store."""
    return _single_user({**SINGLE_USER, "usage": owner_usage(NO_ACCOUNT).as_dict()})


@single_user_bp.get("/setup-status")
def single_user_setup_status() -> ResponseReturnValue:
    """Nothing to set up: the single-user mode has no accounts to create."""
    return _single_user({"needs_setup": False, "registration_enabled": False})
