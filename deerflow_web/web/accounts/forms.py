"""Flask-WTF forms of the account pages: sign in, set-up, password, tokens, admin."""

from __future__ import annotations

from flask_babel import lazy_gettext as _l
from wtforms import BooleanField
from wtforms import EmailField
from wtforms import HiddenField
from wtforms import IntegerField
from wtforms import PasswordField
from wtforms import SelectField
from wtforms import StringField
from wtforms.validators import DataRequired
from wtforms.validators import InputRequired
from wtforms.validators import NumberRange
from wtforms.validators import Optional
from wtforms.validators import Regexp

from deerflow_web.web.files.forms import PageForm


class LoginForm(PageForm):
    """Email and password; `next` carries the page to return to."""

    email = EmailField(_l("Email"), validators=[DataRequired(_l("Enter your email."))])
    password = PasswordField(_l("Password"), validators=[InputRequired(_l("Enter your password."))])
    remember_me = BooleanField(_l("Keep me signed in for 7 days"))
    next = HiddenField()


class SetupForm(PageForm):
    """The first admin account."""

    email = EmailField(_l("Email"), validators=[DataRequired(_l("Enter your email."))])
    password = PasswordField(_l("Password"), validators=[InputRequired(_l("Choose a password."))])


class ChangePasswordForm(PageForm):
    """The current password and a new one."""

    current_password = PasswordField(
        _l("Current password"), validators=[InputRequired(_l("Enter your current password."))]
    )
    new_password = PasswordField(
        _l("New password"), validators=[InputRequired(_l("Choose a new password."))]
    )
    revoke_tokens = BooleanField(_l("Also revoke all my API tokens"))


class TokenForm(PageForm):
    """A named API token, optionally expiring."""

    name = StringField(_l("Token name"), validators=[DataRequired(_l("Name the token."))])
    expires_in_days = IntegerField(
        _l("Expires after (days, empty for never)"),
        validators=[Optional(), NumberRange(min=1, max=3650)],
    )


class IdForm(PageForm):
    """A button that acts on one token or user (the id is in the URL)."""


def role_choices() -> list[tuple[str, object]]:
    """The two roles of SPEC 7.2, in words."""
    return [("user", _l("User")), ("admin", _l("Admin"))]


class NewUserForm(PageForm):
    """An account created by an admin."""

    email = EmailField(_l("Email"), validators=[DataRequired(_l("Enter an email."))])
    password = PasswordField(_l("Password"), validators=[InputRequired(_l("Choose a password."))])
    system_role = SelectField(_l("Role"), choices=role_choices, default="user")


class QuotaForm(PageForm):
    """An account's storage quota, in MiB: empty for the configured default, 0 for none."""

    quota_mib = StringField(
        _l("Quota in MiB (0: unlimited, empty: the default)"),
        validators=[
            Optional(),
            Regexp(r"^\s*\d{1,10}\s*$", message=_l("Enter a whole number of MiB.")),
        ],
    )
