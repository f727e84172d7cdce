"""DeerFlow's auth endpoints, API tokens, CSRF and the admin API over HTTP (SPEC 7.2, 7.3, 7.5)."""

from __future__ import annotations

from io import BytesIO
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import update

from deerflow_web.services.accounts.service import ADDRESS_ATTEMPTS
from deerflow_web.storage.database import api_tokens
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import USER_ID
from tests.helpers import needs_auth
from tests.helpers import uploads_dir

pytestmark = needs_auth

AUTH = "/api/v1/auth"
ADMIN = "/api/v1/admin"


def accounts_of(app: Flask):
    return app.extensions[EXTENSION_KEY].accounts


def anonymous(app: Flask) -> FlaskClient:
    return app.test_client(user_id=None)


def login(client: FlaskClient, email: str, password: str, **form: str):
    return client.post(
        f"{AUTH}/login/local", data={"username": email, "password": password, **form}
    )


def cookie_headers(response) -> dict[str, str]:
    """Set-Cookie values by cookie name."""
    return {value.split("=", 1)[0]: value for value in response.headers.getlist("Set-Cookie")}


def make_user(app: Flask, email: str = "bob@example.com", role: str = "user"):
    return accounts_of(app).create_user(email, "bob's password", role=role)


def upload(client: FlaskClient, thread_id: str = "t1", **kwargs: Any):
    data = {"files": [(BytesIO(b"hello"), "a.txt")]}
    return client.post(f"/api/threads/{thread_id}/uploads", data=data, **kwargs)


def detail_code(response) -> str:
    return response.get_json()["detail"]["code"]


# --- fresh install -----------------------------------------------------------------------


@pytest.fixture
def fresh(make_app) -> Flask:
    return make_app(test_user=False)


def test_fresh_install_sends_every_page_to_setup(fresh: Flask) -> None:
    client = anonymous(fresh)
    for path in ("/", "/threads/t1", "/login", "/account"):
        response = client.get(path)
        assert response.status_code == 302 and response.headers["Location"] == "/setup", path
    assert client.get(f"{AUTH}/setup-status").get_json() == {
        "needs_setup": True,
        "registration_enabled": False,
    }
    response = client.get("/api/threads/t1/uploads/list")
    assert response.status_code == 401
    assert response.get_json()["detail"]["code"] == "not_authenticated"


def test_initialize_creates_the_admin_and_signs_in(fresh: Flask, base_dir) -> None:
    client = anonymous(fresh)
    response = client.post(
        f"{AUTH}/initialize", json={"email": "Root@Example.com", "password": "root password"}
    )
    assert response.status_code == 201
    body = response.get_json()
    assert set(body) == {"id", "email", "system_role", "needs_setup", "oauth_provider"}
    assert body["email"] == "root@example.com" and body["system_role"] == "admin"
    cookies = cookie_headers(response)
    assert "HttpOnly" in cookies["access_token"] and "SameSite=Lax" in cookies["access_token"]
    assert "SameSite=Strict" in cookies["csrf_token"] and "HttpOnly" not in cookies["csrf_token"]
    assert "Secure" not in cookies["access_token"]  # plain HTTP on loopback
    assert client.get(f"{AUTH}/me").get_json()["id"] == body["id"]
    csrf = client.get_cookie("csrf_token").value
    assert upload(client, headers={"X-CSRF-Token": csrf}).status_code == 200
    assert (base_dir / "users" / body["id"] / "threads" / "t1" / "user-data" / "uploads").is_dir()
    again = anonymous(fresh).post(
        f"{AUTH}/initialize", json={"email": "x@example.com", "password": "another password"}
    )
    assert again.status_code == 409 and detail_code(again) == "system_already_initialized"


@pytest.mark.parametrize(
    ("body", "status"),
    (
        ({"email": "not-an-email", "password": "root password"}, 400),
        ({"email": "root@example.com", "password": "short"}, 400),
        ({"email": "root@example.com", "password": "password123"}, 400),
        ({"email": "root@example.com"}, 422),
        ({"password": "root password"}, 422),
        ({"email": ["root@example.com"], "password": "root password"}, 422),
        ({"email": "root@example.com", "password": 12345678}, 422),
        ({"email": "root@example.com", "password": "root password", "remember_me": "<"}, 422),
        ({"email": "root@example.com", "password": "root password", "remember_me": 1}, 422),
        (["email", "password"], 422),
        ("root@example.com", 422),
    ),
)
def test_initialize_refuses_bad_input(fresh: Flask, body: Any, status: int) -> None:
    response = anonymous(fresh).post(f"{AUTH}/initialize", json=body)
    assert response.status_code == status
    assert response.get_json()["detail"]
    assert accounts_of(fresh).needs_setup()


def test_initialize_with_a_body_that_is_not_json(fresh: Flask) -> None:
    response = anonymous(fresh).post(
        f"{AUTH}/initialize", data="email=a", content_type="text/plain"
    )
    assert response.status_code == 422


def test_a_megabyte_of_json_is_refused(fresh: Flask) -> None:
    body = b'{"email": "root@example.com", "password": "' + b"x" * (1024 * 1024) + b'"}'
    response = anonymous(fresh).post(
        f"{AUTH}/initialize", data=body, content_type="application/json"
    )
    assert response.status_code == 413
    assert response.get_json()["detail"]
    assert accounts_of(fresh).needs_setup()


# --- login, logout, me ---------------------------------------------------------------------


def test_login_sets_deerflows_cookies_persistent_by_default(app: Flask) -> None:
    client = anonymous(app)
    response = login(client, TEST_EMAIL, TEST_PASSWORD)  # no remember_me: DeerFlow's True
    assert response.status_code == 200
    assert response.get_json() == {"expires_in": 7 * 24 * 3600, "needs_setup": False}
    cookies = cookie_headers(response)
    assert set(cookies) == {"access_token", "deerflow_session_persistent", "csrf_token"}
    access = cookies["access_token"]
    for attribute in ("HttpOnly", "SameSite=Lax", "Max-Age=604800", "Path=/"):
        assert attribute in access and attribute in cookies["deerflow_session_persistent"]
    assert "Secure" not in access  # plain HTTP on loopback
    assert cookies["deerflow_session_persistent"].startswith("deerflow_session_persistent=1;")
    assert "Max-Age=604800" in cookies["csrf_token"] and "SameSite=Strict" in cookies["csrf_token"]
    assert "HttpOnly" not in cookies["csrf_token"]
    secret = client.get_cookie("access_token").value
    assert len(secret) >= 43 and secret.count(".") == 0  # an opaque secret, not a JWT
    assert client.get(f"{AUTH}/me").get_json()["email"] == TEST_EMAIL


@pytest.mark.parametrize("value", ("false", "0", "off"))
def test_remember_me_false_gives_a_browser_session(app: Flask, value: str) -> None:
    response = login(anonymous(app), TEST_EMAIL, TEST_PASSWORD, remember_me=value)
    cookies = cookie_headers(response)
    for name in ("access_token", "deerflow_session_persistent", "csrf_token"):
        assert "Max-Age" not in cookies[name] and "Expires" not in cookies[name], name
    assert cookies["deerflow_session_persistent"].startswith("deerflow_session_persistent=0;")


@pytest.mark.parametrize(
    ("email", "password"),
    ((TEST_EMAIL, "wrong password"), ("nobody@example.com", TEST_PASSWORD)),
)
def test_wrong_credentials_are_one_401(app: Flask, email: str, password: str) -> None:
    client = anonymous(app)
    response = login(client, email, password)
    assert response.status_code == 401
    assert response.get_json()["detail"] == {
        "code": "invalid_credentials",
        "message": "Incorrect email or password",
    }
    assert "access_token" not in cookie_headers(response)
    assert client.get(f"{AUTH}/me").status_code == 401


@pytest.mark.parametrize("form", ({}, {"username": TEST_EMAIL}, {"password": "x"}))
def test_login_with_missing_fields_is_422(app: Flask, form: dict[str, str]) -> None:
    response = anonymous(app).post(f"{AUTH}/login/local", data=form)
    assert response.status_code == 422
    assert isinstance(response.get_json()["detail"], list)


def test_json_login_is_a_validation_error_not_a_crash(app: Flask) -> None:
    response = anonymous(app).post(
        f"{AUTH}/login/local", json={"username": TEST_EMAIL, "password": TEST_PASSWORD}
    )
    assert response.status_code == 422


def test_lockout_after_five_failures_answers_429_with_retry_after(app: Flask) -> None:
    client = anonymous(app)
    for _ in range(5):
        assert login(client, TEST_EMAIL, "wrong password").status_code == 401
    locked = login(client, TEST_EMAIL, TEST_PASSWORD)  # even the right password
    assert locked.status_code == 429
    assert 295 <= int(locked.headers["Retry-After"]) <= 300
    assert locked.get_json() == {"detail": "Too many login attempts. Try again later."}
    assert "access_token" not in cookie_headers(locked)


def test_lockout_per_client_address(app: Flask) -> None:
    client = anonymous(app)
    for index in range(ADDRESS_ATTEMPTS):
        login(client, f"guess{index}@example.com", "whatever password")
    assert login(client, TEST_EMAIL, TEST_PASSWORD).status_code == 429
    other = anonymous(app).post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        environ_base={"REMOTE_ADDR": "10.1.2.3"},
    )
    assert other.status_code == 200


def test_logout_kills_the_session_server_side(app: Flask) -> None:
    client = anonymous(app)
    login(client, TEST_EMAIL, TEST_PASSWORD)
    stolen = client.get_cookie("access_token").value  # a copy kept by an attacker
    response = client.post(f"{AUTH}/logout")
    assert response.status_code == 200 and response.get_json()["message"]
    cleared = cookie_headers(response)
    for name in ("access_token", "deerflow_session_persistent", "csrf_token"):
        assert cleared[name].startswith(f"{name}=;"), name
    replay = anonymous(app)
    replay.set_cookie("access_token", stolen)
    me = replay.get(f"{AUTH}/me")
    assert me.status_code == 401 and detail_code(me) == "token_invalid"
    assert replay.get("/api/threads/t1/uploads/list").status_code == 401


def test_pages_and_api_without_credentials(app: Flask) -> None:
    client = anonymous(app)
    page = client.get("/threads/t1?q=x")
    assert page.status_code == 302
    assert page.headers["Location"] == "/login?next=/threads/t1?q%3Dx"
    api = client.get("/api/threads/t1/uploads/list")
    assert api.status_code == 401
    assert api.get_json() == {
        "detail": {"code": "not_authenticated", "message": "Authentication required"}
    }
    assert client.get(f"{AUTH}/setup-status").status_code == 200
    with client.get("/static/style.css") as static:
        assert static.status_code == 200


# --- CSRF -----------------------------------------------------------------------------------


def test_cookie_writes_need_the_csrf_header(app: Flask, base_dir) -> None:
    client = app.test_client()
    client.send_csrf = False
    missing = upload(client)
    assert missing.status_code == 403
    assert missing.get_json() == {"detail": "CSRF token missing. Include X-CSRF-Token header."}
    wrong = upload(client, headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403 and wrong.get_json() == {"detail": "CSRF token mismatch."}
    assert not uploads_dir(base_dir, "t1").exists()
    cookie = client.get_cookie("csrf_token").value
    assert upload(client, headers={"X-CSRF-Token": cookie}).status_code == 200
    assert client.get("/api/threads/t1/uploads/list").status_code == 200  # reads need none


def test_a_planted_csrf_cookie_does_not_help(app: Flask, base_dir) -> None:
    client = app.test_client()
    client.send_csrf = False
    client.set_cookie("csrf_token", "attacker-chosen")
    response = upload(client, headers={"X-CSRF-Token": "attacker-chosen"})
    assert response.status_code == 403
    assert response.get_json() == {"detail": "CSRF token mismatch."}
    client.delete_cookie("csrf_token")
    no_cookie = upload(client, headers={"X-CSRF-Token": "attacker-chosen"})
    assert no_cookie.get_json() == {"detail": "CSRF token missing. Include X-CSRF-Token header."}
    assert not uploads_dir(base_dir, "t1").exists()


def test_page_responses_renew_a_missing_csrf_cookie(app: Flask) -> None:
    client = app.test_client()
    client.delete_cookie("csrf_token")
    response = client.get("/")
    assert "csrf_token" in cookie_headers(response)


# --- API tokens ---------------------------------------------------------------------------


def create_token(client: FlaskClient, **body: Any):
    return client.post(f"{AUTH}/tokens", json={"name": "ci", **body})


def test_token_lifecycle(app: Flask, base_dir) -> None:
    client = app.test_client()
    response = create_token(client, expires_in_days=30)
    assert response.status_code == 201
    created = response.get_json()
    assert set(created) == {"id", "name", "token", "created_at", "expires_at"}
    assert created["expires_at"] - created["created_at"] == 30 * 86400
    bearer = anonymous(app)
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert upload(bearer, headers=headers).status_code == 200  # no CSRF header needed
    assert (uploads_dir(base_dir, "t1") / "a.txt").read_bytes() == b"hello"
    listed = client.get(f"{AUTH}/tokens").get_json()["tokens"]
    assert [t["name"] for t in listed] == ["ci"] and "token" not in listed[0]
    assert listed[0]["last_used_at"] is not None
    assert "set-cookie" not in {
        k.lower() for k in bearer.get(f"{AUTH}/me", headers=headers).headers.keys()
    }
    assert client.delete(f"{AUTH}/tokens/{created['id']}").status_code == 204
    revoked = bearer.get("/api/threads/t1/uploads/list", headers=headers)
    assert revoked.status_code == 401 and detail_code(revoked) == "token_invalid"


def test_forged_and_expired_tokens(app: Flask) -> None:
    client = anonymous(app)
    forged = client.get(
        "/api/threads/t1/uploads/list", headers={"Authorization": "Bearer dfw_made-up"}
    )
    assert forged.status_code == 401 and detail_code(forged) == "token_invalid"
    secret = create_token(app.test_client(), expires_in_days=1).get_json()["token"]
    with accounts_of(app).engine.begin() as db:
        db.execute(update(api_tokens).values(expires_at=1.0))
    expired = client.get(
        "/api/threads/t1/uploads/list", headers={"Authorization": f"Bearer {secret}"}
    )
    assert expired.status_code == 401 and detail_code(expired) == "token_expired"


@pytest.mark.parametrize(
    "body",
    (
        {"name": ""},
        {"name": 5},
        {"name": "x", "expires_in_days": "soon"},
        {"name": "x", "expires_in_days": 0},
        {"name": "x", "expires_in_days": 3651},
        {"name": "x", "expires_in_days": 2.5},
        {"name": "x", "expires_in_days": True},
        {"name": "x" * 101},
    ),
)
def test_bad_token_requests_are_422(app: Flask, body: dict[str, Any]) -> None:
    client = app.test_client()
    response = client.post(f"{AUTH}/tokens", json=body)
    assert response.status_code == 422
    assert client.get(f"{AUTH}/tokens").get_json() == {"tokens": []}


def test_token_days_may_be_a_whole_float(app: Flask) -> None:
    """JSON has one number type: 30.0 is the integer the document asks for."""
    client = app.test_client()
    response = create_token(client, expires_in_days=30.0)
    assert response.status_code == 201, response.get_json()
    created = response.get_json()
    assert created["expires_at"] - created["created_at"] == 30 * 86400


def test_another_users_token_cannot_be_deleted(app: Flask) -> None:
    bob = make_user(app)
    token = accounts_of(app).create_token(bob.id, "bob's")
    response = app.test_client().delete(f"{AUTH}/tokens/{token.token.id}")
    assert response.status_code == 404
    assert accounts_of(app).token_user(token.secret).id == bob.id


# --- change password, register --------------------------------------------------------------


def test_change_password_ends_other_sessions(app: Flask) -> None:
    here = app.test_client()
    elsewhere = app.test_client()
    wrong = here.post(
        f"{AUTH}/change-password",
        json={"current_password": "nope", "new_password": "a new password"},
    )
    assert wrong.status_code == 400
    assert wrong.get_json() == {
        "detail": {"code": "invalid_credentials", "message": "Current password is incorrect"}
    }
    weak = here.post(
        f"{AUTH}/change-password",
        json={"current_password": TEST_PASSWORD, "new_password": "12345678"},
    )
    assert weak.status_code == 400
    done = here.post(
        f"{AUTH}/change-password",
        json={"current_password": TEST_PASSWORD, "new_password": "a new password"},
    )
    assert done.status_code == 200
    assert done.get_json() == {"message": "Password changed successfully", "revoked_tokens": 0}
    assert set(cookie_headers(done)) == {
        "access_token",
        "deerflow_session_persistent",
        "csrf_token",
    }  # a fresh session replaces this one, as DeerFlow re-issues its cookie
    assert here.get(f"{AUTH}/me").status_code == 200
    assert elsewhere.get(f"{AUTH}/me").status_code == 401
    assert login(anonymous(app), TEST_EMAIL, "a new password").status_code == 200


def test_register_is_off_by_default(app: Flask) -> None:
    response = anonymous(app).post(
        f"{AUTH}/register", json={"email": "new@example.com", "password": "new password"}
    )
    assert response.status_code == 403 and detail_code(response) == "registration_disabled"


def test_register_when_enabled(make_app) -> None:
    app = make_app(auth={"registration_enabled": True})
    client = anonymous(app)
    assert client.get(f"{AUTH}/setup-status").get_json()["registration_enabled"] is True
    response = client.post(
        f"{AUTH}/register", json={"email": "new@example.com", "password": "new password"}
    )
    assert response.status_code == 201 and response.get_json()["system_role"] == "user"
    assert client.get(f"{AUTH}/me").get_json()["email"] == "new@example.com"
    taken = anonymous(app).post(
        f"{AUTH}/register", json={"email": "NEW@example.com", "password": "new password"}
    )
    assert taken.status_code == 400 and detail_code(taken) == "email_already_exists"


def test_cross_site_login_is_refused(app: Flask) -> None:
    response = anonymous(app).post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        headers={"Origin": "http://evil.example"},
    )
    assert response.status_code == 403
    assert response.get_json() == {"detail": "Cross-site auth request denied."}


# --- admin ---------------------------------------------------------------------------------


def test_admin_endpoints_need_the_admin_role(app: Flask) -> None:
    bob = make_user(app)
    client = app.test_client(user_id=bob.id)
    for method, path in (
        ("get", "/users"),
        ("post", "/users"),
        ("post", f"/users/{USER_ID}/disable"),
        ("post", f"/users/{USER_ID}/reset-password"),
    ):
        response = getattr(client, method)(f"{ADMIN}{path}", json={})
        assert response.status_code == 403, path
    assert not accounts_of(app).get_user(USER_ID).disabled


def test_admin_creates_disables_enables_and_resets(app: Flask, base_dir) -> None:
    admin = app.test_client()
    created = admin.post(
        f"{ADMIN}/users",
        json={"email": "carol@example.com", "password": "carol password", "system_role": "user"},
    )
    assert created.status_code == 201
    carol_id = created.get_json()["id"]
    carol = anonymous(app)
    assert login(carol, "carol@example.com", "carol password").status_code == 200
    token = carol.post(f"{AUTH}/tokens", json={"name": "t"}).get_json()["token"]
    bearer = {"Authorization": f"Bearer {token}"}

    disabled = admin.post(f"{ADMIN}/users/{carol_id}/disable")
    assert disabled.status_code == 200 and disabled.get_json()["revoked_tokens"] == 1
    assert carol.get(f"{AUTH}/me").status_code == 401  # the session ended at once
    refused = anonymous(app).get(f"{AUTH}/me", headers=bearer)
    assert refused.status_code == 401 and detail_code(refused) == "token_invalid"
    assert login(anonymous(app), "carol@example.com", "carol password").status_code == 401

    assert admin.post(f"{ADMIN}/users/{carol_id}/enable").status_code == 200
    again = anonymous(app).get(f"{AUTH}/me", headers=bearer)
    assert again.status_code == 401 and detail_code(again) == "token_invalid"  # stays revoked

    assert login(carol, "carol@example.com", "carol password").status_code == 200
    token = carol.post(f"{AUTH}/tokens", json={"name": "t2"}).get_json()["token"]
    reset = admin.post(f"{ADMIN}/users/{carol_id}/reset-password")
    assert reset.get_json()["revoked_tokens"] == 1 and "revoked" in reset.get_json()["message"]
    gone = anonymous(app).get(f"{AUTH}/me", headers={"Authorization": f"Bearer {token}"})
    assert gone.status_code == 401 and detail_code(gone) == "token_invalid"
    temporary = reset.get_json()["temporary_password"]
    fresh = anonymous(app)
    answer = login(fresh, "carol@example.com", temporary)
    assert answer.get_json()["needs_setup"] is True
    blocked = upload(fresh, headers={"X-CSRF-Token": fresh.get_cookie("csrf_token").value})
    assert blocked.status_code == 403 and "Password change required" in blocked.get_json()["detail"]
    users = {u["email"]: u for u in admin.get(f"{ADMIN}/users").get_json()["users"]}
    assert users["carol@example.com"]["needs_setup"] is True


def test_admin_bad_input(app: Flask) -> None:
    admin = app.test_client()
    assert admin.post(f"{ADMIN}/users/nobody/disable").status_code == 404
    oneself = admin.post(f"{ADMIN}/users/{USER_ID}/disable")
    assert oneself.status_code == 409, oneself.get_json()
    assert oneself.get_json()["detail"] == "An admin cannot disable their own account"
    assert not accounts_of(app).get_user(USER_ID).disabled
    bad_role = admin.post(
        f"{ADMIN}/users",
        json={"email": "d@example.com", "password": "d password", "system_role": "root"},
    )
    assert bad_role.status_code == 422
    taken = admin.post(f"{ADMIN}/users", json={"email": TEST_EMAIL, "password": "x password"})
    assert taken.status_code == 400


# --- proxies --------------------------------------------------------------------------------


def test_secure_cookies_behind_a_trusted_https_proxy(make_app) -> None:
    app = make_app(server={"trusted_proxies": 1})
    response = anonymous(app).post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"},
    )
    cookies = cookie_headers(response)
    for name in ("access_token", "deerflow_session_persistent", "csrf_token"):
        assert "Secure" in cookies[name], name


def test_forwarded_headers_are_ignored_without_trusted_proxies(app: Flask) -> None:
    client = anonymous(app)
    for index in range(ADDRESS_ATTEMPTS):  # a spoofed X-Forwarded-For must not dodge the lock
        login(
            client,
            f"guess{index}@example.com",
            "wrong password",
        )
    response = client.post(
        f"{AUTH}/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        headers={"X-Forwarded-For": "198.51.100.7", "X-Forwarded-Proto": "https"},
    )
    assert response.status_code == 429
    assert "access_token" not in cookie_headers(response)
    page = anonymous(app).get("/login", headers={"X-Forwarded-Proto": "https"})
    assert "__Host-" not in " ".join(page.headers.getlist("Set-Cookie"))
