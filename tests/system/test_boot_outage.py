"""A server that boots while PostgreSQL is down keeps running, and serves once it is back.

Real parts: gunicorn as `make run` starts it (two workers), `flask --app app worker`, and a
PostgreSQL server of this module's own, stopped (`pg_ctl stop`) before a worker loads the
app and started again while the same processes run. A worker that cannot reach the
database at boot used to exit with gunicorn's boot error, and gunicorn then stopped the
whole server; now it answers 503 with Retry-After and finishes starting once the database
answers (web/startup.py). A database that refuses the app's user or database is no
outage: the process stops with one line.

With accounts off nothing is written to the database before the outage, so the workers
meet an empty database when it comes back and migrate it themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import provision_server_user
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.live_server import ROOT
from tests.support.live_server import LiveServer
from tests.support.live_worker import LiveWorker
from tests.support.postgres import PostgresServer

AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
WORKERS = 2
OUT_OF_REACH = "out of reach ("  # each process's one line as its wait begins
ANSWERS_AGAIN = "answers again: start-up finished"
CANNOT_START = "deerflow-web cannot start: The database refused to serve this app"
RECOVERY_SECONDS = 60.0  # retries come every 5 s at most; a busy machine is slow to boot


def start_again(server: PostgresServer) -> None:
    """Start the server unless it runs already (the test started it itself)."""
    try:
        server.start_server()
    except subprocess.CalledProcessError:
        pass  # running


def worker_pids(arbiter: int) -> set[int]:
    """The processes gunicorn's arbiter forked: its workers."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == arbiter:  # field 4, after the name
            found.add(int(entry.name))
    return found


def log_count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text) if path.exists() else 0


def get(server: LiveServer, path: str) -> requests.Response:
    return requests.get(f"{server.url}{path}", headers=AUTH, timeout=30)


def upload_and_list(server: LiveServer, base_dir: Path, thread: str) -> None:
    """An upload is stored, and the listing shows it."""
    stored = requests.post(
        f"{server.url}/api/threads/{thread}/uploads",
        files={"files": ("after.txt", b"stored after the outage")},
        headers=AUTH,
        timeout=30,
    )
    assert stored.status_code == 200, stored.text
    listed = get(server, f"/api/threads/{thread}/uploads/list")
    assert listed.status_code == 200, listed.text
    assert [f["filename"] for f in listed.json()["files"]] == ["after.txt"]
    assert (uploads_dir(base_dir, thread) / "after.txt").read_bytes() == b"stored after the outage"


def assert_waiting_for_the_database(server: LiveServer) -> None:
    """Alive, not ready, and every other request answered 503 with Retry-After."""
    assert get(server, "/healthz").status_code == 200
    ready = get(server, "/readyz")
    assert ready.status_code == 503, ready.text
    assert ready.json()["database"] == "failed"
    listing = get(server, "/api/threads/T/uploads/list")
    assert listing.status_code == 503, listing.text
    assert listing.headers["Retry-After"] == "5"
    assert "database" in listing.json()["detail"]


@pytest.fixture
def database(own_postgres: PostgresServer, own_postgres_url: str, base_dir: Path) -> str:
    """A fresh database with the test user and SERVER_TOKEN (accounts on; with accounts
    off it stays empty, never migrated)."""
    provision_server_user(base_dir, database_url=own_postgres_url)
    return own_postgres_url


@pytest.fixture
def postgres_down(own_postgres: PostgresServer, database: str) -> Iterator[PostgresServer]:
    """The server stopped, as an outage would; up again afterwards (the database is dropped)."""
    own_postgres.stop_server("immediate")
    try:
        yield own_postgres
    finally:
        start_again(own_postgres)


@pytest.fixture
def server(base_dir: Path, database: str, tmp_path: Path) -> Iterator[LiveServer]:
    """A server on `database`, not started yet."""
    made = LiveServer(base_dir, database_url=database, workers=WORKERS, log=tmp_path / "web.log")
    try:
        yield made
    finally:
        made.kill()


def test_a_server_started_during_an_outage_waits_and_serves_once_postgresql_is_back(
    server: LiveServer, postgres_down: PostgresServer, base_dir: Path
) -> None:
    assert server.log is not None
    server.start()  # returns once /healthz answers 200
    arbiter = server.pid
    workers = wait_until(
        lambda: (found := worker_pids(arbiter)) and len(found) == WORKERS and found
    )
    wait_until(lambda: log_count(server.log, OUT_OF_REACH) == WORKERS, timeout=RECOVERY_SECONDS)
    assert_waiting_for_the_database(server)

    postgres_down.start_server()
    wait_until(lambda: log_count(server.log, ANSWERS_AGAIN) == WORKERS, timeout=RECOVERY_SECONDS)
    assert get(server, "/readyz").status_code == 200
    upload_and_list(server, base_dir, "after-outage")
    # The same processes all along: no worker failed to boot, nothing was restarted.
    assert server.process is not None and server.process.poll() is None
    assert server.pid == arbiter
    assert worker_pids(arbiter) == workers
    log = server.log.read_text(errors="replace")
    assert log.count(OUT_OF_REACH) == WORKERS  # one line per process, not one per retry
    assert "Traceback" not in log


def test_workers_killed_during_an_outage_are_replaced_and_the_server_survives(
    server: LiveServer, own_postgres: PostgresServer, base_dir: Path
) -> None:
    assert server.log is not None
    server.start()
    arbiter = server.pid
    first = wait_until(lambda: (found := worker_pids(arbiter)) and len(found) == WORKERS and found)
    assert get(server, "/readyz").status_code == 200
    own_postgres.stop_server("immediate")
    try:
        current = set(first)
        for old in sorted(first):  # each replacement boots while PostgreSQL is down
            os.kill(old, signal.SIGKILL)
            current = wait_until(
                lambda old=old: (
                    (found := worker_pids(arbiter))
                    and old not in found
                    and len(found) == WORKERS
                    and found
                ),
                timeout=RECOVERY_SECONDS,
            )
        assert current.isdisjoint(first)
        wait_until(lambda: log_count(server.log, OUT_OF_REACH) == WORKERS, timeout=RECOVERY_SECONDS)
        assert_waiting_for_the_database(server)
        assert server.process is not None and server.process.poll() is None
        assert worker_pids(arbiter) == current  # booted, and stayed up
    finally:
        start_again(own_postgres)
    wait_until(lambda: log_count(server.log, ANSWERS_AGAIN) == WORKERS, timeout=RECOVERY_SECONDS)
    upload_and_list(server, base_dir, "after-kill")
    assert server.pid == arbiter
    assert worker_pids(arbiter) == current


def test_a_jobs_worker_started_during_an_outage_waits_then_runs(
    base_dir: Path, database: str, postgres_down: PostgresServer, tmp_path: Path
) -> None:
    worker = LiveWorker(base_dir, tmp_path / "worker.log", database_url=database)
    try:
        worker.start(until="waits for the database")
        assert worker.process is not None and worker.process.poll() is None
        assert log_count(worker.log, OUT_OF_REACH) == 1
        postgres_down.start_server()
        wait_until(lambda: log_count(worker.log, "worker started") == 1, timeout=RECOVERY_SECONDS)
        assert worker.stop() == 0
    finally:
        worker.kill()
    assert "Traceback" not in worker.log.read_text(errors="replace")


def _refusing_url(postgres: PostgresServer, refused: str) -> str:
    if refused == "unknown-user":
        url = postgres.admin_url.set(username="nobody", password="not-the-password")
    else:
        url = postgres.admin_url.set(database="no_such_database")
    return url.render_as_string(hide_password=False)


def _assert_one_line_refusal(log: str, said: str, processes: int = 1) -> None:
    """Each process that loaded the app said the same one line, and nothing more."""
    lines = [line for line in log.splitlines() if CANNOT_START in line]
    assert 1 <= len(lines) <= processes, log
    assert len(set(lines)) == 1, log
    assert said in lines[0], log
    assert "not-the-password" not in log
    # No traceback through the app's code. (gunicorn's arbiter may print one of its own
    # when two workers report the load error in the same round: HaltServer raised twice.)
    files = [
        line.split('"')[1]
        for line in log.splitlines()
        if line.lstrip().startswith('File "') and line.count('"') >= 2
    ]
    ours = [name for name in files if "/deerflow_web/" in name or name.endswith("/app.py")]
    assert not ours, log


SAID = {
    "unknown-user": 'role "nobody" does not exist',
    "unknown-database": 'database "no_such_database" does not exist',
}


@pytest.mark.parametrize("refused", sorted(SAID))
def test_a_server_whose_database_refuses_it_exits_with_one_line(
    base_dir: Path, postgres: PostgresServer, tmp_path: Path, refused: str
) -> None:
    server = LiveServer(base_dir, database_url=_refusing_url(postgres, refused), workers=WORKERS)
    log = tmp_path / "web.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            server.command(),
            cwd=ROOT,
            env=server.environment(),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        status = process.wait(timeout=RECOVERY_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server kept running:\n{log.read_text(errors='replace')}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text(errors="replace")
    assert status != 0, text
    _assert_one_line_refusal(text, SAID[refused], processes=WORKERS)
    assert "App failed to load" in text, (
        text
    )  # gunicorn stopped, and did not boot worker after worker


@pytest.mark.parametrize("refused", sorted(SAID))
def test_a_jobs_worker_whose_database_refuses_it_exits_with_one_line(
    base_dir: Path, postgres: PostgresServer, tmp_path: Path, refused: str
) -> None:
    worker = LiveWorker(
        base_dir, tmp_path / "worker.log", database_url=_refusing_url(postgres, refused)
    )
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", "worker"],
        cwd=ROOT,
        env=worker.environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RECOVERY_SECONDS,
    )
    assert result.returncode != 0, result.stdout + result.stderr
    _assert_one_line_refusal(result.stdout + result.stderr, SAID[refused])
