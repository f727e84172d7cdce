"""What tests share besides fixtures: the test user, signed-in clients, the API calls tests
make most, the disk layout of the current mode, and the subprocess servers' token.

One importable module (`from tests.helpers import ...`): `conftest.py` holds only fixtures.
The suite runs in both modes of SPEC 7.1 (`make test` runs it twice). With accounts on (the
default) every app gets a signed-in test user, and the disk helpers return that user's
per-user folders; with `DEER_FLOW_AUTH_DISABLED=1` the flat layout of the first release.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any
from typing import TypeVar
from urllib.parse import urlsplit

import pytest
from argon2 import PasswordHasher
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.datastructures import Headers
from werkzeug.test import TestResponse

from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ThreadRef
from deerflow_web.services.accounts.passwords import Passwords
from deerflow_web.settings import parse_bool
from deerflow_web.storage.migrate import open_database
from deerflow_web.web.wiring import EXTENSION_KEY

AUTH_ON = not parse_bool(os.environ.get("DEER_FLOW_AUTH_DISABLED", ""))
TEST_EMAIL = "tester@example.com"
TEST_PASSWORD = "a test password"
# The signed-in test user's id, which the per-user layout puts in every path; None selects
# the flat layout, as the app itself does with accounts off.
USER_ID: str | None = "test-user" if AUTH_ON else None

# argon2id at its cheapest: the suite signs in thousands of times. Tests of the real
# parameters build their own `Passwords()`.
FAST_PASSWORDS = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)

needs_auth = pytest.mark.skipif(not AUTH_ON, reason="accounts are off (DEER_FLOW_AUTH_DISABLED)")

T = TypeVar("T")


def prepare_test_app(app: Flask, *, test_user: bool = True) -> None:
    """With accounts on: cheap hashing, the test user, and clients that sign in as them."""
    app.test_client_class = SignedInClient
    if not app.extensions[EXTENSION_KEY].settings.auth.enabled:
        return
    accounts = app.extensions[EXTENSION_KEY].accounts
    accounts.passwords = Passwords(FAST_PASSWORDS)
    if not test_user:
        app.config["NO_TEST_USER"] = True
        return
    if accounts.find_by_email(TEST_EMAIL) is None:
        accounts.create_user(TEST_EMAIL, TEST_PASSWORD, role="admin", user_id=USER_ID)


class SignedInClient(FlaskClient):
    """A test client signed in as the test user (or `user_id=`), sending the CSRF header.

    `app.test_client(user_id=None)` gives an anonymous client; `send_csrf = False` stops
    the automatic `X-CSRF-Token` header, for tests of the CSRF check itself. With
    accounts off this is a plain client.
    """

    def __init__(self, *args: Any, user_id: str | None = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.send_csrf = True
        services = self.application.extensions[EXTENSION_KEY]
        if not services.settings.auth.enabled:
            return
        chosen = USER_ID if user_id == "" else user_id
        if self.application.config.get("NO_TEST_USER") and user_id == "":
            chosen = None
        if chosen is not None:
            self.sign_in(chosen)

    def sign_in(self, user_id: str) -> str:
        """Open a server-side session for the user in this client; returns its secret."""
        from deerflow_web.web.accounts.gate import CSRF_COOKIE
        from deerflow_web.web.accounts.gate import SESSION_COOKIE
        from deerflow_web.web.accounts.gate import csrf_value

        secret = self.application.extensions[EXTENSION_KEY].accounts.open_session(user_id)
        self.set_cookie(SESSION_COOKIE, secret)
        with self.application.app_context():
            self.set_cookie(CSRF_COOKIE, csrf_value(secret))
        return secret

    def open(self, *args: Any, **kwargs: Any) -> TestResponse:
        if args and not isinstance(args[0], str):
            return super().open(*args, **kwargs)  # a prepared request (redirects)
        headers = Headers(kwargs.get("headers") or {})
        cookies = [self.get_cookie(name) for name in ("access_token", "csrf_token", "session")]
        host = headers.get("Host") or urlsplit(kwargs.get("base_url") or "").netloc
        hostname = urlsplit(f"http://{host}").hostname if host else None
        if hostname and hostname != "localhost":
            # The jar sends cookies by domain; tests of other Host headers and base URLs
            # are still made by the signed-in user.
            for cookie in cookies:
                if cookie is not None:
                    self.set_cookie(cookie.key, cookie.value, domain=hostname)
        csrf = cookies[1]
        if self.send_csrf and csrf is not None and "X-CSRF-Token" not in headers:
            headers["X-CSRF-Token"] = csrf.value
        kwargs["headers"] = headers
        return super().open(*args, **kwargs)


class UploadActions:
    """The API calls tests make most, by name."""

    def __init__(self, client: FlaskClient) -> None:
        self._client = client

    def upload(self, thread_id: str, *files: tuple[bytes, str], **form: str) -> TestResponse:
        data: dict[str, Any] = dict(form)
        data["files"] = [(BytesIO(body), name) for body, name in files]
        return self._client.post(f"/api/threads/{thread_id}/uploads", data=data)

    def list(self, thread_id: str) -> dict[str, Any]:
        response = self._client.get(f"/api/threads/{thread_id}/uploads/list")
        assert response.status_code == 200, response.get_json()
        return response.get_json()

    def names(self, thread_id: str) -> list[str]:
        return [f["filename"] for f in self.list(thread_id)["files"]]

    def delete(self, thread_id: str, filename: str) -> TestResponse:
        return self._client.delete(f"/api/threads/{thread_id}/uploads/{filename}")


def thread_ref(thread_id: str, user_id: str | None = USER_ID) -> ThreadRef:
    """The reference services take for a thread of the test user (None: the flat layout)."""
    return ThreadRef(thread_id, SINGLE_USER if user_id is None else user_id)


def thread_dir(base_dir: Path, thread_id: str, user_id: str | None = USER_ID) -> Path:
    """A thread's folder in the layout of the current mode (SPEC D1)."""
    if user_id is None:
        return base_dir / "threads" / thread_id
    return base_dir / "users" / user_id / "threads" / thread_id


def threads_root(base_dir: Path, user_id: str | None = USER_ID) -> Path:
    """The folder holding the threads of the current mode's layout."""
    return thread_dir(base_dir, "x", user_id).parent


def user_data_dir(base_dir: Path, thread_id: str, user_id: str | None = USER_ID) -> Path:
    """The folder agents see as /mnt/user-data."""
    return thread_dir(base_dir, thread_id, user_id) / "user-data"


def uploads_dir(base_dir: Path, thread_id: str, user_id: str | None = USER_ID) -> Path:
    """A thread's uploads folder in the layout of the current mode."""
    return user_data_dir(base_dir, thread_id, user_id) / "uploads"


# A fixed token for servers started in a subprocess (gunicorn): raw HTTP requests send it.
# `next=` values that must never be followed (web/security.py `safe_next`): other sites,
# paths a browser reads as another host, and control characters, which browsers drop
# (so `/\t/evil.example` is `//evil.example`).
OFF_SITE_NEXT = (
    "https://evil.example/",
    "//evil.example",
    "//evil.example/threads",
    "/\\evil.example",
    "http:/evil.example",
    "javascript:alert(1)",
    "threads/t1",
    "x",
    "/\t/evil.example",
    "/\n/evil.example",
    "/\r/evil.example",
    "/threads/t1\x00",
)

SERVER_TOKEN = "dfw_test-token-of-the-subprocess-servers-0123456789"


def auth_header_line() -> str:
    """`Authorization: Bearer ...\\r\\n` with accounts on, nothing with them off."""
    return f"Authorization: Bearer {SERVER_TOKEN}\r\n" if AUTH_ON else ""


def provision_server_user(base_dir: Path, database_url: str | None = None) -> None:
    """Before a subprocess server starts on `base_dir` (and `database_url`, when given):
    the test user and SERVER_TOKEN."""
    if not AUTH_ON:
        return
    import hashlib
    import time

    from sqlalchemy import insert

    from deerflow_web.services.accounts.service import AccountService
    from deerflow_web.storage.database import api_tokens

    engine = open_database(base_dir, database_url)
    accounts = AccountService(engine, Passwords(FAST_PASSWORDS))
    if accounts.find_by_email(TEST_EMAIL) is None:
        accounts.create_user(TEST_EMAIL, TEST_PASSWORD, role="admin", user_id=USER_ID)
        with engine.begin() as db:
            db.execute(
                insert(api_tokens).values(
                    id="server-token",
                    token_hash=hashlib.sha256(SERVER_TOKEN.encode()).hexdigest(),
                    user_id=USER_ID,
                    name="subprocess servers",
                    created_at=time.time(),
                )
            )
    engine.dispose()


def wait_until(condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy, and return that; fail after
    `timeout` seconds. For waiting on another process or thread, never to order events."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"still false after {timeout} s: {condition}")
        time.sleep(interval)


FAILURE_LOGS = pytest.StashKey[list[tuple[str, Path]]]()


def attach_on_failure(request: pytest.FixtureRequest, title: str, path: Path) -> None:
    """Show the file at `path` (its end) in the report of this test if it fails: the logs
    of the processes it started, so a failure seen once under load explains itself."""
    request.node.stash.setdefault(FAILURE_LOGS, []).append((title, path))
