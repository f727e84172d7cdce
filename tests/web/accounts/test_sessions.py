"""Sessions as DeerFlow's client sees them and as issue-level security asks (SPEC 7.3, 7.5).

The `access_token` cookie alone signs a request in (DeerFlow's page guard sends nothing
else); Flask's own cookie holds no secret; one-time secrets are shown once; browser
sessions time out when idle and every session at its absolute end; tokens do not outlive
a reset; lockouts slow an account down without locking its owner out; answers about a
signed-in user are never stored by a cache.
"""

from __future__ import annotations

import re
from io import BytesIO
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from deerflow_web.storage.database import session_secrets
from deerflow_web.storage.database import sessions
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import USER_ID
from tests.helpers import needs_auth

pytestmark = needs_auth

AUTH = "/api/v1/auth"
ADMIN = "/api/v1/admin"
HOUR = 3600


class Clock:
    """The account service's clock, moved by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def accounts_of(app: Flask):
    return app.extensions[EXTENSION_KEY].accounts


def anonymous(app: Flask) -> FlaskClient:
    return app.test_client(user_id=None)


def login(client: FlaskClient, email: str = TEST_EMAIL, password: str = TEST_PASSWORD, **form):
    return client.post(
        f"{AUTH}/login/local", data={"username": email, "password": password, **form}
    )


def set_cookies(response) -> dict[str, str]:
    return {value.split("=", 1)[0]: value for value in response.headers.getlist("Set-Cookie")}


def upload(client: FlaskClient, thread_id: str = "t1", **kwargs: Any):
    data = {"files": [(BytesIO(b"hello"), "a.txt")]}
    return client.post(f"/api/threads/{thread_id}/uploads", data=data, **kwargs)


@pytest.fixture
def clock(app: Flask) -> Clock:
    """The app's account service on a hand-moved clock."""
    moved = Clock(1_800_000_000.0)
    accounts_of(app)._clock = moved
    return moved


# --- the access_token cookie (issue 25 item 1) ------------------------------------------------


def test_the_access_token_cookie_alone_signs_in_as_deerflows_page_guard_sends_it(
    app: Flask,
) -> None:
    client = anonymous(app)
    login(client)
    value = client.get_cookie("access_token").value
    guard = FlaskClient(app, use_cookies=False)  # `Cookie: access_token=...` and no other
    me = guard.get(f"{AUTH}/me", headers={"Cookie": f"access_token={value}"})
    assert me.status_code == 200 and me.get_json()["email"] == TEST_EMAIL


def test_flasks_own_cookie_holds_no_secret(app: Flask) -> None:
    client = anonymous(app)
    page = client.post("/login", data={"email": TEST_EMAIL, "password": TEST_PASSWORD, "next": ""})
    assert page.status_code == 302
    client.post("/account/tokens", data={"name": "laptop"})
    client.post("/account/tokens/no-such-token/revoke")  # flashes an error for the next page
    secret = client.get_cookie("access_token").value
    flask_cookie = client.get_cookie("session")
    assert flask_cookie is not None
    data = app.session_interface.get_signing_serializer(app).loads(flask_cookie.value)
    assert "_flashes" in data and set(data) <= {"_flashes", "csrf_token"}, data
    assert secret not in repr(data) and "dfw_" not in repr(data)


@pytest.mark.parametrize("garbage", ("garbage", "x" * 4000, "eyJhbGciOiJIUzI1NiJ9.e30.sig"))
def test_a_garbage_cookie_is_token_invalid_and_cleared(app: Flask, garbage: str) -> None:
    client = anonymous(app)
    client.set_cookie("access_token", garbage)
    me = client.get(f"{AUTH}/me")
    assert me.status_code == 401
    assert me.get_json()["detail"]["code"] == "token_invalid"
    assert set_cookies(me)["access_token"].startswith("access_token=;")
    client.set_cookie("access_token", garbage)
    assert client.get("/threads/t1").headers["Location"] == "/login?next=/threads/t1"
    client.set_cookie("access_token", garbage)
    assert client.get(f"{AUTH}/setup-status").status_code == 200  # public: runs without one
    client.set_cookie("access_token", garbage)
    assert login(client).status_code == 200  # and signing in replaces it
    assert client.get(f"{AUTH}/me").status_code == 200


def test_host_prefix_on_flasks_cookie_over_https_only(make_app) -> None:
    """`__Host-` where no DeerFlow code reads the name; DeerFlow's names stay as they are."""
    app = make_app(server={"trusted_proxies": 1})
    client = anonymous(app)
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    page = client.get("/login", headers=https)  # Flask-WTF keeps its form token in it
    cookies = set_cookies(page)
    assert "session" not in cookies
    flask_cookie = cookies["__Host-session"]
    assert "Secure" in flask_cookie and "Path=/" in flask_cookie
    assert "Domain" not in flask_cookie and "HttpOnly" in flask_cookie
    signed = set_cookies(
        client.post(
            f"{AUTH}/login/local",
            data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
            headers=https,
        )
    )
    for name in ("access_token", "deerflow_session_persistent", "csrf_token"):
        assert "Secure" in signed[name] and "Domain" not in signed[name], signed
    plain = set_cookies(anonymous(app).get("/login"))
    assert "session" in plain and "__Host-session" not in plain


# --- one-time secrets (issue 23 item 11) ------------------------------------------------------


def test_a_new_tokens_secret_is_shown_once_even_to_a_replayed_cookie(app: Flask) -> None:
    client = app.test_client()
    client.post("/account/tokens", data={"name": "laptop"})
    replay = anonymous(app)  # a copy of every cookie, taken before the page was shown
    for name in ("access_token", "csrf_token", "session"):
        if (cookie := client.get_cookie(name)) is not None:
            replay.set_cookie(name, cookie.value)
    engine = app.extensions[EXTENSION_KEY].engine
    with engine.connect() as db:
        [kept] = db.execute(select(session_secrets)).all()
    match = re.search(r'id="new-token"[^>]*value="(dfw_[^"]+)"', client.get("/account").text)
    assert match is not None
    secret = match.group(1)
    assert secret not in repr(tuple(kept)) and secret.encode().hex() not in kept.sealed
    assert secret not in replay.get("/account").text  # the replayed cookie sees nothing
    assert secret not in client.get("/account").text  # nor a reload
    with engine.connect() as db:
        assert db.execute(select(session_secrets)).all() == []


def test_a_secret_kept_for_one_session_is_not_shown_to_another(app: Flask) -> None:
    mine = app.test_client()
    other = app.test_client()  # the same user, another session
    mine.post("/account/tokens", data={"name": "laptop"})
    assert "dfw_" not in other.get("/account").text
    assert "dfw_" in mine.get("/account").text


def test_a_temporary_password_is_shown_once(app: Flask) -> None:
    admin = app.test_client()
    dora = accounts_of(app).create_user("dora@example.com", "dora password")
    assert admin.post(f"/admin/users/{dora.id}/reset").status_code == 302
    replay = anonymous(app)
    replay.set_cookie("access_token", admin.get_cookie("access_token").value)
    first = admin.get("/admin")
    found = re.search(r'value="([^"]+)" aria-label="Temporary password"', first.text)
    assert found is not None and first.headers["Cache-Control"] == "no-store"
    assert found.group(1) not in replay.get("/admin").text
    assert login(anonymous(app), "dora@example.com", found.group(1)).status_code == 200


# --- idle timeout and absolute lifetime (issue 23 item 16) -------------------------------------


def test_a_browser_session_ends_after_the_idle_timeout(app: Flask, clock: Clock) -> None:
    client = anonymous(app)
    login(client, remember_me="false")
    for _ in range(3):  # busy: each request within the idle timeout keeps it alive
        clock.now += 11 * HOUR
        assert client.get(f"{AUTH}/me").status_code == 200
    clock.now += 12 * HOUR + 1
    expired = client.get(f"{AUTH}/me")
    assert expired.status_code == 401 and expired.get_json()["detail"]["code"] == "token_expired"
    assert set_cookies(expired)["access_token"].startswith("access_token=;")
    with app.extensions[EXTENSION_KEY].engine.connect() as db:
        assert db.execute(select(sessions).where(sessions.c.persistent.is_(False))).all() == []


def test_a_remembered_session_has_no_idle_timeout_but_the_absolute_lifetime(
    app: Flask, clock: Clock
) -> None:
    client = anonymous(app)
    login(client)  # persistent, DeerFlow's default
    clock.now += 6 * 24 * HOUR  # six idle days
    assert client.get(f"{AUTH}/me").status_code == 200
    clock.now += 24 * HOUR  # seven days after signing in, busy or not
    assert client.get(f"{AUTH}/me").get_json()["detail"]["code"] == "token_expired"


def test_a_busy_browser_session_still_ends_at_the_absolute_lifetime(
    app: Flask, clock: Clock
) -> None:
    client = anonymous(app)
    login(client, remember_me="false")
    for _ in range(14):  # never idle for long: 7 days minus 14 minutes
        clock.now += 12 * HOUR - 60
        assert client.get(f"{AUTH}/me").status_code == 200
    clock.now += 15 * 60
    assert client.get(f"{AUTH}/me").get_json()["detail"]["code"] == "token_expired"


def test_last_seen_is_written_at_most_once_a_minute(app: Flask, clock: Clock) -> None:
    client = anonymous(app)
    login(client, remember_me="false")
    engine = app.extensions[EXTENSION_KEY].engine

    def last_seen() -> float:
        with engine.connect() as db:
            return db.execute(select(sessions.c.last_seen_at)).scalars().all()

    start = last_seen()
    writes = []
    for _ in range(10):  # ten requests within 50 seconds: no write
        clock.now += 5
        client.get(f"{AUTH}/me")
        writes.append(last_seen())
    assert all(seen == start for seen in writes)
    clock.now += 11
    client.get(f"{AUTH}/me")
    assert last_seen() == [clock.now]


def test_the_timeouts_come_from_the_config(make_app) -> None:
    app = make_app(auth={"session_idle_hours": 1, "session_lifetime_days": 2})
    accounts_of(app)._clock = clock = Clock(1_800_000_000.0)
    client = anonymous(app)
    response = login(client, remember_me="true")
    assert response.get_json()["expires_in"] == 2 * 24 * HOUR
    assert "Max-Age=172800" in set_cookies(response)["access_token"]
    browser = anonymous(app)
    login(browser, remember_me="false")
    clock.now += HOUR + 1
    assert browser.get(f"{AUTH}/me").status_code == 401
    assert client.get(f"{AUTH}/me").status_code == 200


# --- tokens after a reset, a disable, a forced change (issue 23 item 2) ---------------------------


def test_a_token_of_an_account_that_must_change_its_password_can_only_change_it(
    app: Flask, base_dir
) -> None:
    accounts = accounts_of(app)
    erin = accounts.create_user("erin@example.com", "erin password", needs_setup=True)
    token = accounts.create_token(erin.id, "ci").secret
    bearer = anonymous(app)
    headers = {"Authorization": f"Bearer {token}"}
    for method, path in (
        ("get", f"{AUTH}/me"),
        ("get", f"{AUTH}/tokens"),
        ("post", f"{AUTH}/tokens"),
        ("get", "/api/threads/t1/uploads/list"),
    ):
        refused = getattr(bearer, method)(path, headers=headers, json={"name": "more"})
        assert refused.status_code == 403, path
        assert "Password change required" in refused.get_json()["detail"]
    assert upload(bearer, headers=headers).status_code == 403
    assert not (base_dir / "users" / erin.id).exists()
    assert [t.name for t in accounts.list_tokens(erin.id)] == ["ci"]
    changed = bearer.post(
        f"{AUTH}/change-password",
        headers=headers,
        json={"current_password": "erin password", "new_password": "erin's new one"},
    )
    assert changed.status_code == 200 and "access_token" not in set_cookies(changed)
    assert bearer.get(f"{AUTH}/me", headers=headers).status_code == 200


def test_change_password_offers_to_revoke_tokens(app: Flask) -> None:
    client = app.test_client()
    accounts = accounts_of(app)
    accounts.create_token(USER_ID, "one")
    accounts.create_token(USER_ID, "two")
    bad = client.post(
        f"{AUTH}/change-password",
        json={"current_password": TEST_PASSWORD, "new_password": "x new pass", "revoke_tokens": 1},
    )
    assert bad.status_code == 422 and len(accounts.list_tokens(USER_ID)) == 2
    done = client.post(
        f"{AUTH}/change-password",
        json={
            "current_password": TEST_PASSWORD,
            "new_password": "a new password",
            "revoke_tokens": True,
        },
    )
    assert done.get_json() == {"message": "Password changed successfully", "revoked_tokens": 2}
    assert accounts.list_tokens(USER_ID) == []


def test_the_account_page_offers_to_revoke_tokens(app: Flask) -> None:
    client = app.test_client()
    accounts = accounts_of(app)
    accounts.create_token(USER_ID, "one")
    assert "Also revoke all my API tokens" in client.get("/account").text
    done = client.post(
        "/account/password",
        data={
            "current_password": TEST_PASSWORD,
            "new_password": "a fresh password",
            "revoke_tokens": "y",
        },
    )
    assert done.status_code == 302 and accounts.list_tokens(USER_ID) == []
    assert "1 API tokens were revoked." in client.get("/account").text


def test_the_admin_page_says_what_disable_and_reset_do(app: Flask) -> None:
    admin = app.test_client()
    dora = accounts_of(app).create_user("dora@example.com", "dora password")
    accounts_of(app).create_token(dora.id, "ci")
    page = admin.get("/admin").text
    assert "revokes all its API tokens" in page
    done = admin.post(f"/admin/users/{dora.id}/disable", follow_redirects=True)
    assert "1 API tokens were revoked." in done.text
    assert accounts_of(app).list_tokens(dora.id) == []


# --- change-password guessing and the lockout rules (issue 23 items 6, 7) ----------------------


def test_current_password_guesses_are_counted_like_sign_ins(app: Flask, clock: Clock) -> None:
    client = app.test_client()
    for _ in range(5):
        wrong = client.post(
            f"{AUTH}/change-password",
            json={"current_password": "a guess", "new_password": "a new password"},
        )
        assert wrong.status_code == 400
        assert wrong.get_json()["detail"]["code"] == "invalid_credentials"
    locked = client.post(
        f"{AUTH}/change-password",
        json={"current_password": TEST_PASSWORD, "new_password": "a new password"},
    )
    assert locked.status_code == 429 and 295 <= int(locked.headers["Retry-After"]) <= 300
    assert locked.get_json() == {"detail": "Too many login attempts. Try again later."}
    assert login(anonymous(app)).status_code == 429  # the same pair, the same lock
    clock.now += 1  # the account's own delay after five failures
    elsewhere = anonymous(app).post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        environ_base={"REMOTE_ADDR": "10.7.7.7"},
    )
    assert elsewhere.status_code == 200


def test_the_change_password_page_counts_guesses_too(app: Flask) -> None:
    client = app.test_client()
    for _ in range(5):
        client.post(
            "/account/password", data={"current_password": "guess", "new_password": "a new one!"}
        )
    locked = client.post(
        "/account/password",
        data={"current_password": TEST_PASSWORD, "new_password": "a new one!"},
    )
    assert locked.status_code == 429 and "Retry-After" in locked.headers


def test_a_guesser_elsewhere_does_not_lock_the_owner_out(app: Flask, clock: Clock) -> None:
    guesses = 0
    for index in range(100):  # one guess per address, as fast as they are let in
        guess = anonymous(app).post(
            f"{AUTH}/login/local",
            data={"username": TEST_EMAIL, "password": "a guess"},
            environ_base={"REMOTE_ADDR": f"198.51.100.{index}"},
        )
        if guess.status_code == 429:
            clock.now += int(guess.headers["Retry-After"])
        else:
            guesses += 1
        if guesses == 15:
            break
    owner = anonymous(app).post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        environ_base={"REMOTE_ADDR": "192.0.2.1"},
    )
    assert owner.status_code == 429 and int(owner.headers["Retry-After"]) <= 60
    clock.now += int(owner.headers["Retry-After"])
    again = anonymous(app).post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        environ_base={"REMOTE_ADDR": "192.0.2.1"},
    )
    assert again.status_code == 200


# --- Cache-Control (issue 23 item 10) ----------------------------------------------------------


def test_answers_for_a_signed_in_user_are_no_store(app: Flask) -> None:
    client = app.test_client()
    assert upload(client).status_code == 200
    token = client.post(f"{AUTH}/tokens", json={"name": "ci"})
    paths = ("/", "/threads/t1", "/account", "/admin", "/api/threads/t1/uploads/list")
    for response in [token, *(client.get(path) for path in paths)]:
        assert response.headers["Cache-Control"] == "no-store", response.request.path
    bearer = anonymous(app).get(
        "/api/threads/t1/uploads/list",
        headers={"Authorization": f"Bearer {token.get_json()['token']}"},
    )
    assert bearer.headers["Cache-Control"] == "no-store"
    with client.get("/api/threads/t1/artifacts/mnt/user-data/uploads/a.txt") as download:
        assert download.status_code == 200 and download.headers["Cache-Control"] == "no-store"


def test_auth_answers_are_no_store_and_public_files_keep_their_caching(app: Flask) -> None:
    client = anonymous(app)
    for response in (
        login(client),
        client.get(f"{AUTH}/me"),
        anonymous(app).get(f"{AUTH}/setup-status"),
        anonymous(app).get(f"{AUTH}/me"),
        client.post(f"{AUTH}/logout"),
    ):
        assert response.headers["Cache-Control"] == "no-store", response.request.path
    with client.get("/static/style.css") as static:
        assert "no-store" not in static.headers.get("Cache-Control", "")
    assert "Cache-Control" not in anonymous(app).get("/openapi.json").headers
    assert "Cache-Control" not in anonymous(app).get("/api/docs").headers


# --- DeerFlow's answers (issue 25 item 2) --------------------------------------------------------


def test_change_password_applies_new_email_as_deerflows_setup_page_sends_it(app: Flask) -> None:
    accounts = accounts_of(app)
    admin = accounts.create_user(
        "admin@localhost.example", "temporary pass", role="admin", needs_setup=True
    )
    client = anonymous(app)
    assert login(client, admin.email, "temporary pass").get_json()["needs_setup"] is True
    csrf = client.get_cookie("csrf_token").value
    done = client.post(
        f"{AUTH}/change-password",
        json={
            "current_password": "temporary pass",
            "new_password": "the real password",
            "new_email": "Real@Example.com",
        },
        headers={"X-CSRF-Token": csrf},
    )
    assert done.status_code == 200
    me = client.get(f"{AUTH}/me").get_json()
    assert me["email"] == "real@example.com" and me["needs_setup"] is False
    assert login(anonymous(app), "real@example.com", "the real password").status_code == 200
    taken = client.post(
        f"{AUTH}/change-password",
        json={
            "current_password": "the real password",
            "new_password": "another password",
            "new_email": TEST_EMAIL,
        },
        headers={"X-CSRF-Token": client.get_cookie("csrf_token").value},
    )
    assert taken.status_code == 400
    assert taken.get_json()["detail"]["code"] == "email_already_exists"
    assert login(anonymous(app), "real@example.com", "the real password").status_code == 200


def test_register_defaults_to_a_persistent_session(make_app) -> None:
    app = make_app(auth={"registration_enabled": True})
    response = anonymous(app).post(
        f"{AUTH}/register", json={"email": "new@example.com", "password": "new password"}
    )
    assert "Max-Age=604800" in set_cookies(response)["access_token"]
    short = anonymous(app).post(
        f"{AUTH}/register",
        json={"email": "two@example.com", "password": "new password", "remember_me": False},
    )
    assert "Max-Age" not in set_cookies(short)["access_token"]


def test_a_page_the_gate_never_saw_still_knows_who_is_signed_in(app: Flask) -> None:
    client = app.test_client()
    missing = client.get("/no/such/page")
    assert missing.status_code == 404 and f"Signed in as {TEST_EMAIL}" in missing.text
    assert missing.headers["Cache-Control"] == "no-store"


def test_a_page_form_sent_with_a_token_keeps_no_secret(app: Flask) -> None:
    token = accounts_of(app).create_token(USER_ID, "ci").secret
    bearer = anonymous(app)
    answer = bearer.post(
        "/account/tokens", data={"name": "x"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 403
    with app.extensions[EXTENSION_KEY].engine.connect() as db:
        assert db.execute(select(session_secrets)).all() == []
    assert [t.name for t in accounts_of(app).list_tokens(USER_ID)] == ["ci"]  # none made


def test_deerflows_client_from_set_up_to_sign_out(make_app) -> None:
    """The requests DeerFlow's pages send, in order: its setup page, its page guard (the
    `access_token` cookie only), its login form, its fetch wrapper (`X-CSRF-Token` read from
    the `csrf_token` cookie, same-site `Origin`), its account page, its logout."""
    app = make_app(test_user=False)
    browser = anonymous(app)
    origin = {"Origin": "http://localhost"}
    assert browser.get(f"{AUTH}/setup-status").get_json()["needs_setup"] is True
    created = browser.post(
        f"{AUTH}/initialize",
        json={"email": "admin@example.com", "password": "admin password"},
        headers=origin,
    )
    assert created.status_code == 201
    guard = FlaskClient(app, use_cookies=False)
    cookie = {"Cookie": f"access_token={browser.get_cookie('access_token').value}"}
    assert guard.get(f"{AUTH}/me", headers=cookie).get_json()["needs_setup"] is False
    browser.post(f"{AUTH}/logout", headers=origin)
    assert guard.get(f"{AUTH}/me", headers=cookie).status_code == 401  # -> its /login page
    signed = browser.post(
        f"{AUTH}/login/local",
        data={
            "password": "admin password",
            "remember_me": "false",
            "username": "admin@example.com",
        },
        headers=origin,
    )
    assert signed.status_code == 200 and "Max-Age" not in set_cookies(signed)["access_token"]
    browser.send_csrf = False  # sent by hand below, as DeerFlow's fetcher does
    csrf = {"X-CSRF-Token": browser.get_cookie("csrf_token").value, **origin}
    changed = browser.post(
        f"{AUTH}/change-password",
        json={"current_password": "admin password", "new_password": "a better password"},
        headers=csrf,
    )
    assert changed.status_code == 200
    renewed = {"X-CSRF-Token": browser.get_cookie("csrf_token").value, **origin}
    assert renewed != csrf  # the re-issued session came with its own csrf_token
    assert browser.get(f"{AUTH}/me").status_code == 200
    token = browser.post(f"{AUTH}/tokens", json={"name": "ci"}, headers=renewed)
    assert token.status_code == 201
    stale = browser.post(f"{AUTH}/tokens", json={"name": "ci"}, headers=csrf)
    assert stale.status_code == 403 and stale.get_json() == {"detail": "CSRF token mismatch."}
    out = browser.post(f"{AUTH}/logout", headers=origin)
    assert out.status_code == 200 and browser.get_cookie("access_token") is None
    assert browser.get(f"{AUTH}/me").get_json()["detail"]["code"] == "not_authenticated"


def test_an_admin_cannot_reset_their_own_password(app: Flask) -> None:
    """It would revoke the very token or session they act with; they change it instead."""
    accounts = accounts_of(app)
    token = accounts.create_token(USER_ID, "ops").secret
    bearer = anonymous(app)
    headers = {"Authorization": f"Bearer {token}"}
    refused = bearer.post(f"{ADMIN}/users/{USER_ID}/reset-password", headers=headers)
    assert refused.status_code == 409 and "change-password" in refused.get_json()["detail"]
    assert not accounts.get_user(USER_ID).needs_setup
    assert bearer.get(f"{AUTH}/me", headers=headers).status_code == 200
    page = app.test_client()
    assert f"/admin/users/{USER_ID}/reset" not in page.get("/admin").text
    flashed = page.post(f"/admin/users/{USER_ID}/reset", follow_redirects=True)
    assert "Change your own password on your account page." in flashed.text
    assert accounts.list_tokens(USER_ID) != []
