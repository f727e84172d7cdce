"""An app built while its PostgreSQL server is down starts anyway, and finishes starting
once the server is back (web/startup.py); a database that refuses the app stops it.

Real parts: a PostgreSQL server of this module's own, stopped before the app is built and
started again while it runs, so the app's retries meet a real refused connection and then
a real, empty database to migrate.
"""

from __future__ import annotations

import io
import socket
import subprocess
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import make_url
from sqlalchemy.exc import DatabaseError

from deerflow_web.errors import ConfigError
from deerflow_web.storage.migrate import current_revision
from deerflow_web.storage.migrate import head_revision
from deerflow_web.web import create_app
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import AUTH_ON
from tests.helpers import prepare_test_app
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.postgres import PostgresServer

RECOVERY_SECONDS = 60  # the retries wait up to 5 s each; a busy machine starts PostgreSQL slowly


def start_again(server: PostgresServer) -> None:
    """Start the server unless it runs already (a test may have started it itself)."""
    try:
        server.start_server()
    except subprocess.CalledProcessError:
        pass  # running


@pytest.fixture
def stopped_postgres(own_postgres: PostgresServer, own_postgres_url: str) -> Iterator[str]:
    """A fresh database (never migrated) whose server is down; up again afterwards, so
    the database can be dropped."""
    own_postgres.stop_server()
    try:
        yield own_postgres_url
    finally:
        start_again(own_postgres)


@pytest.fixture
def build(base_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Flask]]:
    """Build an app on a database URL, as `make run` would (no test user yet)."""
    made: list[Flask] = []

    def factory(url: str) -> Flask:
        monkeypatch.setenv("DATABASE_URL", url)
        app = create_app({"TESTING": True, "BASE_DIR": str(base_dir), "WTF_CSRF_ENABLED": False})
        made.append(app)
        return app

    yield factory
    for app in made:  # no retrier, job thread or pooled connection outlives its test
        services = app.extensions[EXTENSION_KEY]
        services.startup.close()
        services.conversions.stop_keeper()
        services.retention.stop()
        services.engine.dispose()


def test_an_app_built_while_postgresql_is_down_answers_503_then_starts_when_it_is_back(
    build: Callable[[str], Flask],
    stopped_postgres: str,
    own_postgres: PostgresServer,
    base_dir: Path,
) -> None:
    app = build(stopped_postgres)
    client = app.test_client()
    services = app.extensions[EXTENSION_KEY]
    assert not services.startup.done

    assert client.get("/healthz").status_code == 200  # the process is alive
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.get_json()["database"] == "failed"
    assert ready.get_json()["storage"] == "ok"
    listing = client.get("/api/threads/T/uploads/list")
    assert listing.status_code == 503
    assert listing.headers["Retry-After"] == "5"
    assert "database" in listing.get_json()["detail"]
    upload = client.post("/api/threads/T/uploads", data={"files": [(io.BytesIO(b"x"), "a.txt")]})
    assert upload.status_code == 503
    assert upload.headers["Retry-After"] == "5"
    page = client.get("/")
    assert page.status_code == 503
    assert "text/html" in page.content_type
    with client.get("/static/style.css") as static:
        assert static.status_code == 200  # no database needed
    assert not (base_dir / "threads").exists()
    assert not (base_dir / "users").exists()  # nothing written for anyone

    own_postgres.start_server()
    wait_until(lambda: client.get("/readyz").status_code == 200, timeout=RECOVERY_SECONDS)
    assert services.startup.done
    with services.engine.connect() as db:
        assert current_revision(db) == head_revision()  # migrated by the waiting app

    prepare_test_app(app)  # the test user, now that there is a database to hold it
    client = app.test_client()
    stored = client.post("/api/threads/T/uploads", data={"files": [(io.BytesIO(b"x"), "a.txt")]})
    assert stored.status_code == 200, stored.get_json()
    listed = client.get("/api/threads/T/uploads/list")
    assert [f["filename"] for f in listed.get_json()["files"]] == ["a.txt"]
    assert (uploads_dir(base_dir, "T") / "a.txt").read_bytes() == b"x"


def test_the_first_request_after_the_database_is_back_is_served_without_waiting_for_a_retry(
    build: Callable[[str], Flask], stopped_postgres: str, own_postgres: PostgresServer
) -> None:
    app = build(stopped_postgres)
    startup = app.extensions[EXTENSION_KEY].startup
    startup.close()  # no background retry from now on: only requests try
    client = app.test_client()
    assert client.get("/api/threads/T/uploads/list").status_code == 503
    own_postgres.start_server()
    assert not startup.done
    listing = client.get("/api/threads/T/uploads/list")
    # Served: the sign-in gate answers with accounts on (nobody is signed in), the
    # listing without them.
    assert listing.status_code == (401 if AUTH_ON else 200), listing.get_json()
    assert startup.done


def test_a_command_run_while_the_database_is_down_does_nothing_and_says_why(
    build: Callable[[str], Flask], stopped_postgres: str
) -> None:
    app = build(stopped_postgres)
    result = app.test_cli_runner().invoke(args=["db", "upgrade"])
    assert result.exit_code == 1
    assert "cannot be reached; nothing was done" in result.output
    assert "Traceback" not in result.output


def test_callbacks_wait_for_the_start_up_and_run_once_it_is_done(
    build: Callable[[str], Flask], stopped_postgres: str, own_postgres: PostgresServer
) -> None:
    """What app.py defers (the lease keeper) runs after the migrations, not before."""
    app = build(stopped_postgres)
    startup = app.extensions[EXTENSION_KEY].startup
    ran: list[bool] = []
    startup.then(lambda: ran.append(startup.done))
    assert ran == []
    own_postgres.start_server()
    wait_until(lambda: ran, timeout=RECOVERY_SECONDS)
    assert ran == [True]
    startup.then(lambda: ran.append(True))  # done already: at once
    assert ran == [True, True]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never says a word: PostgreSQL's connect timeout."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        yield listener.getsockname()[1]


@pytest.mark.parametrize("outage", ["refused", "silent", "unresolved"])
def test_a_server_out_of_reach_at_start_is_waited_for(
    build: Callable[[str], Flask], silent_port: int, outage: str
) -> None:
    """Refused, timed out, a host not resolving (yet): an outage, never a reason to stop."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        closed_port = closed.getsockname()[1]
    host, port = {
        "refused": ("127.0.0.1", closed_port),
        "silent": ("127.0.0.1", silent_port),
        "unresolved": ("db.deerflow-test.invalid", 5432),
    }[outage]
    app = build(f"postgresql+psycopg://deerflow@{host}:{port}/deerflow")
    startup = app.extensions[EXTENSION_KEY].startup
    startup.close()  # no more retries: the attempt made while building decided
    assert not startup.done
    assert startup.failures >= 1  # the attempt made while building, perhaps a retry
    assert app.test_client().get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("part", "value", "said"),
    [
        ("username", "nobody", 'role "nobody" does not exist'),
        ("database", "no_such_database", 'database "no_such_database" does not exist'),
    ],
    ids=["unknown-user", "unknown-database"],
)
def test_a_database_that_refuses_the_app_stops_its_start_with_one_clear_line(
    build: Callable[[str], Flask], postgres: PostgresServer, part: str, value: str, said: str
) -> None:
    url = postgres.admin_url.set(**{part: value}).render_as_string(hide_password=False)
    with pytest.raises(ConfigError) as refused:
        build(url)
    message = str(refused.value)
    assert said in message
    assert "\n" not in message
    assert "check its user, password and database name" in message


@pytest.mark.parametrize(
    "url",
    ["postgresql+nosuchdriver://user@localhost/db", "not a database url"],
    ids=["unknown-driver", "malformed"],
)
def test_a_database_url_that_cannot_work_stops_the_start(
    build: Callable[[str], Flask], url: str
) -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL is not usable"):
        build(url)


def test_the_password_of_a_refused_url_is_not_in_the_message(
    build: Callable[[str], Flask], postgres: PostgresServer
) -> None:
    url = make_url(postgres.admin_url.set(username="nobody", password="s3cret-word"))
    with pytest.raises(ConfigError) as refused:
        build(url.render_as_string(hide_password=False))
    assert "s3cret-word" not in str(refused.value)


def test_sqlite_errors_still_stop_the_start(build: Callable[[str], Flask], base_dir: Path) -> None:
    """The embedded database is never "out of reach": a broken file fails at once."""
    broken = base_dir / "broken.sqlite3"
    broken.write_bytes(b"this is not a database file at all" * 100)
    with pytest.raises(DatabaseError, match="not a database"):
        build(f"sqlite:///{broken}")
