"""Account pages for people: sign in, first-run set-up, sign out, the account and admin pages.

Forms post and the server redirects. A secret shown a single time (a new API token, a
temporary password) is kept server-side for the session that asked for it, sealed with that
session's secret, and deleted as the next page shows it: a reload, or a copy of the cookie
replayed later, finds nothing. The rules are `services/accounts`' own, so a page can never
accept what the API refuses.
"""

from __future__ import annotations

from flask import Blueprint
from flask import flash
from flask import redirect
from flask import render_template
from flask import request
from flask import url_for
from flask.typing import ResponseReturnValue
from flask_babel import gettext as _

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import InvalidCredentials
from deerflow_web.errors import LockedOut
from deerflow_web.errors import PermissionDenied
from deerflow_web.errors import SelfDisable
from deerflow_web.errors import SelfReset
from deerflow_web.services.accounts.service import AccountService
from deerflow_web.services.quotas.policy import parse_quota
from deerflow_web.services.scanning.events import refusals_and_quarantine
from deerflow_web.web.accounts.forms import ChangePasswordForm
from deerflow_web.web.accounts.forms import IdForm
from deerflow_web.web.accounts.forms import LoginForm
from deerflow_web.web.accounts.forms import NewUserForm
from deerflow_web.web.accounts.forms import QuotaForm
from deerflow_web.web.accounts.forms import SetupForm
from deerflow_web.web.accounts.forms import TokenForm
from deerflow_web.web.accounts.gate import SignedInUser
from deerflow_web.web.accounts.gate import end_session
from deerflow_web.web.accounts.gate import keep_once
from deerflow_web.web.accounts.gate import signed_in
from deerflow_web.web.accounts.gate import start_session
from deerflow_web.web.accounts.gate import take_once
from deerflow_web.web.accounts.usage import owner_usage
from deerflow_web.web.marks import before_password_change
from deerflow_web.web.marks import public
from deerflow_web.web.security import safe_next
from deerflow_web.web.wiring import get_services

bp = Blueprint("account_pages", __name__)

NEW_TOKEN = "api_token"  # kinds of the secrets shown once
TEMPORARY_PASSWORD = "temporary_password"


def _service() -> AccountService:
    return get_services().accounts


def _user() -> SignedInUser:
    """The signed-in user, by session: these pages act on what only a session has (its
    one-time secrets, its cookies); an API token is refused before anything is done."""
    user = signed_in()
    assert user is not None  # the request gate let only signed-in users through
    if user.session_secret is None:
        raise PermissionDenied(_("This page needs a signed-in session; scripts use the API."))
    return user


def _home() -> str:
    return url_for("pages.index")


@bp.route("/login", methods=["GET", "POST"])
@public
def login() -> ResponseReturnValue:
    """Sign in and go back to the page that asked for it (a local path only)."""
    service = _service()
    if service.needs_setup():
        return redirect(url_for("account_pages.setup"))
    form = LoginForm(next=request.args.get("next", ""))
    target = safe_next(form.next.data, _home())
    if signed_in() is not None and request.method == "GET":
        return redirect(target)
    status = 200
    if form.validate_on_submit():
        try:
            account = service.authenticate(
                form.email.data, form.password.data, request.remote_addr or ""
            )
        except LockedOut as error:
            flash(_("Too many failed sign-ins. Try again in a few minutes."), "error")
            page = render_template("pages/login.html", form=form)
            return page, 429, {"Retry-After": str(error.retry_after)}
        except InvalidCredentials:
            flash(_("Incorrect email or password."), "error")
            status = 401
        else:
            start_session(account, bool(form.remember_me.data))
            if account.needs_setup:
                flash(_("Choose a new password to finish signing in."), "error")
                target = url_for("account_pages.account")
            return redirect(target)
    elif request.method == "POST":
        status = 400
    return render_template("pages/login.html", form=form), status


@bp.route("/setup", methods=["GET", "POST"])
@public
def setup() -> ResponseReturnValue:
    """Create the first admin (only while no admin exists), then sign them in."""
    service = _service()
    if not service.needs_setup():
        return redirect(url_for("account_pages.login"))
    form = SetupForm()
    status = 200
    if form.validate_on_submit():
        try:
            account = service.initialize(form.email.data, form.password.data)
        except DeerFlowError as error:
            flash(str(error), "error")
            status = 400
        else:
            start_session(account, True)
            flash(_("Welcome! Your admin account is ready."), "success")
            return redirect(_home())
    elif request.method == "POST":
        status = 400
    return render_template("pages/setup.html", form=form), status


@bp.post("/logout")
@before_password_change()
def logout() -> ResponseReturnValue:
    """Sign out everywhere this session reached (the row is deleted server-side)."""
    if IdForm().validate_on_submit():
        end_session()
        flash(_("You are signed out."), "success")
        return redirect(url_for("account_pages.login"))
    return redirect(_home())


def _account_page(status: int = 200, **forms: object) -> ResponseReturnValue:
    user = _user()
    context = {
        "password_form": ChangePasswordForm(formdata=None),
        "token_form": TokenForm(formdata=None),
        "revoke_form": IdForm(formdata=None),
        "new_token": None,
    }
    context.update(forms)
    return (
        render_template(
            "pages/account.html",
            account=user.account,
            tokens=_service().list_tokens(user.id),
            **context,
        ),
        status,
    )


@bp.get("/account")
@before_password_change()
def account() -> ResponseReturnValue:
    """Change the password; create and revoke API tokens (a new one is shown this once)."""
    shown = take_once(NEW_TOKEN)
    new_token = {"name": shown[-1][0], "secret": shown[-1][1]} if shown else None
    return _account_page(new_token=new_token)


@bp.post("/account/password")
@before_password_change()
def change_password() -> ResponseReturnValue:
    """Change the password; other sessions of the account end (this one gets a new id)."""
    form = ChangePasswordForm()
    if not form.validate_on_submit():
        return _account_page(400, password_form=form)
    user = _user()
    try:
        revoked = _service().change_password(
            user.id,
            form.current_password.data,
            form.new_password.data,
            address=request.remote_addr or "",
            revoke_tokens=bool(form.revoke_tokens.data),
        )
    except LockedOut as error:
        flash(_("Too many failed sign-ins. Try again in a few minutes."), "error")
        page, status = _account_page(429, password_form=form)
        return page, status, {"Retry-After": str(error.retry_after)}
    except DeerFlowError as error:
        flash(str(error), "error")
        return _account_page(400, password_form=form)
    start_session(_service().get_user(user.id), user.persistent)
    flash(_("Password changed. Your other sessions were signed out."), "success")
    if revoked:
        flash(_("%(count)d API tokens were revoked.", count=revoked), "success")
    return redirect(url_for("account_pages.account"))


@bp.post("/account/tokens")
def create_token() -> ResponseReturnValue:
    """Create an API token and show it this once."""
    form = TokenForm()
    if not form.validate_on_submit():
        return _account_page(400, token_form=form)
    created = _service().create_token(_user().id, form.name.data, form.expires_in_days.data)
    # Post/redirect/get, so a reload cannot create a second token; the secret waits
    # server-side for this session's next view of the page, which deletes it.
    keep_once(NEW_TOKEN, created.token.name, created.secret)
    return redirect(url_for("account_pages.account"))


@bp.post("/account/tokens/<token_id>/revoke")
def revoke_token(token_id: str) -> ResponseReturnValue:
    """Revoke one of the caller's tokens."""
    if IdForm().validate_on_submit():
        try:
            _service().revoke_token(_user().id, token_id)
        except DeerFlowError as error:
            flash(str(error), "error")
        else:
            flash(_("Token revoked."), "success")
    return redirect(url_for("account_pages.account"))


def _admin() -> SignedInUser:
    user = _user()
    if not user.account.is_admin:
        raise PermissionDenied(_("Only admins can manage users."))
    return user


def _admin_page(status: int = 200, **context: object) -> ResponseReturnValue:
    admin = _admin()
    values = {"new_user_form": NewUserForm(formdata=None), "temporary": None}
    values.update(context)
    users = _service().list_users()
    overrides = get_services().quotas.overrides
    return (
        render_template(
            "pages/admin.html",
            me=admin.account,
            users=users,
            usage_by_user={user.id: owner_usage(user.id) for user in users},
            own_quota={user.id: overrides.get(user.id)[0] for user in users},
            action_form=IdForm(formdata=None),
            quota_form=QuotaForm(formdata=None),
            **values,
        ),
        status,
    )


@bp.get("/admin")
def admin() -> ResponseReturnValue:
    """Users: create, disable or enable, reset a password (shown here once)."""
    _admin()
    shown = take_once(TEMPORARY_PASSWORD)
    return _admin_page(temporary=shown[-1] if shown else None)


@bp.get("/admin/refused-uploads")
def refused_uploads() -> ResponseReturnValue:
    """What the virus scanner kept out: refused uploads and quarantined files, newest first."""
    _admin()
    events = refusals_and_quarantine(get_services().scan_events)
    scanning = get_services().scanner is not None
    return render_template("pages/refused_uploads.html", events=events, scanning=scanning)


@bp.post("/admin/users")
def create_user() -> ResponseReturnValue:
    """Create an account."""
    _admin()
    form = NewUserForm()
    if not form.validate_on_submit():
        return _admin_page(400, new_user_form=form)
    try:
        account = _service().create_user(
            form.email.data, form.password.data, role=form.system_role.data
        )
    except DeerFlowError as error:
        flash(str(error), "error")
        return _admin_page(400, new_user_form=form)
    flash(_("Created %(email)s.", email=account.email), "success")
    return redirect(url_for("account_pages.admin"))


@bp.post("/admin/users/<user_id>/<action>")
def user_action(user_id: str, action: str) -> ResponseReturnValue:
    """Disable, enable, or reset the password of one account."""
    admin = _admin()
    if not IdForm().validate_on_submit() or action not in {"disable", "enable", "reset"}:
        return redirect(url_for("account_pages.admin"))
    service = _service()
    try:
        if action == "reset":
            reset = service.reset_password(user_id, acting_user_id=admin.id)
            assert reset.temporary_password is not None
            keep_once(TEMPORARY_PASSWORD, reset.account.email, reset.temporary_password)
            return redirect(url_for("account_pages.admin"))
        change = service.set_disabled(user_id, action == "disable", acting_user_id=admin.id)
        email = change.account.email
        if action == "disable":
            flash(_("Disabled %(email)s.", email=email), "success")
            if change.revoked_tokens:
                count = change.revoked_tokens
                flash(_("%(count)d API tokens were revoked.", count=count), "success")
        else:
            flash(_("Enabled %(email)s.", email=email), "success")
    except SelfDisable:
        flash(_("You cannot disable your own account."), "error")
    except SelfReset:
        flash(_("Change your own password on your account page."), "error")
    except DeerFlowError as error:
        flash(str(error), "error")
    return redirect(url_for("account_pages.admin"))


@bp.post("/admin/users/<user_id>/quota")
def set_quota(user_id: str) -> ResponseReturnValue:
    """Set an account's storage quota in MiB (empty: the default, 0: unlimited)."""
    _admin()
    form = QuotaForm()
    if not form.validate_on_submit():
        for errors in form.errors.values():
            for error in errors:
                flash(str(error), "error")
        return _admin_page(400)
    try:
        account = _service().get_user(user_id)
        overrides = get_services().quotas.overrides
        raw = (form.quota_mib.data or "").strip()
        if not raw:
            overrides.clear(user_id)
        else:
            overrides.set(user_id, parse_quota(int(raw) * 1024 * 1024))
    except DeerFlowError as error:
        flash(str(error), "error")
        return _admin_page(400)
    flash(_("Saved the storage quota of %(email)s.", email=account.email), "success")
    return redirect(url_for("account_pages.admin"))
