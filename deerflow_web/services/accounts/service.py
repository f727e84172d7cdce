"""Accounts: users, server-side sessions, API tokens, login lockouts (SPEC 7.2, 7.3, 7.5).

Plain Python over the shared database, so every server process sees the same sessions,
revocations and failure counts. Secrets (session ids, API tokens) are random, handed out
once and stored only as SHA-256 hashes: a copy of the database signs nobody in.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy import and_
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from deerflow_web.errors import AlreadyInitialized
from deerflow_web.errors import EmailTaken
from deerflow_web.errors import InvalidCredentials
from deerflow_web.errors import InvalidInput
from deerflow_web.errors import LockedOut
from deerflow_web.errors import SelfDisable
from deerflow_web.errors import TokenExpired
from deerflow_web.errors import TokenInvalid
from deerflow_web.errors import TokenNotFound
from deerflow_web.errors import UserNotFound
from deerflow_web.errors import WrongPassword
from deerflow_web.services.accounts.passwords import Passwords
from deerflow_web.services.accounts.passwords import check_password_rules
from deerflow_web.services.accounts.passwords import normalize_email
from deerflow_web.storage.database import api_tokens
from deerflow_web.storage.database import login_failures
from deerflow_web.storage.database import sessions
from deerflow_web.storage.database import users
from deerflow_web.storage.database import write_transaction
from deerflow_web.storage.paths import validate_user_id

ADMIN = "admin"
USER = "user"
ROLES = (ADMIN, USER)

SESSION_SECONDS = 7 * 24 * 3600  # remember_me; a browser session is checked against it too
LOCKOUT_ATTEMPTS = 5
LOCKOUT_WINDOW = 5 * 60
TOKEN_PREFIX = "dfw_"
MAX_TOKEN_NAME = 100
MAX_TOKEN_DAYS = 3650


@dataclass(frozen=True)
class Account:
    """One user as the rest of the app sees it (never the password hash)."""

    id: str
    email: str
    system_role: str
    needs_setup: bool
    disabled: bool
    created_at: float

    @property
    def is_admin(self) -> bool:
        return self.system_role == ADMIN

    def as_response(self) -> dict[str, object]:
        """DeerFlow's UserResponse (SPEC 7.2)."""
        return {
            "id": self.id,
            "email": self.email,
            "system_role": self.system_role,
            "needs_setup": self.needs_setup,
            "oauth_provider": None,
        }


@dataclass(frozen=True)
class ApiToken:
    """A token's public facts; the secret itself is shown once, at creation."""

    id: str
    name: str
    created_at: float
    expires_at: float | None
    last_used_at: float | None


@dataclass(frozen=True)
class NewApiToken:
    """A freshly created token with its secret."""

    token: ApiToken
    secret: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _account(row: object) -> Account:
    return Account(
        id=row.id,
        email=row.email,
        system_role=row.system_role,
        needs_setup=bool(row.needs_setup),
        disabled=bool(row.disabled),
        created_at=row.created_at,
    )


def _api_token(row: object) -> ApiToken:
    return ApiToken(row.id, row.name, row.created_at, row.expires_at, row.last_used_at)


class AccountService:
    """Users, sessions, tokens and lockouts over one SQLAlchemy engine."""

    def __init__(
        self,
        engine: Engine,
        passwords: Passwords | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.passwords = passwords or Passwords()
        self._clock = clock

    # -- users -------------------------------------------------------------------------

    def needs_setup(self) -> bool:
        """True until the first admin exists (SPEC 7.1)."""
        with self.engine.connect() as db:
            count = db.execute(
                select(func.count()).select_from(users).where(users.c.system_role == ADMIN)
            ).scalar_one()
        return count == 0

    def create_user(
        self,
        email: object,
        password: object,
        *,
        role: str = USER,
        needs_setup: bool = False,
        user_id: str | None = None,
    ) -> Account:
        """Create an account after checking the email and the password rules.

        `user_id` is for fixtures and imports that need a known id; it must be a safe
        folder name (SPEC 1.5). New accounts get a UUID.
        """
        address = normalize_email(email)
        check_password_rules(password)
        if role not in ROLES:
            raise InvalidInput("Input should be 'admin' or 'user'", ("body", "system_role"), role)
        values = {
            "id": validate_user_id(user_id) if user_id is not None else str(uuid.uuid4()),
            "email": address,
            "password_hash": self.passwords.hash(password),  # type: ignore[arg-type]
            "system_role": role,
            "needs_setup": needs_setup,
            "disabled": False,
            "created_at": self._clock(),
        }
        try:
            with write_transaction(self.engine) as db:
                db.execute(insert(users).values(**values))
        except IntegrityError:
            raise EmailTaken() from None
        return self.get_user(values["id"])

    def initialize(self, email: object, password: object) -> Account:
        """Create the first admin; refused once any admin exists.

        The check and the insert share one transaction; of two set-ups racing, the loser
        finds the winner's admin (or the same email) and gets AlreadyInitialized.
        """
        if not self.needs_setup():
            raise AlreadyInitialized()
        try:
            account = self.create_user(email, password, role=ADMIN)
        except EmailTaken:
            raise AlreadyInitialized() from None
        with self.engine.connect() as db:
            first = db.execute(
                select(users.c.id)
                .where(users.c.system_role == ADMIN)
                .order_by(users.c.created_at, users.c.id)
                .limit(1)
            ).scalar_one()
        if first != account.id:  # another set-up won the race: undo ours
            with write_transaction(self.engine) as db:
                db.execute(delete(users).where(users.c.id == account.id))
            raise AlreadyInitialized()
        return account

    def get_user(self, user_id: str) -> Account:
        with self.engine.connect() as db:
            row = db.execute(select(users).where(users.c.id == user_id)).first()
        if row is None:
            raise UserNotFound()
        return _account(row)

    def find_by_email(self, email: str) -> Account | None:
        with self.engine.connect() as db:
            row = db.execute(select(users).where(users.c.email == email.strip().lower())).first()
        return None if row is None else _account(row)

    def list_users(self) -> list[Account]:
        with self.engine.connect() as db:
            rows = db.execute(select(users).order_by(users.c.created_at, users.c.email)).all()
        return [_account(row) for row in rows]

    def set_disabled(
        self, user_id: str, disabled: bool, *, acting_user_id: str | None = None
    ) -> Account:
        """Disable or enable an account; disabling ends its sessions at once.

        Tokens are checked against the account on every use, so they stop with it and
        work again when it is enabled. The admin acting (`acting_user_id`) cannot disable
        themselves (`SelfDisable`), so whoever acts always keeps a way back in.
        """
        if disabled and user_id == acting_user_id:
            raise SelfDisable()
        with write_transaction(self.engine) as db:
            result = db.execute(
                update(users).where(users.c.id == user_id).values(disabled=disabled)
            )
            if result.rowcount == 0:
                raise UserNotFound()
            if disabled:
                db.execute(delete(sessions).where(sessions.c.user_id == user_id))
        return self.get_user(user_id)

    def reset_password(self, user_id: str) -> str:
        """Give the account a random temporary password it must change; end its sessions."""
        temporary = secrets.token_urlsafe(12)
        with write_transaction(self.engine) as db:
            result = db.execute(
                update(users)
                .where(users.c.id == user_id)
                .values(password_hash=self.passwords.hash(temporary), needs_setup=True)
            )
            if result.rowcount == 0:
                raise UserNotFound()
            db.execute(delete(sessions).where(sessions.c.user_id == user_id))
        return temporary

    def change_password(
        self, user_id: str, current: object, new: object, *, keep_session: str | None = None
    ) -> None:
        """Set a new password after checking the current one; every other session ends."""
        if not isinstance(current, str):
            raise WrongPassword("Current password is incorrect")
        check_password_rules(new)
        with self.engine.connect() as db:
            stored = db.execute(
                select(users.c.password_hash).where(users.c.id == user_id)
            ).scalar_one_or_none()
        if stored is None:
            raise UserNotFound()
        if not self.passwords.verify(stored, current):
            raise WrongPassword("Current password is incorrect")
        keep = _digest(keep_session) if keep_session else ""
        with write_transaction(self.engine) as db:
            db.execute(
                update(users)
                .where(users.c.id == user_id)
                .values(password_hash=self.passwords.hash(new), needs_setup=False)  # type: ignore[arg-type]
            )
            db.execute(
                delete(sessions).where(sessions.c.user_id == user_id, sessions.c.id_hash != keep)
            )

    # -- login and lockout ---------------------------------------------------------------

    def _retry_after(self, db: object, address: str, email: str, now: float) -> int | None:
        """Seconds until the lockout ends, or None when neither subject is locked.

        A subject is locked for five minutes from the failure that made five within five
        minutes. Attempts refused while locked are not counted, so the lock ends on time.
        """
        waits = []
        for kind, subject in (("address", address), ("account", email)):
            if not subject:
                continue
            times = (
                db.execute(  # type: ignore[attr-defined]
                    select(login_failures.c.at)
                    .where(
                        login_failures.c.kind == kind,
                        login_failures.c.subject == subject,
                        login_failures.c.at > now - 2 * LOCKOUT_WINDOW,
                    )
                    .order_by(login_failures.c.at)
                )
                .scalars()
                .all()
            )
            span = LOCKOUT_ATTEMPTS - 1
            ends = [
                times[index] + LOCKOUT_WINDOW
                for index in range(span, len(times))
                if times[index] - times[index - span] <= LOCKOUT_WINDOW
            ]
            if ends and max(ends) > now:
                waits.append(max(1, math.ceil(max(ends) - now)))
        return max(waits) if waits else None

    def authenticate(self, email: object, password: object, address: str) -> Account:
        """Check a login; failures are counted per address and per account in the database.

        Raises:
            LockedOut: 5 failures for the address or the account in the last 5 minutes.
            InvalidCredentials: Wrong or unknown email, wrong password, disabled account.
        """
        now = self._clock()
        subject = email.strip().lower() if isinstance(email, str) else ""
        with self.engine.connect() as db:
            wait = self._retry_after(db, address, subject, now)
        if wait is not None:
            raise LockedOut(wait)
        with self.engine.connect() as db:
            row = db.execute(select(users).where(users.c.email == subject)).first()
        text = password if isinstance(password, str) else ""
        matches = self.passwords.verify(row.password_hash if row is not None else None, text)
        if not matches or row is None or row.disabled:
            with write_transaction(self.engine) as db:
                db.execute(
                    insert(login_failures),
                    [
                        {"kind": "address", "subject": address, "at": now},
                        {"kind": "account", "subject": subject, "at": now},
                    ],
                )
                db.execute(delete(login_failures).where(login_failures.c.at < now - 86400))
            raise InvalidCredentials()
        with write_transaction(self.engine) as db:
            db.execute(
                delete(login_failures).where(
                    login_failures.c.kind == "account", login_failures.c.subject == subject
                )
            )
        return _account(row)

    # -- sessions ------------------------------------------------------------------------

    def open_session(self, user_id: str) -> str:
        """Start a server-side session and return its secret (it goes into the cookie)."""
        secret = secrets.token_urlsafe(32)
        now = self._clock()
        with write_transaction(self.engine) as db:
            db.execute(
                insert(sessions).values(
                    id_hash=_digest(secret),
                    user_id=user_id,
                    created_at=now,
                    expires_at=now + SESSION_SECONDS,
                )
            )
        return secret

    def session_user(self, secret: str) -> Account | None:
        """The active account of a live session, or None (ended, expired, disabled)."""
        if not isinstance(secret, str) or not secret:
            return None
        with self.engine.connect() as db:
            row = db.execute(
                select(users)
                .join(sessions, sessions.c.user_id == users.c.id)
                .where(sessions.c.id_hash == _digest(secret), sessions.c.expires_at > self._clock())
            ).first()
        if row is None or row.disabled:
            return None
        return _account(row)

    def end_session(self, secret: str) -> None:
        with write_transaction(self.engine) as db:
            db.execute(delete(sessions).where(sessions.c.id_hash == _digest(secret)))

    # -- API tokens ----------------------------------------------------------------------

    def create_token(
        self, user_id: str, name: object, expires_in_days: object = None
    ) -> NewApiToken:
        """A new token: 32 random bytes, shown once, stored as a hash."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput("Field required", ("body", "name"), name)
        if len(name.strip()) > MAX_TOKEN_NAME:
            raise InvalidInput(
                f"String should have at most {MAX_TOKEN_NAME} characters", ("body", "name"), name
            )
        if isinstance(expires_in_days, float) and expires_in_days.is_integer():
            expires_in_days = int(expires_in_days)  # JSON's 30.0 is the integer 30
        if expires_in_days is not None and (
            isinstance(expires_in_days, bool)
            or not isinstance(expires_in_days, int)
            or not 1 <= expires_in_days <= MAX_TOKEN_DAYS
        ):
            raise InvalidInput(
                f"Input should be a whole number of days from 1 to {MAX_TOKEN_DAYS}",
                ("body", "expires_in_days"),
                expires_in_days,
            )
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self._clock()
        token = ApiToken(
            id=str(uuid.uuid4()),
            name=name.strip(),
            created_at=now,
            expires_at=None if expires_in_days is None else now + expires_in_days * 86400,
            last_used_at=None,
        )
        with write_transaction(self.engine) as db:
            db.execute(
                insert(api_tokens).values(
                    id=token.id,
                    token_hash=_digest(secret),
                    user_id=user_id,
                    name=token.name,
                    created_at=token.created_at,
                    expires_at=token.expires_at,
                )
            )
        return NewApiToken(token, secret)

    def list_tokens(self, user_id: str) -> list[ApiToken]:
        with self.engine.connect() as db:
            rows = db.execute(
                select(api_tokens)
                .where(api_tokens.c.user_id == user_id)
                .order_by(api_tokens.c.created_at, api_tokens.c.id)
            ).all()
        return [_api_token(row) for row in rows]

    def revoke_token(self, user_id: str, token_id: str) -> None:
        """Delete one of the caller's tokens; someone else's is 'not found'."""
        with write_transaction(self.engine) as db:
            result = db.execute(
                delete(api_tokens).where(
                    api_tokens.c.id == token_id, api_tokens.c.user_id == user_id
                )
            )
        if result.rowcount == 0:
            raise TokenNotFound()

    def token_user(self, secret: str) -> Account:
        """The owner of a Bearer token, or TokenInvalid / TokenExpired."""
        now = self._clock()
        with self.engine.connect() as db:
            row = db.execute(
                select(users, api_tokens.c.id.label("token_id"), api_tokens.c.expires_at)
                .join(api_tokens, api_tokens.c.user_id == users.c.id)
                .where(api_tokens.c.token_hash == _digest(secret))
            ).first()
        if row is None or row.disabled:
            raise TokenInvalid()
        if row.expires_at is not None and row.expires_at <= now:
            raise TokenExpired()
        with write_transaction(self.engine) as db:
            # Recorded at most once a minute, so a busy script does not write on every call.
            db.execute(
                update(api_tokens)
                .where(
                    api_tokens.c.id == row.token_id,
                    or_(
                        api_tokens.c.last_used_at.is_(None),
                        and_(api_tokens.c.last_used_at < now - 60),
                    ),
                )
                .values(last_used_at=now)
            )
        return _account(row)
