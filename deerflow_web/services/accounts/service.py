"""Accounts: users, server-side sessions, API tokens, login lockouts (SPEC 7.2, 7.3, 7.5).

Plain Python over the shared database, so every server process sees the same sessions,
revocations and failure counts. Secrets (session ids, API tokens) are random, handed out
once and stored only as SHA-256 hashes: a copy of the database signs nobody in.

Failed sign-ins (and wrong current passwords) lock the client address and the pair of
that address and the account, as SPEC 7.5 says; the account alone is only slowed down,
with a delay that doubles with each failure from anywhere, so someone guessing at it
from many addresses cannot lock its owner out for minutes at a time. Every wait is an
answer (LockedOut: 429 with Retry-After), never a sleep inside a request.
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
from sqlalchemy import bindparam
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from deerflow_web.errors import AlreadyInitialized
from deerflow_web.errors import EmailTaken
from deerflow_web.errors import InvalidCredentials
from deerflow_web.errors import InvalidInput
from deerflow_web.errors import LockedOut
from deerflow_web.errors import SelfDisable
from deerflow_web.errors import SelfReset
from deerflow_web.errors import TokenExpired
from deerflow_web.errors import TokenInvalid
from deerflow_web.errors import TokenNotFound
from deerflow_web.errors import UserNotFound
from deerflow_web.errors import WrongPassword
from deerflow_web.models import validate_user_id
from deerflow_web.services.accounts.passwords import Passwords
from deerflow_web.services.accounts.passwords import check_password_rules
from deerflow_web.services.accounts.passwords import normalize_email
from deerflow_web.storage.database import api_tokens
from deerflow_web.storage.database import login_failures
from deerflow_web.storage.database import session_secrets
from deerflow_web.storage.database import sessions
from deerflow_web.storage.database import users
from deerflow_web.storage.database import write_transaction

ADMIN = "admin"
USER = "user"
ROLES = (ADMIN, USER)

SESSION_SECONDS = 7 * 24 * 3600  # the default absolute lifetime of every session
SESSION_IDLE_SECONDS = 12 * 3600  # the default idle timeout of a browser session
LAST_SEEN_EVERY = 60  # a session's last request is written at most this often
ONE_TIME_SECONDS = 15 * 60  # a secret not shown within this is dropped
LOCKOUT_ATTEMPTS = 5  # failures for one account from one address that lock the pair
# Failures from one address, whatever the accounts, that lock the address (SPEC 7.5). A
# guesser spreading tries over many accounts is stopped as soon as one who sticks to one;
# the owner signing in from anywhere else is only ever slowed (ACCOUNT_FREE_FAILURES).
ADDRESS_ATTEMPTS = 5
LOCKOUT_WINDOW = 5 * 60
ACCOUNT_FREE_FAILURES = 5  # failures for an account before each next try waits
ACCOUNT_WINDOW = 15 * 60  # failures for an account counted over this
ACCOUNT_MAX_DELAY = 60  # the longest wait between two tries at one account
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


@dataclass(frozen=True)
class LiveSession:
    """A session that may be used now: its account and whether it was remembered."""

    account: Account
    persistent: bool
    expires_at: float


@dataclass(frozen=True)
class AdminChange:
    """What an admin's disable or password reset did to the account."""

    account: Account
    revoked_tokens: int  # a disabled or reset account's API tokens are all revoked
    temporary_password: str | None = None


# Every signed-in request runs one pair of these: built once with bound parameters, since
# building and cache-keying a statement per call cost more than running it.
_SESSION_OWNER = (
    select(
        users,
        sessions.c.expires_at,
        sessions.c.persistent,
        sessions.c.created_at.label("session_created_at"),
        sessions.c.last_seen_at,
    )
    .join(sessions, sessions.c.user_id == users.c.id)
    .where(sessions.c.id_hash == bindparam("id_hash"))
)
_SESSION_SEEN = (
    update(sessions)
    .where(sessions.c.id_hash == bindparam("session"))
    .values(last_seen_at=bindparam("now"))
)
_TOKEN_OWNER = (
    select(
        users, api_tokens.c.id.label("token_id"), api_tokens.c.expires_at, api_tokens.c.last_used_at
    )
    .join(api_tokens, api_tokens.c.user_id == users.c.id)
    .where(api_tokens.c.token_hash == bindparam("token_hash"))
)
_TOKEN_USED = (
    update(api_tokens)
    .where(
        api_tokens.c.id == bindparam("token_id"),
        or_(
            api_tokens.c.last_used_at.is_(None),
            api_tokens.c.last_used_at < bindparam("a_minute_ago"),
        ),
    )
    .values(last_used_at=bindparam("now"))
)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _pair(email: str, address: str) -> str:
    """The subject of an (account, address) pair's failures: fits any subject column."""
    return hashlib.sha256(f"{email}\0{address}".encode()).hexdigest()


def _keystream(session_secret: str, nonce: bytes, length: int) -> bytes:
    """SHAKE-256 of the session's secret and a fresh nonce: a one-time pad for one value."""
    return hashlib.shake_256(b"one-time:" + session_secret.encode() + nonce).digest(length)


def _seal(session_secret: str, value: str) -> tuple[str, str]:
    nonce = secrets.token_bytes(16)
    data = value.encode()
    pad = _keystream(session_secret, nonce, len(data))
    return nonce.hex(), bytes(a ^ b for a, b in zip(data, pad, strict=True)).hex()


def _unseal(session_secret: str, nonce: str, sealed: str) -> str:
    data = bytes.fromhex(sealed)
    pad = _keystream(session_secret, bytes.fromhex(nonce), len(data))
    return bytes(a ^ b for a, b in zip(data, pad, strict=True)).decode()


def _lock_end(times: list[float], attempts: int) -> float | None:
    """When a lock ends: five minutes after the failure that made `attempts` within five
    minutes (None: not locked)."""
    span = attempts - 1
    ends = [
        times[index] + LOCKOUT_WINDOW
        for index in range(span, len(times))
        if times[index] - times[index - span] <= LOCKOUT_WINDOW
    ]
    return max(ends) if ends else None


def account_delay(failures: int) -> int:
    """Seconds an account's next try waits after its latest failure (0, then 1, 2, 4 ...)."""
    if failures < ACCOUNT_FREE_FAILURES:
        return 0
    return min(2 ** (failures - ACCOUNT_FREE_FAILURES), ACCOUNT_MAX_DELAY)


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
        session_lifetime: float = SESSION_SECONDS,
        session_idle: float = SESSION_IDLE_SECONDS,
    ) -> None:
        self.engine = engine
        self.passwords = passwords or Passwords()
        self._clock = clock
        self.session_lifetime = session_lifetime
        self.session_idle = session_idle

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
    ) -> AdminChange:
        """Disable or enable an account; disabling ends its sessions and revokes its tokens.

        Enabling it again brings no token back: its owner makes new ones. The admin acting
        (`acting_user_id`) cannot disable themselves (`SelfDisable`), so whoever acts
        always keeps a way back in.
        """
        if disabled and user_id == acting_user_id:
            raise SelfDisable()
        revoked = 0
        with write_transaction(self.engine) as db:
            result = db.execute(
                update(users).where(users.c.id == user_id).values(disabled=disabled)
            )
            if result.rowcount == 0:
                raise UserNotFound()
            if disabled:
                db.execute(delete(sessions).where(sessions.c.user_id == user_id))
                revoked = db.execute(
                    delete(api_tokens).where(api_tokens.c.user_id == user_id)
                ).rowcount
        return AdminChange(self.get_user(user_id), revoked)

    def reset_password(self, user_id: str, *, acting_user_id: str | None = None) -> AdminChange:
        """Give the account a random temporary password it must change; end its sessions
        and revoke its API tokens (whoever learnt the old password may have made some).

        The admin acting cannot reset their own (`SelfReset`): they would lose the session
        or token they act with; they change their password instead.
        """
        if user_id == acting_user_id:
            raise SelfReset()
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
            revoked = db.execute(delete(api_tokens).where(api_tokens.c.user_id == user_id)).rowcount
        return AdminChange(self.get_user(user_id), revoked, temporary)

    def change_password(
        self,
        user_id: str,
        current: object,
        new: object,
        *,
        address: str = "",
        new_email: object = None,
        revoke_tokens: bool = False,
    ) -> int:
        """Set a new password (and email) after checking the current one; every session of
        the account ends (the caller opens a fresh one). Returns how many API tokens were
        revoked (all of them with `revoke_tokens`, else none).

        A wrong current password counts as a failed sign-in from `address` (and locks out
        the same way): a stolen session cannot be used to guess it.
        """
        account = self.get_user(user_id)
        wait = self._retry_after(address, account.email, self._clock())
        if wait is not None:
            raise LockedOut(wait)
        address_to = normalize_email(new_email) if new_email is not None else None
        with self.engine.connect() as db:
            stored = db.execute(
                select(users.c.password_hash).where(users.c.id == user_id)
            ).scalar_one_or_none()
        if stored is None:
            raise UserNotFound()
        text = current if isinstance(current, str) else ""
        if not self.passwords.verify(stored, text):
            self._record_failure(address, account.email)
            raise WrongPassword()
        check_password_rules(new)
        values: dict[str, object] = {
            "password_hash": self.passwords.hash(new),  # type: ignore[arg-type]
            "needs_setup": False,
        }
        if address_to is not None:
            values["email"] = address_to
        revoked = 0
        try:
            with write_transaction(self.engine) as db:
                db.execute(update(users).where(users.c.id == user_id).values(**values))
                db.execute(delete(sessions).where(sessions.c.user_id == user_id))
                if revoke_tokens:
                    revoked = db.execute(
                        delete(api_tokens).where(api_tokens.c.user_id == user_id)
                    ).rowcount
        except IntegrityError:
            raise EmailTaken("Email already in use") from None
        return revoked

    # -- login and lockout ---------------------------------------------------------------

    def _failure_times(self, db: Connection, kind: str, subject: str, since: float) -> list[float]:
        return list(
            db.execute(
                select(login_failures.c.at)
                .where(
                    login_failures.c.kind == kind,
                    login_failures.c.subject == subject,
                    login_failures.c.at > since,
                )
                .order_by(login_failures.c.at)
            )
            .scalars()
            .all()
        )

    def _retry_after(self, address: str, email: str, now: float) -> int | None:
        """Seconds before the next try may be made, or None when it may be made now.

        The (account, address) pair is locked for five minutes from the failure that made
        five within five minutes, the address likewise after five (for any accounts);
        the account, from wherever the tries come, waits `account_delay(failures in the
        last 15 minutes)` after its latest failure. Tries refused while waiting are not
        counted, so every wait ends on time.
        """
        ends: list[float] = []
        locks = (
            ("address", address, ADDRESS_ATTEMPTS),
            ("pair", _pair(email, address), LOCKOUT_ATTEMPTS),
        )
        with self.engine.connect() as db:
            for kind, subject, attempts in locks if address else ():
                times = self._failure_times(db, kind, subject, now - 2 * LOCKOUT_WINDOW)
                if (end := _lock_end(times, attempts)) is not None:
                    ends.append(end)
            if email:
                times = self._failure_times(db, "account", email, now - ACCOUNT_WINDOW)
                if times:
                    ends.append(times[-1] + account_delay(len(times)))
        end = max(ends, default=now)
        return max(1, math.ceil(end - now)) if end > now else None

    def _record_failure(self, address: str, email: str) -> None:
        now = self._clock()
        rows = [{"kind": "account", "subject": email, "at": now}]
        if address:
            rows.append({"kind": "address", "subject": address, "at": now})
            rows.append({"kind": "pair", "subject": _pair(email, address), "at": now})
        with write_transaction(self.engine) as db:
            db.execute(insert(login_failures), rows)
            db.execute(delete(login_failures).where(login_failures.c.at < now - 86400))

    def authenticate(self, email: object, password: object, address: str) -> Account:
        """Check a login; failures are counted per address, pair and account in the database.

        Raises:
            LockedOut: the address or the pair is locked, or the account must wait.
            InvalidCredentials: Wrong or unknown email, wrong password, disabled account.
        """
        subject = email.strip().lower() if isinstance(email, str) else ""
        wait = self._retry_after(address, subject, self._clock())
        if wait is not None:
            raise LockedOut(wait)
        with self.engine.connect() as db:
            row = db.execute(select(users).where(users.c.email == subject)).first()
        text = password if isinstance(password, str) else ""
        matches = self.passwords.verify(row.password_hash if row is not None else None, text)
        if not matches or row is None or row.disabled:
            self._record_failure(address, subject)
            raise InvalidCredentials()
        # The owner's own typos are forgotten; the account's count stays, or a guesser
        # elsewhere would get free tries each time the owner signs in.
        with write_transaction(self.engine) as db:
            db.execute(
                delete(login_failures).where(
                    login_failures.c.kind == "pair",
                    login_failures.c.subject == _pair(subject, address),
                )
            )
        return _account(row)

    # -- sessions ------------------------------------------------------------------------

    def open_session(self, user_id: str, *, persistent: bool = True) -> str:
        """Start a server-side session and return its secret (it goes into the cookie)."""
        secret = secrets.token_urlsafe(32)
        now = self._clock()
        with write_transaction(self.engine) as db:
            db.execute(
                delete(sessions).where(
                    or_(
                        sessions.c.expires_at <= now,
                        and_(
                            sessions.c.persistent.is_(False),
                            func.coalesce(sessions.c.last_seen_at, sessions.c.created_at)
                            <= now - self.session_idle,
                        ),
                    )
                )
            )
            db.execute(
                insert(sessions).values(
                    id_hash=_digest(secret),
                    user_id=user_id,
                    created_at=now,
                    expires_at=now + self.session_lifetime,
                    persistent=persistent,
                    last_seen_at=now,
                )
            )
        return secret

    def check_session(self, secret: str) -> LiveSession:
        """The live session behind a cookie value; its last request is noted (once a minute).

        Raises:
            TokenExpired: the session passed its idle timeout or its absolute end.
            TokenInvalid: no such session (never was, ended, revoked) or a disabled account.
        """
        if not isinstance(secret, str) or not secret:
            raise TokenInvalid()
        now = self._clock()
        id_hash = _digest(secret)
        with self.engine.connect() as db:
            row = db.execute(_SESSION_OWNER, {"id_hash": id_hash}).first()
        if row is None or row.disabled:
            raise TokenInvalid()
        last_seen = row.last_seen_at if row.last_seen_at is not None else row.session_created_at
        if row.expires_at <= now or (not row.persistent and last_seen <= now - self.session_idle):
            self.end_session(secret)
            raise TokenExpired()
        if now - last_seen >= LAST_SEEN_EVERY:
            with write_transaction(self.engine) as db:
                db.execute(_SESSION_SEEN, {"session": id_hash, "now": now})
        return LiveSession(_account(row), bool(row.persistent), row.expires_at)

    def session_user(self, secret: str) -> Account | None:
        """The active account of a live session, or None (ended, expired, disabled)."""
        try:
            return self.check_session(secret).account
        except (TokenInvalid, TokenExpired):
            return None

    def end_session(self, secret: str) -> None:
        with write_transaction(self.engine) as db:
            db.execute(delete(sessions).where(sessions.c.id_hash == _digest(secret)))

    # -- secrets shown once ----------------------------------------------------------------

    def keep_for_session(self, session_secret: str, kind: str, label: str, value: str) -> None:
        """Keep `value` for the session to see once (`take_for_session`), sealed with the
        session's secret; a value not taken within 15 minutes is dropped."""
        now = self._clock()
        nonce, sealed = _seal(session_secret, value)
        with write_transaction(self.engine) as db:
            db.execute(
                delete(session_secrets).where(session_secrets.c.created_at < now - ONE_TIME_SECONDS)
            )
            db.execute(
                insert(session_secrets).values(
                    session_hash=_digest(session_secret),
                    kind=kind,
                    label=label,
                    nonce=nonce,
                    sealed=sealed,
                    created_at=now,
                )
            )

    def take_for_session(self, session_secret: str, kind: str) -> list[tuple[str, str]]:
        """The (label, value) pairs kept for this session, removed as they are read: of two
        requests with the same cookie, only one ever sees them."""
        now = self._clock()
        with write_transaction(self.engine) as db:
            rows = db.execute(
                delete(session_secrets)
                .where(
                    session_secrets.c.session_hash == _digest(session_secret),
                    session_secrets.c.kind == kind,
                )
                .returning(
                    session_secrets.c.id,
                    session_secrets.c.label,
                    session_secrets.c.nonce,
                    session_secrets.c.sealed,
                    session_secrets.c.created_at,
                )
            ).all()
        fresh = sorted(row for row in rows if row.created_at >= now - ONE_TIME_SECONDS)
        return [(row.label, _unseal(session_secret, row.nonce, row.sealed)) for row in fresh]

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
            row = db.execute(_TOKEN_OWNER, {"token_hash": _digest(secret)}).first()
        if row is None or row.disabled:
            raise TokenInvalid()
        if row.expires_at is not None and row.expires_at <= now:
            raise TokenExpired()
        if row.last_used_at is not None and row.last_used_at >= now - 60:
            return _account(row)  # recorded less than a minute ago: no write, no write lock
        with write_transaction(self.engine) as db:
            # Recorded at most once a minute, so a busy script does not write on every call
            # (nor take the database's write lock: the check above skips the transaction).
            db.execute(
                _TOKEN_USED, {"token_id": row.token_id, "now": now, "a_minute_ago": now - 60}
            )
        return _account(row)
