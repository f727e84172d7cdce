"""Shared fixtures: an app over a fresh data dir, its client, and an upload helper.

The suite runs in both modes of SPEC 7.1 (`make test` runs it twice). With accounts on
(the default) every app gets a signed-in test user: `app.test_client()` returns a client
with a live server-side session that echoes the `csrf_token` cookie in `X-CSRF-Token`, and
the disk helpers below return that user's per-user folders. With `DEER_FLOW_AUTH_DISABLED=1`
the same tests run against the single-user flat layout of the first release.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any
from typing import TypeVar
from urllib.parse import urlsplit

import pytest
import yaml
from argon2 import PasswordHasher
from flask import Flask
from flask import request_finished
from flask.testing import FlaskClient
from werkzeug.datastructures import Headers
from werkzeug.test import TestResponse

from deerflow_web.services.accounts.passwords import Passwords
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.settings import parse_bool
from deerflow_web.storage.database import DATABASE_FILE
from deerflow_web.storage.database import default_database_url
from deerflow_web.storage.migrate import open_database
from deerflow_web.web import create_app
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.openapi_check import check_response
from tests.postgres import PostgresServer
from tests.postgres import external_url

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


@pytest.fixture(autouse=True, scope="session")
def _responses_fit_the_api_description() -> Iterator[None]:
    """Every API response any test receives must fit the OpenAPI document its app serves."""
    with request_finished.connected_to(check_response):
        yield


EXTERNAL_POSTGRES = external_url()  # read before any test clears the environment


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server (started on first use, see tests/postgres.py)."""
    server = PostgresServer.start(EXTERNAL_POSTGRES)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test; dropped afterwards."""
    url = postgres.create_database()
    try:
        yield url
    finally:
        postgres.drop_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, base_dir: Path) -> str:
    """Each engine in turn: the data dir's SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return default_database_url(base_dir)
    return request.getfixturevalue("postgres_url")


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the developer's config, data dir, home or database."""
    for name in (
        "DEER_FLOW_HOME",
        "DEER_FLOW_CONFIG_PATH",
        "DEER_FLOW_PROJECT_ROOT",
        "DATABASE_URL",
        "TEST_DATABASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture(autouse=True)
def _no_lease_keeper_outlives_its_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stop every conversion lease keeper a test started, however it made its jobs object.

    A keeper left running renews leases in a database its test has dropped and logs each
    failure with a traceback; Python 3.11 formats those with `ast`, whose recursion counter
    is not thread-safe, and a test parsing source meanwhile failed with a SystemError.
    """
    started: list[ConversionJobs] = []
    start = ConversionJobs.start_keeper

    def recorded(jobs: ConversionJobs) -> None:
        started.append(jobs)
        start(jobs)

    monkeypatch.setattr(ConversionJobs, "start_keeper", recorded)
    yield
    for jobs in started:
        jobs.stop_keeper()


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    """The data root of the app under test."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded database at the newest schema revision, made once per test run.

    Running the migrations costs a fresh app a good part of its start-up; `make_app` copies
    this file into a data dir that has no database yet, and the app then finds nothing to
    upgrade. Tests of the migrations themselves build their own files.
    """
    folder = tmp_path_factory.mktemp("migrated")
    engine = open_database(folder)
    with engine.connect() as db:
        db.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return folder / DATABASE_FILE


@pytest.fixture
def make_app(base_dir: Path, tmp_path: Path, migrated_database: Path) -> Iterator[Any]:
    """Build an app, optionally with an `uploads:` config section written to a YAML file."""

    def factory(
        uploads: dict[str, Any] | None = None,
        *,
        auth: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        test_user: bool = True,
        **overrides: Any,
    ) -> Flask:
        """`uploads`, `auth` and `server` become sections of a config file; with
        `test_user=False` the app starts as a fresh install (no account yet)."""
        config: dict[str, Any] = {
            "TESTING": True,
            "BASE_DIR": str(base_dir),
            "WTF_CSRF_ENABLED": False,
        }
        sections = {
            name: value
            for name, value in (("uploads", uploads), ("auth", auth), ("server", server))
            if value is not None
        }
        if sections:
            path = tmp_path / "config.yaml"
            path.write_text(yaml.safe_dump(sections), encoding="utf-8")
            config["CONFIG_PATH"] = str(path)
        config.update(overrides)
        _start_from_migrated(Path(config["BASE_DIR"]), migrated_database)
        app = create_app(config)
        prepare_test_app(app, test_user=test_user)
        made.append(app)
        return app

    made: list[Flask] = []
    yield factory
    for app in made:  # no lease keeper or pooled connection outlives its test
        services = app.extensions[EXTENSION_KEY]
        services.conversions.stop_keeper()
        services.engine.dispose()


def _start_from_migrated(base_dir: Path, template: Path) -> None:
    """Give a data dir without a database a copy of the migrated one (see `migrated_database`)."""
    target = base_dir / DATABASE_FILE
    if os.environ.get("DATABASE_URL") or not base_dir.is_dir() or os.path.lexists(target):
        return
    shutil.copyfile(template, target)
    target.chmod(0o600)


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
        from deerflow_web.web.auth import CSRF_COOKIE
        from deerflow_web.web.auth import SESSION_COOKIE
        from deerflow_web.web.auth import csrf_value

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


@pytest.fixture
def app(make_app: Any) -> Flask:
    """An app whose thread storage lives in a fresh temp dir."""
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A test client of `app` (signed in as the test user when accounts are on)."""
    return app.test_client()


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


@pytest.fixture
def uploads(client: FlaskClient) -> UploadActions:
    """Upload, list and delete through the JSON API."""
    return UploadActions(client)


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
    from deerflow_web.storage.migrate import open_database

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
