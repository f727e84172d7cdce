"""Thread ids per user (SPEC 7.4; issue 23 item 1, issue 25 item 5): two users, one id.

The routes are read from the app's URL map, so a route added later (in any blueprint) is
checked without editing this file. On SQLite and on PostgreSQL, for every route with a
thread id and every method:

- nothing user B sends changes anything of user A's thread of the same id, and A's
  thread keeps answering A as before (A's `alpha-7` and B's are two threads);
- A's id and an id nobody uses answer B exactly alike: no status, body or header tells
  them apart (no oracle);
- a request that fails creates nothing: no file or folder, no row in any table.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from flask import Flask
from flask import url_for
from flask.testing import FlaskClient
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import text
from werkzeug.test import TestResponse

from deerflow_web.agent.tools import make_file_tools
from deerflow_web.storage.database import make_engine
from deerflow_web.storage.database import preview_turns
from deerflow_web.storage.database import record_versions
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import uploads
from deerflow_web.storage.database import users
from deerflow_web.storage.migrate import _config
from deerflow_web.storage.migrate import open_database
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID
from tests.helpers import needs_auth
from tests.helpers import thread_dir
from tests.helpers import uploads_dir
from tests.support.agent_helpers import make_runtime

pytestmark = needs_auth

SHARED = "alpha-7"  # alice's thread; bob has none of that id at first
UNUSED = "omega-7"  # nobody's
PLACEHOLDERS = {
    "filename": "a.txt",
    "virtual_path": "mnt/user-data/uploads/a.txt",
    "path": "uploads/a.txt",
    "area": "outputs",
    "folder": "",
    "upload_id": "0123456789abcdef0123456789abcdef",
}
TUS = {"Tus-Resumable": "1.0.0"}
# The views that may serve a thread the caller does not have yet (web/thread_access.py).
MAY_BE_NEW = {
    "api.upload_files",
    "api.upload_limits",
    "api.list_uploads",
    "api.tus.server_options",
    "api.tus.create_upload",
    "pages.thread_files",
    "pages.upload_files",
    "pages.browse_area",
    "chat.chat_preview",
    "chat.preview_message",
    "chat.preview_tool",
    "chat.upload_files",
}
DATA_TABLES = (threads, uploads, record_versions, preview_turns, resumable_uploads)


def services_of(app: Flask) -> Any:
    return app.extensions[EXTENSION_KEY]


def base_of(app: Flask) -> Path:
    return Path(services_of(app).settings.base_dir)


def files_under(root: Path) -> dict[str, str]:
    """Every file and folder under `root` except the databases, files with a hash."""
    result = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            result[str((Path(folder) / name).relative_to(root)) + "/"] = "folder"
        for name in files:
            path = Path(folder) / name
            if "sqlite3" in name or name == "secret_key":
                continue
            result[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return result


def rows_of(app: Flask, where: str | None = None) -> dict[str, list[tuple]]:
    """The thread data tables' rows (all, or those whose text mentions `where`)."""
    result = {}
    with services_of(app).engine.connect() as db:
        for table in DATA_TABLES:
            rows = sorted(tuple(str(v) for v in row) for row in db.execute(select(table)))
            result[table.name] = [r for r in rows if where is None or any(where in v for v in r)]
    return result


def thread_routes(app: Flask, thread_id: str) -> list[tuple[str, str, str]]:
    """(method, url, endpoint) for every rule whose URL has a thread id, each method the
    rule has (not the HEAD and OPTIONS Flask adds by itself)."""
    routes = []
    for rule in app.url_map.iter_rules():
        if "thread_id" not in rule.arguments:
            continue
        methods = set(rule.methods or ())
        if "GET" in methods:
            methods.discard("HEAD")
        if rule.provide_automatic_options:
            methods.discard("OPTIONS")
        values = {name: PLACEHOLDERS.get(name, "x") for name in rule.arguments}
        values["thread_id"] = thread_id
        with app.test_request_context():
            url = url_for(rule.endpoint, **values)
        for method in sorted(methods):
            routes.append((method, url, rule.endpoint))
    return routes


def writing_request(method: str, endpoint: str) -> dict[str, Any]:
    """What a client that means it sends: a file, the form fields, tus headers."""
    kwargs: dict[str, Any] = {}
    if ".tus." in endpoint:
        headers = dict(TUS)
        if method == "POST":
            headers.update({"Upload-Length": "3", "Upload-Metadata": "filename YS50eHQ="})
        if method == "PATCH":
            headers.update(
                {"Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
            )
            kwargs["data"] = b"bob"
        kwargs["headers"] = headers
        return kwargs
    if endpoint.startswith("api.threads_api."):
        kwargs["json"] = {"metadata": {"by": "bob"}, "values": {"title": "Bob's"}}
        return kwargs
    if method in ("POST", "PUT", "PATCH"):
        kwargs["data"] = {
            "files": [(BytesIO(b"bob"), "a.txt")],
            "filename": "a.txt",
            "filenames": "a.txt",
            "new_name": "b.txt",
            "title": "Bob's",
            "confirmed": "yes",
            "message": "hi",
            "mode": "current",
            "tool": "read_file",
            "path": "/mnt/user-data/uploads/a.txt",
        }
    return kwargs


def failing_request(method: str, endpoint: str) -> dict[str, Any]:
    """A request of that route that must fail: creating routes get a body they refuse."""
    kwargs = writing_request(method, endpoint)
    if endpoint == "api.upload_files":
        kwargs["data"] = {"other": "no files field"}  # 422
    elif endpoint == "api.tus.create_upload":
        kwargs["headers"] = dict(TUS)  # no Upload-Length: 400
    elif endpoint in ("pages.upload_files", "chat.upload_files"):
        kwargs["data"] = {"files": [(BytesIO(b""), "")]}  # no file chosen
    elif endpoint == "chat.preview_message":
        kwargs["data"] = {"message": "hi", "mode": "no-such-mode"}  # 422
    elif endpoint == "chat.preview_tool":
        kwargs["data"] = {"tool": "no-such-tool"}  # 422
    return kwargs


def send(client: FlaskClient, method: str, url: str, **kwargs: Any) -> TestResponse:
    response = client.open(url, method=method, **kwargs)
    response.get_data()
    response.close()
    return response


_VARYING = (
    re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+(?:\+00:00|Z)?"),  # ISO times
    re.compile(r"\b\d{9,}(?:\.\d+)?\b"),  # POSIX times, ns
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
    re.compile(r"/tus/[0-9A-Za-z_-]{16,}"),  # upload ids
    re.compile(r"\b[0-9a-f]{32}\b"),  # trash entry and version ids
    re.compile(r"[A-Za-z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} [\d:]+ GMT"),  # HTTP dates
    re.compile(r'(?<=name="csrf-token" content=")[^"]*'),  # per session, signed with the time
    re.compile(r'(?<=name="csrf_token" value=")[^"]*'),
    re.compile(r"\d{4}-\d\d-\d\d|\b\d{1,2}:\d\d(?::\d\d)?\b"),  # dates and times shown
    re.compile(r"(?<=turn=)\d+"),  # preview turns are numbered across all threads
    # Flash messages are shown once, on whichever page comes next in that session.
    re.compile(r'<div class="flashes".*?</div>', re.DOTALL),
)


def seen_by_client(response: TestResponse, thread_id: str) -> tuple[int, str, list[str]]:
    """Status, body and headers with the thread id and what varies per call masked."""
    body = response.get_data(as_text=True).replace(thread_id, "{id}")
    headers = [
        f"{name}: {value}".replace(thread_id, "{id}")
        for name, value in response.headers.items()
        if name.lower() not in ("content-length", "set-cookie")
    ]
    for pattern in _VARYING:
        body = pattern.sub("#", body)
        headers = [pattern.sub("#", header) for header in headers]
    return response.status_code, " ".join(body.replace("#", " ").split()), sorted(headers)


@pytest.fixture
def two_users(
    make_app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Flask, FlaskClient, FlaskClient]]:
    """Alice (the test user) has thread `alpha-7`: a file, a title, outputs and a preview
    turn; bob is signed in too and has no thread yet. Each engine in turn."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    app = make_app()
    alice = app.test_client()
    data = {"files": [(BytesIO(b"alice's secret"), "a.txt")]}
    assert alice.post(f"/api/threads/{SHARED}/uploads", data=data).status_code == 200
    titled = alice.patch(f"/api/threads/{SHARED}", json={"values": {"title": "Alice's plans"}})
    assert titled.status_code == 200
    chat = alice.post(f"/threads/{SHARED}/chat", data={"message": "hi", "mode": "current"})
    assert chat.status_code == 302
    outputs = thread_dir(base_of(app), SHARED) / "user-data" / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / "report.md").write_text("# alice's report")
    account = services_of(app).accounts.create_user("bob@example.com", "bob's password")
    yield app, alice, app.test_client(user_id=account.id)


def bob_id(app: Flask) -> str:
    return services_of(app).accounts.find_by_email("bob@example.com").id


class TestTwoUsersOneThreadId:
    """The four-account probe's cases, as a class: every route, two users, one id."""

    def test_nothing_bob_sends_changes_alices_thread(self, two_users: Any) -> None:
        app, alice, bob = two_users
        mine = thread_dir(base_of(app), SHARED)
        files, rows = files_under(mine), rows_of(app, USER_ID)
        listing = alice.get(f"/api/threads/{SHARED}/uploads/list").get_json()
        record = alice.get(f"/api/threads/{SHARED}").get_json()
        routes = thread_routes(app, SHARED)
        assert len(routes) >= 25  # the API, the thread records, tus, the pages, the chat
        for method, url, endpoint in routes:
            response = send(bob, method, url, **writing_request(method, endpoint))
            assert response.status_code < 500, (method, url, response.get_data(as_text=True))
        assert files_under(mine) == files
        assert rows_of(app, USER_ID) == rows
        assert alice.get(f"/api/threads/{SHARED}/uploads/list").get_json() == listing
        assert alice.get(f"/api/threads/{SHARED}").get_json() == record
        read = send(alice, "GET", f"/api/threads/{SHARED}/artifacts/mnt/user-data/uploads/a.txt")
        assert read.get_data() == b"alice's secret"
        # What bob did, he did to his own thread of that id (his upload made it).
        bobs = uploads_dir(base_of(app), SHARED, bob_id(app))
        assert sorted(p.name for p in bobs.iterdir()) == ["a.txt"]
        assert (bobs / "a.txt").read_bytes() == b"bob"

    def test_alices_id_and_an_unused_id_answer_bob_alike(self, two_users: Any) -> None:
        app, _alice, bob = two_users
        # A second session of bob's for the other id: flash messages stay per session.
        bob_again = app.test_client(user_id=bob_id(app))
        unused = {(m, e): u for m, u, e in thread_routes(app, UNUSED)}
        compared = 0
        for method, url, endpoint in thread_routes(app, SHARED):
            for make in (failing_request, writing_request):
                for_alices = send(bob, method, url, **make(method, endpoint))
                other_url = unused[(method, endpoint)]
                for_nobodys = send(bob_again, method, other_url, **make(method, endpoint))
                seen = seen_by_client(for_alices, SHARED)
                assert seen == seen_by_client(for_nobodys, UNUSED), (method, url)
                compared += 1
        assert compared >= 50
        # Searching and listing bob's threads never shows alice's either.
        found = bob.post("/api/threads/search", json={"metadata": {}}).get_json()
        assert {t["thread_id"] for t in found} == {SHARED, UNUSED}
        assert all("Alice" not in str(t) for t in found)

    def test_a_failed_request_creates_nothing(self, two_users: Any) -> None:
        app, _alice, bob = two_users
        base = base_of(app)
        files, rows = files_under(base), rows_of(app)
        for method, url, endpoint in thread_routes(app, "fresh"):
            response = send(bob, method, url, **failing_request(method, endpoint))
            body = response.get_data(as_text=True)
            if endpoint in MAY_BE_NEW:
                assert response.status_code in (200, 204, 302, 400, 422), (method, url, body)
                continue
            assert response.status_code == 404, (method, url, body[:300])
            if method == "HEAD":
                continue  # no body
            if url.startswith("/api/"):
                assert response.get_json() == {"detail": "Thread fresh not found"}, (method, url)
            else:
                assert "That thread does not exist" in body and "<html" in body, (method, url)
        for method, url, endpoint in thread_routes(app, "fresh"):  # meant, in vain
            if endpoint not in MAY_BE_NEW:
                response = send(bob, method, url, **writing_request(method, endpoint))
                assert response.status_code == 404, (method, url)
        assert files_under(base) == files
        assert rows_of(app) == rows
        assert not (base / "users" / bob_id(app)).exists()

    def test_the_probes_squatting_case(self, two_users: Any) -> None:
        """Bob's failed delete no longer claims `project-q4`; alice uses it after him,
        and still after bob is disabled; bob's own `project-q4` is his own thread."""
        app, alice, bob = two_users
        refused = bob.delete("/api/threads/project-q4/uploads/x")
        assert refused.status_code == 404
        assert refused.get_json() == {"detail": "Thread project-q4 not found"}
        data = {"files": [(BytesIO(b"q4 numbers"), "q4.csv")]}
        assert alice.post("/api/threads/project-q4/uploads", data=data).status_code == 200
        services_of(app).accounts.set_disabled(bob_id(app), True)
        listing = alice.get("/api/threads/project-q4/uploads/list").get_json()
        assert [f["filename"] for f in listing["files"]] == ["q4.csv"]
        assert alice.delete("/api/threads/project-q4/uploads/q4.csv").status_code == 200
        services_of(app).accounts.set_disabled(bob_id(app), False)
        bob = app.test_client(user_id=bob_id(app))
        data = {"files": [(BytesIO(b"bob's"), "b.csv")]}
        assert bob.post("/api/threads/project-q4/uploads", data=data).status_code == 200
        assert alice.get("/api/threads/project-q4/uploads/list").get_json()["count"] == 0

    def test_users_racing_for_one_new_id_each_get_their_own_thread(self, two_users: Any) -> None:
        app, _alice, _bob = two_users
        accounts = services_of(app).accounts
        racers = [accounts.create_user(f"u{i}@example.com", "racer password") for i in range(4)]
        clients = [app.test_client(user_id=user.id) for user in racers]
        barrier = threading.Barrier(len(clients) * 2)
        statuses: list[int] = []

        def race(user_id: str, client: FlaskClient, how: str) -> None:
            barrier.wait()
            if how == "upload":
                data = {"files": [(BytesIO(user_id.encode()), "mine.txt")]}
                statuses.append(client.post("/api/threads/race/uploads", data=data).status_code)
            else:
                created = client.post("/api/threads", json={"thread_id": "race"})
                statuses.append(created.status_code)

        workers = [
            threading.Thread(target=race, args=(user.id, client, how))
            for user, client in zip(racers, clients, strict=True)
            for how in ("upload", "create")
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert statuses == [200] * 8
        base = base_of(app)
        for user, client in zip(racers, clients, strict=True):
            assert (
                uploads_dir(base, "race", user.id) / "mine.txt"
            ).read_bytes() == user.id.encode()
            [found] = client.post("/api/threads/search", json={}).get_json()
            assert found["thread_id"] == "race"
        with services_of(app).engine.connect() as db:
            owners = db.execute(select(threads.c.user_id).where(threads.c.thread_id == "race"))
            assert sorted(owners.scalars()) == sorted(user.id for user in racers)

    def test_bobs_token_reaches_only_bobs_threads(self, two_users: Any) -> None:
        app, alice, bob = two_users
        secret = bob.post("/api/v1/auth/tokens", json={"name": "script"}).get_json()["token"]
        client = app.test_client(user_id=None)
        headers = {"Authorization": f"Bearer {secret}"}
        listing = client.get(f"/api/threads/{SHARED}/uploads/list", headers=headers)
        assert listing.get_json() == {"files": [], "count": 0}  # bob's own, empty
        gone = client.delete(f"/api/threads/{SHARED}/uploads/a.txt", headers=headers)
        assert gone.get_json() == {"detail": f"Thread {SHARED} not found"}
        dropped = client.delete(f"/api/threads/{SHARED}", headers=headers)
        assert dropped.status_code == 404
        names = alice.get(f"/api/threads/{SHARED}/uploads/list").get_json()["files"]
        assert [f["filename"] for f in names] == ["a.txt"]

    def test_the_index_lists_only_the_callers_threads(self, two_users: Any) -> None:
        app, alice, bob = two_users
        assert "Alice&#39;s plans" in alice.get("/").get_data(as_text=True)
        assert bob.post("/threads", data={"title": "Bob's notes"}).status_code == 302
        page = bob.get("/").get_data(as_text=True)
        assert f"/threads/{SHARED}" not in page and "Alice" not in page
        assert "Bob&#39;s notes" in page
        [bobs] = services_of(app).threads.all(bob_id(app))
        assert f"/threads/{bobs.thread_id}" in page
        assert f"/threads/{bobs.thread_id}" not in alice.get("/").get_data(as_text=True)


def test_agent_tools_with_bobs_user_id_see_nothing_of_alices_thread(
    two_users: Any, base_dir: Path
) -> None:
    app, _alice, _bob = two_users
    services = services_of(app)
    before = files_under(base_dir)
    tools = {
        tool.name: tool
        for tool in make_file_tools(
            paths=services.uploads.paths, upload_service=services.uploads, require_user=True
        )
    }
    runtime = make_runtime({"thread_id": SHARED, "user_id": bob_id(app)})
    listed = tools["list_uploaded_files"].invoke({"runtime": runtime})
    assert listed["files"] == []
    read = tools["read_file"].invoke({"path": "/mnt/user-data/uploads/a.txt", "runtime": runtime})
    assert "alice's secret" not in str(read)
    found = tools["glob"].invoke({"pattern": "**/*", "runtime": runtime})
    assert "a.txt" not in str(found) and "report.md" not in str(found)
    grep = tools["grep"].invoke({"pattern": "secret", "path": "/mnt/user-data", "runtime": runtime})
    assert "alice" not in str(grep)
    assert files_under(base_dir) == before
    assert not (base_dir / "users" / bob_id(app)).exists()
    mine = tools["read_file"].invoke(
        {
            "path": "/mnt/user-data/uploads/a.txt",
            "runtime": make_runtime({"thread_id": SHARED, "user_id": USER_ID}),
        }
    )
    assert "alice's secret" in str(mine)


def test_agent_tools_refuse_a_run_without_a_user_when_accounts_are_on(
    app: Flask, base_dir: Path
) -> None:
    services = services_of(app)
    (uploads_dir(base_dir, SHARED, None)).mkdir(parents=True)  # a flat-layout decoy
    (uploads_dir(base_dir, SHARED, None) / "a.txt").write_text("flat")
    tools = {
        tool.name: tool for tool in make_file_tools(paths=services.uploads.paths, require_user=True)
    }
    runtime = make_runtime({"thread_id": SHARED})
    for name, args in (
        ("list_uploaded_files", {}),
        ("read_file", {"path": "/mnt/user-data/uploads/a.txt"}),
        ("glob", {"pattern": "*"}),
        ("grep", {"pattern": "flat"}),
    ):
        answer = tools[name].invoke({**args, "runtime": runtime})
        assert "no user id" in str(answer), name
        assert "flat" not in str(answer).replace("no user id", ""), name


def test_the_global_claims_become_per_user_threads(base_dir: Path, empty_database_url: str) -> None:
    """Migration 0003: every claimed id stays its owner's thread, titles empty."""
    engine = make_engine(empty_database_url)
    with engine.begin() as db:
        command.upgrade(_config(db), "0002")
    with engine.begin() as db:
        db.execute(insert(users).values(
            id="u1", email="a@example.com", password_hash="x", system_role="user",
            needs_setup=False, disabled=False, created_at=1.0,
        ))  # fmt: skip
        db.execute(text("INSERT INTO thread_owners VALUES ('project-q4', 'u1', 12.5)"))
    engine.dispose()
    engine = open_database(base_dir, empty_database_url)
    with engine.connect() as db:
        assert db.execute(select(threads)).all() == [("u1", "project-q4", None, "{}", 12.5, 12.5)]
        tables = db.dialect.get_table_names(db)
    assert "thread_owners" not in tables
    engine.dispose()
