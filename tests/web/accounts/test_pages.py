"""The account pages through the test client: set-up, sign in and out, account, admin."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import OFF_SITE_NEXT
from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import USER_ID
from tests.helpers import needs_auth

pytestmark = needs_auth


def text(response: Any) -> str:
    return response.get_data(as_text=True)


def anonymous(app: Flask) -> FlaskClient:
    return app.test_client(user_id=None)


def sign_in(client: FlaskClient, email: str, password: str, next_url: str = "", **form: str):
    data = {"email": email, "password": password, "next": next_url, **form}
    return client.post("/login", data=data)


def test_setup_page_creates_the_first_admin(make_app) -> None:
    app = make_app(test_user=False)
    client = anonymous(app)
    page = client.get("/setup")
    assert page.status_code == 200 and "Create the admin account" in text(page)
    weak = client.post("/setup", data={"email": "root@example.com", "password": "password"})
    assert weak.status_code == 400 and "too common" in text(weak)
    done = client.post("/setup", data={"email": "root@example.com", "password": "root password"})
    assert done.status_code == 302 and done.headers["Location"] == "/"
    home = client.get("/")
    assert home.status_code == 200 and "Signed in as root@example.com" in text(home)
    assert anonymous(app).get("/setup").headers["Location"] == "/login"
    again = anonymous(app).post("/setup", data={"email": "x@example.com", "password": "x password"})
    assert again.status_code == 302
    assert [a.email for a in app.extensions[EXTENSION_KEY].accounts.list_users()] == [
        "root@example.com"
    ]


def test_sign_in_returns_to_the_page_that_asked(app: Flask) -> None:
    client = anonymous(app)
    bounce = client.get("/threads/t1")
    assert bounce.headers["Location"] == "/login?next=/threads/t1"
    form = client.get(bounce.headers["Location"])
    assert 'name="next" type="hidden" value="/threads/t1"' in text(form)
    response = sign_in(client, TEST_EMAIL, TEST_PASSWORD, "/threads/t1")
    assert response.status_code == 302 and response.headers["Location"] == "/threads/t1"
    assert client.get("/threads/t1").status_code == 200


@pytest.mark.parametrize("target", OFF_SITE_NEXT)
def test_next_never_leaves_the_site(app: Flask, target: str) -> None:
    response = sign_in(anonymous(app), TEST_EMAIL, TEST_PASSWORD, target)
    assert response.status_code == 302
    assert response.headers["Location"] == "/"


@pytest.mark.parametrize(
    "form",
    ({}, {"email": TEST_EMAIL}, {"password": TEST_PASSWORD}, {"email": "", "password": ""}),
)
def test_sign_in_form_with_missing_fields(app: Flask, form: dict[str, str]) -> None:
    client = anonymous(app)
    response = client.post("/login", data=form)
    assert response.status_code == 400
    assert client.get("/").status_code == 302  # still signed out


def test_wrong_password_and_lockout_on_the_page(app: Flask) -> None:
    client = anonymous(app)
    for _ in range(5):
        response = sign_in(client, TEST_EMAIL, "wrong password")
        assert response.status_code == 401 and "Incorrect email or password." in text(response)
    locked = sign_in(client, TEST_EMAIL, TEST_PASSWORD)
    assert locked.status_code == 429 and locked.headers["Retry-After"]
    assert "Too many failed sign-ins" in text(locked)


def test_sign_out_ends_the_session_and_the_thread_page_asks_again(app: Flask) -> None:
    client = anonymous(app)
    sign_in(client, TEST_EMAIL, TEST_PASSWORD)
    stolen = client.get_cookie("access_token").value
    response = client.post("/logout")
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    again = client.get("/threads/t1")
    assert again.headers["Location"] == "/login?next=/threads/t1"
    replay = anonymous(app)
    replay.set_cookie("access_token", stolen)
    bounced = replay.get("/threads/t1")
    assert bounced.status_code == 302
    assert "access_token=;" in " ".join(bounced.headers.getlist("Set-Cookie"))  # cleared


def test_logout_form_needs_its_csrf_token(make_app) -> None:
    app = make_app(WTF_CSRF_ENABLED=True)
    client = app.test_client()
    assert client.post("/logout").status_code == 400
    assert client.get("/").status_code == 200  # still signed in


def test_header_shows_who_is_signed_in(client: FlaskClient) -> None:
    html = text(client.get("/"))
    assert f"Signed in as {TEST_EMAIL}" in html
    assert 'action="/logout"' in html and 'href="/account"' in html and 'href="/admin"' in html


def test_header_in_chinese(client: FlaskClient) -> None:
    html = text(client.get("/", headers={"Accept-Language": "zh-CN"}))
    assert f"已登录：{TEST_EMAIL}" in html and "退出登录" in html


def test_account_page_creates_a_token_shown_once(app: Flask, client: FlaskClient) -> None:
    response = client.post("/account/tokens", data={"name": "laptop", "expires_in_days": "30"})
    assert response.status_code == 302 and response.headers["Location"] == "/account"
    html = text(client.get("/account"))
    match = re.search(r'id="new-token"[^>]*value="(dfw_[^"]+)"', html)
    assert match is not None and "will not be shown again" in html
    secret = match.group(1)
    bearer = app.test_client(user_id=None).get(
        "/api/v1/auth/me", headers={"Authorization": f"Bearer {secret}"}
    )
    assert bearer.get_json()["email"] == TEST_EMAIL
    later = text(client.get("/account"))
    assert "laptop" in later and secret not in later
    [token] = app.extensions[EXTENSION_KEY].accounts.list_tokens(USER_ID)
    revoked = client.post(f"/account/tokens/{token.id}/revoke")
    assert revoked.status_code == 302
    assert app.extensions[EXTENSION_KEY].accounts.list_tokens(USER_ID) == []


def test_account_page_token_form_errors(client: FlaskClient) -> None:
    response = client.post("/account/tokens", data={"name": "", "expires_in_days": "0"})
    assert response.status_code == 400
    assert "Name the token." in text(response)


def test_account_page_changes_the_password(app: Flask, client: FlaskClient) -> None:
    other = app.test_client()
    wrong = client.post(
        "/account/password",
        data={"current_password": "nope", "new_password": "a fresh password"},
    )
    assert wrong.status_code == 400 and "Current password is incorrect" in text(wrong)
    done = client.post(
        "/account/password",
        data={"current_password": TEST_PASSWORD, "new_password": "a fresh password"},
    )
    assert done.status_code == 302
    assert client.get("/").status_code == 200
    assert other.get("/").status_code == 302  # the other session ended


def test_admin_page_manages_users(app: Flask, client: FlaskClient) -> None:
    page = client.get("/admin")
    assert page.status_code == 200 and TEST_EMAIL in text(page)
    created = client.post(
        "/admin/users",
        data={"email": "dora@example.com", "password": "dora password", "system_role": "user"},
    )
    assert created.status_code == 302
    accounts = app.extensions[EXTENSION_KEY].accounts
    dora = accounts.find_by_email("dora@example.com")
    dora_client = app.test_client(user_id=dora.id)
    assert dora_client.get("/admin").status_code == 403
    assert client.post(f"/admin/users/{dora.id}/disable").status_code == 302
    assert accounts.get_user(dora.id).disabled
    assert dora_client.get("/").status_code == 302
    assert client.post(f"/admin/users/{dora.id}/enable").status_code == 302
    reset = client.post(f"/admin/users/{dora.id}/reset")
    assert reset.status_code == 302 and reset.headers["Location"] == "/admin"
    shown = text(client.get("/admin"))
    temporary = re.search(r'value="([^"]+)" aria-label="Temporary password"', shown)
    assert temporary is not None and "API tokens revoked" in shown
    assert temporary.group(1) not in text(client.get("/admin"))  # shown once
    assert accounts.get_user(dora.id).needs_setup
    again = sign_in(anonymous(app), "dora@example.com", temporary.group(1))
    assert again.headers["Location"] == "/account"
    self_disable = client.post(f"/admin/users/{USER_ID}/disable", follow_redirects=True)
    assert "You cannot disable your own account." in text(self_disable)
    assert not accounts.get_user(USER_ID).disabled


def test_a_reset_password_must_be_changed_first(app: Flask) -> None:
    accounts = app.extensions[EXTENSION_KEY].accounts
    erin = accounts.create_user("erin@example.com", "erin password")
    temporary = accounts.reset_password(erin.id).temporary_password
    client = anonymous(app)
    response = sign_in(client, "erin@example.com", temporary, "/threads/t1")
    assert response.headers["Location"] == "/account"
    assert client.get("/threads/t1").headers["Location"] == "/account"
    client.post(
        "/account/password",
        data={"current_password": temporary, "new_password": "erin's own password"},
    )
    assert client.get("/threads/t1").status_code == 200
