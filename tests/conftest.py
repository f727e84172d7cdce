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
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from flask import request_finished
from flask.testing import FlaskClient

from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.storage.database import DATABASE_FILE
from deerflow_web.storage.database import default_database_url
from deerflow_web.storage.migrate import open_database
from deerflow_web.web import create_app
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import FAILURE_LOGS
from tests.helpers import UploadActions
from tests.helpers import prepare_test_app
from tests.support.clamd import Clamd
from tests.support.clamd import clamd_missing
from tests.support.openapi_check import check_response
from tests.support.postgres import PostgresServer
from tests.support.postgres import external_url
from tests.support.route_builders import install as cache_route_builders
from tests.support.seaweedfs import ACCESS_KEY as SEAWEEDFS_ACCESS_KEY
from tests.support.seaweedfs import SECRET_KEY as SEAWEEDFS_SECRET_KEY
from tests.support.seaweedfs import SeaweedFS
from tests.support.seaweedfs import weed_missing
from tests.support.template_cache import install as share_compiled_templates

# The modules that take longest (real processes, a real browser, OCR), longest first: on
# several processes (`make test` runs pytest-xdist, a module at a time per process) the
# last module a process picks up is then a short one, not a minutes-long one left to run
# alone. Seconds of one accounts-on run on two processes, under load (about twice a
# quiet machine's); modules not named follow, those of SLOW_FOLDERS first.
LONGEST_FIRST = (
    "tests/browser/test_file_manager_browser.py",  # 302 s
    "tests/web/api/test_s3_backend.py",  # 249
    "tests/system/test_instances.py",  # 228
    "tests/web/test_storage_migrate.py",  # 181
    "tests/browser/test_browser_pages.py",  # 153
    "tests/services/conversion/test_ocr.py",  # 152
    "tests/system/test_commit_races.py",  # 150
    "tests/system/test_api_fuzz.py",  # 124
    "tests/browser/test_artifacts_browser.py",  # 104
    "tests/system/test_s3_instances.py",  # 100
    "tests/web/test_thread_access.py",  # 85
    "tests/browser/test_browser_resumable.py",  # 83
    "tests/agent/test_reads_ocr.py",  # 82
    "tests/services/conversion/test_runner.py",  # 75
    "tests/system/test_slow_clients.py",  # 70
    "tests/system/test_fuzz_routes.py",  # 70
    "tests/services/conversion/test_jobs.py",  # 69
    "tests/system/test_robustness.py",  # 66
    "tests/system/test_deploy.py",  # 62
    "tests/web/transport/test_server.py",  # 62
    "tests/system/test_many_at_once.py",  # 58
    "tests/system/test_boot_outage.py",  # 53
    "tests/services/conversion/test_honesty.py",  # 53
    "tests/system/test_tus_outage.py",  # 53
    "tests/browser/test_browser_uploads.py",  # 52
    "tests/system/test_workers.py",  # 51
    "tests/web/api/test_scanning.py",  # 50
    "tests/web/api/test_history.py",  # 50
)
SLOW_FOLDERS = ("tests/system/", "tests/browser/")


def _running_order(item: pytest.Item) -> tuple[int, int]:
    module = item.nodeid.split("::", 1)[0]
    if module in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(module))
    return (1 if module.startswith(SLOW_FOLDERS) else 2, 0)


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands out modules by their count of tests, most first, unless told not
    to (`--loadscope-reorder` is its default): that left a five-minute module of a few
    tests to run alone at the end of a pass. The order below is kept instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_running_order)  # stable: a module's tests stay in their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    """A failed phase's report carries the logs its test asked for (`attach_on_failure`)."""
    report = yield
    if report.failed:
        for title, path in item.stash.get(FAILURE_LOGS, []):
            text = path.read_text(errors="replace") if path.exists() else "(never written)"
            report.sections.append((title, text[-LOG_TAIL_CHARS:]))
    return report


LOG_TAIL_CHARS = 20_000


@pytest.fixture(autouse=True, scope="session")
def _responses_fit_the_api_description() -> Iterator[None]:
    """Every API response any test receives must fit the OpenAPI document its app serves."""
    with request_finished.connected_to(check_response):
        yield


cache_route_builders()  # apps are built per test; their URL rules compile once (see there)
share_compiled_templates()  # and so do their templates

EXTERNAL_POSTGRES = external_url()  # read before any test clears the environment


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server (started on first use, see tests/support/postgres.py)."""
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


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for one module's tests that stop or crash it, so the session's
    server never goes down under the tests that follow (under load, a pooled connection
    the crash closed could still meet the next test)."""
    if EXTERNAL_POSTGRES:
        pytest.skip("the server was given from outside: a test cannot stop it")
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def own_postgres_url(own_postgres: PostgresServer) -> Iterator[str]:
    """A fresh database on `own_postgres` whose commits survive a crash, as a production
    server's do (the test servers turn `synchronous_commit` off for speed)."""
    url = own_postgres.create_database()
    own_postgres.commit_durably(url)
    try:
        yield url
    finally:
        own_postgres.drop_database(url)


@pytest.fixture(scope="session")
def postgres_template(postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PostgreSQL database at the newest schema revision, made once per test run (the
    server's counterpart of `migrated_database`): `migrated_postgres_url` copies it."""
    url = postgres.create_database()
    open_database(tmp_path_factory.mktemp("pg-template"), url).dispose()
    return url


@pytest.fixture
def migrated_postgres_url(postgres: PostgresServer, postgres_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database for this test, already migrated; dropped afterwards."""
    url = postgres.create_database(template=postgres_template)
    try:
        yield url
    finally:
        postgres.drop_database(url)


@pytest.fixture(scope="session")
def clamd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clamd]:
    """The session's clamd (tests/support/clamd.py): EICAR is its one signature. Tests
    that stop, pause or teach it use `make_clamd` instead."""
    if (reason := clamd_missing()) is not None:
        pytest.skip(reason)
    server = Clamd(tmp_path_factory.mktemp("clamd")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_clamd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start a clamd of this test's own (`stream_max`: its StreamMaxLength)."""
    if (reason := clamd_missing()) is not None:
        pytest.skip(reason)
    started: list[Clamd] = []

    def factory(stream_max: str = "256M") -> Clamd:
        server = Clamd(tmp_path_factory.mktemp("clamd"), stream_max).start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """The session's S3 server (SeaweedFS, started on first use, see tests/support/seaweedfs.py).

    Every bucket is a SeaweedFS collection with volumes of its own: tests share one bucket
    (`SeaweedFS.store`) and keep apart by key prefix."""
    if (reason := weed_missing()) is not None:
        pytest.skip(reason)
    server = SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, base_dir: Path, migrated_database: Path) -> str:
    """Each engine in turn, at the newest schema revision: the data dir's SQLite file
    (a copy of `migrated_database`), then a fresh PostgreSQL database (a copy of
    `postgres_template`). Tests of the migrations themselves take `empty_database_url`."""
    if request.param == "sqlite":
        _start_from_migrated(base_dir, migrated_database, even_with_a_url=True)
        return default_database_url(base_dir)
    return request.getfixturevalue("migrated_postgres_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, base_dir: Path) -> str:
    """Each engine in turn, without any table yet: the data dir's SQLite file (absent),
    then a fresh, empty PostgreSQL database; for tests of the migrations."""
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


# `DEER_FLOW_TEST_STORAGE=s3` runs the app-level suites on the S3 backend: every app a test
# makes keeps its files in a prefix of its own in the session's SeaweedFS bucket (`make test`
# runs the API and agent suites once more this way).
TEST_STORAGE = os.environ.get("DEER_FLOW_TEST_STORAGE", "local")
TEST_BUCKET = "deerflow-suite"


@pytest.fixture
def test_storage(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """The `storage:` config section of the apps this test makes (None: the local disk)."""
    if TEST_STORAGE != "s3":
        return None
    server: SeaweedFS = request.getfixturevalue("seaweedfs")
    prefix = f"suite-{uuid.uuid4().hex[:12]}"
    server.store(TEST_BUCKET, prefix=prefix)  # creates the bucket on first use
    os.environ.setdefault("AWS_ACCESS_KEY_ID", SEAWEEDFS_ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SEAWEEDFS_SECRET_KEY)
    return {
        "backend": "s3",
        "s3": {
            "endpoint_url": server.endpoint_url,
            "bucket": TEST_BUCKET,
            "region": "us-east-1",
            "prefix": prefix,
        },
    }


@pytest.fixture
def make_app(
    base_dir: Path, tmp_path: Path, migrated_database: Path, test_storage: dict[str, Any] | None
) -> Iterator[Any]:
    """Build an app, optionally with an `uploads:` config section written to a YAML file."""

    def factory(
        uploads: dict[str, Any] | None = None,
        *,
        auth: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        scanning: dict[str, Any] | None = None,
        versions: dict[str, Any] | None = None,
        trash: dict[str, Any] | None = None,
        quotas: dict[str, Any] | None = None,
        retention: dict[str, Any] | None = None,
        jobs: dict[str, Any] | None = None,
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
            for name, value in (
                ("uploads", uploads),
                ("auth", auth),
                ("server", server),
                ("scanning", scanning),
                ("versions", versions),
                ("trash", trash),
                ("quotas", quotas),
                ("retention", retention),
                ("jobs", jobs),
                ("storage", test_storage),
            )
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
        if services.rescans is not None:
            services.rescans.stop()
        services.retention.stop()
        if services.stale_uploads is not None:
            services.stale_uploads.stop()
        services.engine.dispose()


def _start_from_migrated(base_dir: Path, template: Path, *, even_with_a_url: bool = False) -> None:
    """Give a data dir without a database a copy of the migrated one (see `migrated_database`);
    not when `DATABASE_URL` names another database, unless `even_with_a_url`."""
    target = base_dir / DATABASE_FILE
    if os.environ.get("DATABASE_URL") and not even_with_a_url:
        return
    if not base_dir.is_dir() or os.path.lexists(target):
        return
    shutil.copyfile(template, target)
    target.chmod(0o600)


@pytest.fixture
def app(make_app: Any) -> Flask:
    """An app whose thread storage lives in a fresh temp dir."""
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A test client of `app` (signed in as the test user when accounts are on)."""
    return app.test_client()


@pytest.fixture
def uploads(client: FlaskClient) -> UploadActions:
    """Upload, list and delete through the JSON API."""
    return UploadActions(client)
