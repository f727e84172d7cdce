"""Account rules without Flask (SPEC 7.2, 7.3, 7.5): passwords, lockouts, tokens."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from argon2 import PasswordHasher
from sqlalchemy import select
from sqlalchemy import update

from deerflow_web.errors import AlreadyInitialized
from deerflow_web.errors import EmailTaken
from deerflow_web.errors import InvalidCredentials
from deerflow_web.errors import InvalidEmail
from deerflow_web.errors import InvalidInput
from deerflow_web.errors import LockedOut
from deerflow_web.errors import TokenExpired
from deerflow_web.errors import TokenInvalid
from deerflow_web.errors import TokenNotFound
from deerflow_web.errors import WeakPassword
from deerflow_web.errors import WrongPassword
from deerflow_web.services.accounts.passwords import Passwords
from deerflow_web.services.accounts.passwords import check_password_rules
from deerflow_web.services.accounts.passwords import normalize_email
from deerflow_web.services.accounts.service import ACCOUNT_MAX_DELAY
from deerflow_web.services.accounts.service import ADDRESS_ATTEMPTS
from deerflow_web.services.accounts.service import LOCKOUT_ATTEMPTS
from deerflow_web.services.accounts.service import LOCKOUT_WINDOW
from deerflow_web.services.accounts.service import AccountService
from deerflow_web.services.accounts.service import account_delay
from deerflow_web.storage.database import api_tokens
from deerflow_web.storage.database import session_secrets
from deerflow_web.storage.database import sessions
from deerflow_web.storage.database import users
from deerflow_web.storage.migrate import open_database
from tests.helpers import FAST_PASSWORDS

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


class Clock:
    """A clock the test moves by hand (lockout windows, expiries)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(base_dir: Path, database_url: str):
    """The account tables on each engine in turn (SQLite, PostgreSQL)."""
    engine = open_database(base_dir, database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def accounts(engine, clock: Clock) -> AccountService:
    return AccountService(engine, Passwords(FAST_PASSWORDS), clock=clock)


@pytest.fixture
def alice(accounts: AccountService):
    return accounts.create_user("Alice@Example.com", "alice password")


# --- passwords and emails ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("password", "reason"),
    (
        ("short", "at least 8"),
        ("1234567", "at least 8"),
        ("password", "too common"),
        ("PassWord123", "too common"),  # the list is compared without case
        ("qwertyuiop", "too common"),
        ("x" * 1025, "at most 1024"),
        (None, "must be a string"),
        (12345678, "must be a string"),
    ),
)
def test_weak_passwords_are_refused(password: object, reason: str) -> None:
    with pytest.raises(WeakPassword, match=reason):
        check_password_rules(password)


@pytest.mark.parametrize(
    "email", ("", "plain", "a@b", "a b@example.com", "@example.com", "a@@example.com", 7, None)
)
def test_invalid_emails_are_refused(email: object) -> None:
    with pytest.raises(InvalidEmail):
        normalize_email(email)


def test_emails_are_trimmed_and_lower_cased() -> None:
    assert normalize_email("  Bob@Example.COM ") == "bob@example.com"


def test_hashes_are_argon2id_and_never_the_password() -> None:
    passwords = Passwords()  # the real, memory-hard parameters
    hashed = passwords.hash("correct horse")
    assert hashed.startswith("$argon2id$") and "correct horse" not in hashed
    assert passwords.verify(hashed, "correct horse")
    assert not passwords.verify(hashed, "wrong horse")


class CountingHasher(PasswordHasher):
    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.verifications = 0

    def verify(self, hash: str, password: str | bytes) -> bool:  # noqa: A002
        self.verifications += 1
        return super().verify(hash, password)


def test_unknown_email_costs_one_verification_like_a_wrong_password(engine) -> None:
    hasher = CountingHasher()
    accounts = AccountService(engine, Passwords(hasher))
    accounts.create_user("real@example.com", "real password")
    with pytest.raises(InvalidCredentials):
        accounts.authenticate("real@example.com", "wrong password", "10.0.0.1")
    assert hasher.verifications == 1
    with pytest.raises(InvalidCredentials) as unknown:
        accounts.authenticate("nobody@example.com", "wrong password", "10.0.0.2")
    assert hasher.verifications == 2  # the dummy hash was checked
    assert str(unknown.value) == "Incorrect email or password"


def test_create_user_refuses_a_taken_email_and_bad_roles(accounts, alice) -> None:
    with pytest.raises(EmailTaken):
        accounts.create_user("alice@example.com", "another password")
    with pytest.raises(InvalidInput):
        accounts.create_user("c@example.com", "some password", role="root")
    assert [a.email for a in accounts.list_users()] == ["alice@example.com"]


def test_initialize_only_once(accounts) -> None:
    assert accounts.needs_setup()
    admin = accounts.initialize("root@example.com", "root password")
    assert admin.is_admin and not accounts.needs_setup()
    with pytest.raises(AlreadyInitialized):
        accounts.initialize("other@example.com", "other password")


# --- lockouts -----------------------------------------------------------------------------


def fail(accounts: AccountService, email: str, address: str, times: int) -> None:
    for _ in range(times):
        with pytest.raises(InvalidCredentials):
            accounts.authenticate(email, "wrong password", address)


def test_guesses_at_an_account_from_everywhere_slow_it_down_without_locking_it(
    accounts, alice, clock
) -> None:
    """The account is slowed by a doubling delay (never a 5-minute lock): its owner, from
    anywhere, waits at most ACCOUNT_MAX_DELAY after the latest guess."""
    address = iter(f"10.0.{index // 250}.{index % 250}" for index in range(1000))
    fail(accounts, "alice@example.com", next(address), 4)
    fail(accounts, "alice@example.com", next(address), 1)  # five: the next try waits 1 s
    waits = []
    for _ in range(10):
        with pytest.raises(LockedOut) as slowed:
            accounts.authenticate("alice@example.com", "wrong password", next(address))
        waits.append(slowed.value.retry_after)
        clock.now += slowed.value.retry_after
        fail(accounts, "alice@example.com", next(address), 1)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    with pytest.raises(LockedOut) as slowed:  # the owner, from a new address
        accounts.authenticate("alice@example.com", "alice password", "10.9.9.9")
    assert slowed.value.retry_after == ACCOUNT_MAX_DELAY
    clock.now += ACCOUNT_MAX_DELAY
    assert accounts.authenticate("alice@example.com", "alice password", "10.9.9.9") == alice


def test_five_failures_for_one_account_from_one_address_lock_that_pair(
    accounts, alice, clock
) -> None:
    fail(accounts, "alice@example.com", "10.0.0.66", 5)
    clock.now += 10
    with pytest.raises(LockedOut) as locked:  # the guesser's address, for five minutes
        accounts.authenticate("alice@example.com", "alice password", "10.0.0.66")
    assert locked.value.retry_after == 290
    # The owner elsewhere is not locked out; the account waits a second at most.
    assert accounts.authenticate("alice@example.com", "alice password", "10.0.0.67") == alice
    bob = accounts.create_user("bob@example.com", "bob password")
    with pytest.raises(LockedOut):  # five failures from one address lock it (SPEC 7.5)
        accounts.authenticate("bob@example.com", "bob password", "10.0.0.66")
    assert accounts.authenticate("bob@example.com", "bob password", "10.0.0.68") == bob
    clock.now += 291
    assert accounts.authenticate("alice@example.com", "alice password", "10.0.0.66") == alice


def test_failures_from_one_address_over_many_accounts_lock_the_address(
    accounts, alice, clock
) -> None:
    for index in range(ADDRESS_ATTEMPTS - 1):  # many different (unknown) accounts
        fail(accounts, f"guess{index}@example.com", "10.0.0.66", 1)
    assert accounts.authenticate("alice@example.com", "alice password", "10.0.0.66") == alice
    fail(accounts, "guess-last@example.com", "10.0.0.66", 1)
    with pytest.raises(LockedOut):
        accounts.authenticate("alice@example.com", "alice password", "10.0.0.66")
    assert accounts.authenticate("alice@example.com", "alice password", "10.0.0.67") == alice


def test_failures_older_than_the_window_do_not_count(accounts, alice, clock) -> None:
    fail(accounts, "alice@example.com", "10.0.0.1", 4)
    clock.now += 241
    for _ in range(4):  # a minute apart: the account's own delay never exceeds that
        clock.now += 60
        fail(accounts, "alice@example.com", "10.0.0.1", 1)
    clock.now += account_delay(8)  # the account's eight failures in 15 minutes still count
    assert accounts.authenticate("alice@example.com", "alice password", "10.0.0.1") == alice


def test_lockout_is_shared_by_every_service_over_the_database(engine, alice, clock) -> None:
    other_process = AccountService(engine, Passwords(FAST_PASSWORDS), clock=clock)
    this_process = AccountService(engine, Passwords(FAST_PASSWORDS), clock=clock)
    fail(this_process, "alice@example.com", "10.0.0.1", 3)
    fail(other_process, "alice@example.com", "10.0.0.2", 2)
    with pytest.raises(LockedOut):
        this_process.authenticate("alice@example.com", "alice password", "10.0.0.3")


def test_a_disabled_account_cannot_sign_in(accounts, alice) -> None:
    accounts.set_disabled(alice.id, True)
    with pytest.raises(InvalidCredentials):
        accounts.authenticate("alice@example.com", "alice password", "10.0.0.1")


# --- sessions -----------------------------------------------------------------------------


def test_sessions_are_stored_hashed_and_end_on_logout(accounts, alice, engine) -> None:
    secret = accounts.open_session(alice.id)
    assert accounts.session_user(secret) == alice
    with engine.connect() as db:
        stored = db.execute(select(sessions.c.id_hash)).scalars().all()
    assert secret not in stored and len(stored) == 1
    accounts.end_session(secret)
    assert accounts.session_user(secret) is None
    assert accounts.session_user("forged") is None


def test_sessions_expire_after_seven_days(accounts, alice, clock) -> None:
    secret = accounts.open_session(alice.id)
    clock.now += 7 * 24 * 3600 + 1
    assert accounts.session_user(secret) is None


def test_password_change_ends_every_session(accounts, alice) -> None:
    here = accounts.open_session(alice.id)
    elsewhere = accounts.open_session(alice.id)
    with pytest.raises(WrongPassword):
        accounts.change_password(alice.id, "not it", "brand new secret")
    with pytest.raises(WeakPassword):
        accounts.change_password(alice.id, "alice password", "password1")
    assert accounts.session_user(elsewhere) == alice  # failed changes end nothing
    assert accounts.change_password(alice.id, "alice password", "brand new secret") == 0
    assert accounts.session_user(here) is None  # the web layer opens a fresh one
    assert accounts.session_user(elsewhere) is None
    assert accounts.authenticate("alice@example.com", "brand new secret", "10.0.0.1").id == alice.id


def test_wrong_current_passwords_count_like_failed_sign_ins(accounts, alice, clock) -> None:
    for _ in range(LOCKOUT_ATTEMPTS):
        with pytest.raises(WrongPassword) as wrong:
            accounts.change_password(alice.id, "a guess", "brand new secret", address="10.0.0.5")
        assert wrong.value.code == "invalid_credentials"
    with pytest.raises(LockedOut):  # even the right one, from there, for five minutes
        accounts.change_password(alice.id, "alice password", "brand new secret", address="10.0.0.5")
    with pytest.raises(LockedOut):  # and signing in from there
        accounts.authenticate("alice@example.com", "alice password", "10.0.0.5")
    clock.now += LOCKOUT_WINDOW + 1
    accounts.change_password(alice.id, "alice password", "brand new secret", address="10.0.0.5")


def test_password_change_may_set_a_new_email_and_revoke_tokens(accounts, alice) -> None:
    accounts.create_token(alice.id, "ci")
    bob = accounts.create_user("bob@example.com", "bob password")
    with pytest.raises(EmailTaken) as taken:
        accounts.change_password(alice.id, "alice password", "new secret 1", new_email=bob.email)
    assert taken.value.code == "email_already_exists"
    with pytest.raises(InvalidEmail):
        accounts.change_password(alice.id, "alice password", "new secret 1", new_email="nope")
    revoked = accounts.change_password(
        alice.id,
        "alice password",
        "new secret 1",
        new_email=" Alice@New.Example ",
        revoke_tokens=True,
    )
    assert revoked == 1 and accounts.list_tokens(alice.id) == []
    assert accounts.get_user(alice.id).email == "alice@new.example"


def test_disable_and_reset_end_sessions_at_once(accounts, alice) -> None:
    secret = accounts.open_session(alice.id)
    accounts.set_disabled(alice.id, True)
    assert accounts.session_user(secret) is None
    accounts.set_disabled(alice.id, False)
    secret = accounts.open_session(alice.id)
    reset = accounts.reset_password(alice.id)
    assert accounts.session_user(secret) is None
    account = accounts.authenticate("alice@example.com", reset.temporary_password, "10.0.0.1")
    assert account.needs_setup


def test_disable_and_reset_revoke_every_api_token(accounts, alice) -> None:
    first = accounts.create_token(alice.id, "one")
    accounts.create_token(alice.id, "two")
    change = accounts.set_disabled(alice.id, True)
    assert change.revoked_tokens == 2 and accounts.list_tokens(alice.id) == []
    accounts.set_disabled(alice.id, False)
    with pytest.raises(TokenInvalid):  # enabling brings none back
        accounts.token_user(first.secret)
    third = accounts.create_token(alice.id, "three")
    reset = accounts.reset_password(alice.id)
    assert reset.revoked_tokens == 1 and reset.account.needs_setup
    with pytest.raises(TokenInvalid):
        accounts.token_user(third.secret)


def test_browser_sessions_idle_out_and_every_session_ends_at_its_lifetime(
    accounts, alice, clock
) -> None:
    browser = accounts.open_session(alice.id, persistent=False)
    remembered = accounts.open_session(alice.id)
    clock.now += 11 * 3600
    assert accounts.check_session(browser).persistent is False  # seen: the idle clock restarts
    clock.now += 11 * 3600
    assert accounts.session_user(browser) == alice
    clock.now += 12 * 3600 + 1
    with pytest.raises(TokenExpired):
        accounts.check_session(browser)
    with pytest.raises(TokenInvalid):  # and its row is gone
        accounts.check_session(browser)
    assert accounts.check_session(remembered).persistent is True  # 34 idle hours: still alive
    clock.now += 7 * 24 * 3600
    with pytest.raises(TokenExpired):
        accounts.check_session(remembered)


def test_a_secret_kept_for_a_session_is_sealed_and_taken_once(accounts, alice, engine) -> None:
    session = accounts.open_session(alice.id)
    other = accounts.open_session(alice.id)
    accounts.keep_for_session(session, "api_token", "laptop", "dfw_the-secret-value")
    with engine.connect() as db:
        [row] = db.execute(select(session_secrets)).all()
    assert "the-secret-value" not in repr(tuple(row))
    assert accounts.take_for_session(other, "api_token") == []
    assert accounts.take_for_session(session, "temporary_password") == []
    assert accounts.take_for_session(session, "api_token") == [("laptop", "dfw_the-secret-value")]
    assert accounts.take_for_session(session, "api_token") == []


def test_two_requests_racing_for_a_kept_secret_show_it_once(accounts, alice) -> None:
    session = accounts.open_session(alice.id)
    for round_number in range(5):
        accounts.keep_for_session(session, "api_token", "laptop", f"dfw_secret-{round_number}")
        barrier = threading.Barrier(4)
        seen: list[list[tuple[str, str]]] = []

        def take(barrier: threading.Barrier, seen: list) -> None:
            barrier.wait()
            seen.append(accounts.take_for_session(session, "api_token"))

        workers = [threading.Thread(target=take, args=(barrier, seen)) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert sorted(len(shown) for shown in seen) == [0, 0, 0, 1], seen


def test_kept_secrets_end_with_their_session_and_after_15_minutes(accounts, alice, clock) -> None:
    session = accounts.open_session(alice.id)
    accounts.keep_for_session(session, "api_token", "a", "dfw_a")
    accounts.end_session(session)
    assert accounts.take_for_session(session, "api_token") == []
    session = accounts.open_session(alice.id)
    accounts.keep_for_session(session, "api_token", "b", "dfw_b")
    clock.now += 15 * 60 + 1
    assert accounts.take_for_session(session, "api_token") == []


# --- API tokens ---------------------------------------------------------------------------


def test_tokens_have_32_random_bytes_and_are_stored_hashed(accounts, alice, engine) -> None:
    created = accounts.create_token(alice.id, "ci")
    secret = created.secret
    assert secret.startswith("dfw_") and len(secret) - 4 >= 43  # 32 bytes, base64url
    assert accounts.token_user(secret) == alice
    with engine.connect() as db:
        [row] = db.execute(select(api_tokens)).all()
    assert secret not in row and row.token_hash != secret
    assert accounts.list_tokens(alice.id)[0].last_used_at is not None


def test_token_use_is_recorded_at_most_once_a_minute(accounts, alice, clock) -> None:
    secret = accounts.create_token(alice.id, "ci").secret
    first = clock.now
    assert accounts.token_user(secret) == alice
    clock.now += 60  # a minute to the tick: still the first use on record
    assert accounts.token_user(secret) == alice
    assert accounts.list_tokens(alice.id)[0].last_used_at == first
    clock.now += 0.5
    assert accounts.token_user(secret) == alice
    assert accounts.list_tokens(alice.id)[0].last_used_at == clock.now


def test_forged_revoked_expired_and_disabled_tokens(accounts, alice, clock, engine) -> None:
    with pytest.raises(TokenInvalid):
        accounts.token_user("dfw_forged")
    revoked = accounts.create_token(alice.id, "old")
    accounts.revoke_token(alice.id, revoked.token.id)
    with pytest.raises(TokenInvalid):
        accounts.token_user(revoked.secret)
    short = accounts.create_token(alice.id, "short", 1)
    clock.now += 86400
    with pytest.raises(TokenExpired):
        accounts.token_user(short.secret)
    lasting = accounts.create_token(alice.id, "lasting")
    with engine.begin() as db:  # disabled behind the service's back: still refused
        db.execute(update(users).values(disabled=True))
    with pytest.raises(TokenInvalid):
        accounts.token_user(lasting.secret)


def test_someone_elses_token_cannot_be_revoked(accounts, alice) -> None:
    bob = accounts.create_user("bob@example.com", "bob password")
    token = accounts.create_token(alice.id, "mine")
    with pytest.raises(TokenNotFound):
        accounts.revoke_token(bob.id, token.token.id)
    assert accounts.token_user(token.secret) == alice


@pytest.mark.parametrize(
    ("name", "days"),
    (
        ("", None),
        ("   ", None),
        (None, None),
        ("x" * 101, None),
        ("ok", 0),
        ("ok", -1),
        ("ok", "7"),
        ("ok", True),
        ("ok", 4000),
        ("ok", 1.5),
    ),
)
def test_bad_token_requests(accounts, alice, name: object, days: object) -> None:
    with pytest.raises(InvalidInput):
        accounts.create_token(alice.id, name, days)
    assert accounts.list_tokens(alice.id) == []


def test_expired_token_row_survives_for_the_list(accounts, alice, engine) -> None:
    created = accounts.create_token(alice.id, "x", 3)
    with engine.begin() as db:
        db.execute(update(api_tokens).values(expires_at=0))
    with pytest.raises(TokenExpired):
        accounts.token_user(created.secret)
    assert [t.name for t in accounts.list_tokens(alice.id)] == ["x"]
