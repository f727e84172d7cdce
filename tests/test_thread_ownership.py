"""User B against user A's thread, on every route that has a thread id (SPEC 7.4).

The routes are read from the app's URL map, so a route added later (in any blueprint) is
checked without editing this file: each must answer 404 `Thread {id} not found` to a user
who does not own the thread, for reads and writes alike, and change nothing on disk or in
the records.
"""

from __future__ import annotations

import hashlib
import os
import threading
from io import BytesIO
from pathlib import Path

import pytest
from conftest import USER_ID
from conftest import needs_auth
from conftest import thread_dir
from conftest import uploads_dir
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.agent.tools import make_file_tools
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.agent_helpers import make_runtime

pytestmark = needs_auth

T = "shared"
PLACEHOLDERS = {
    "filename": "a.txt",
    "virtual_path": "mnt/user-data/uploads/a.txt",
    "path": "uploads/a.txt",
    "area": "outputs",
    "folder": "",
}


def snapshot(base_dir: Path) -> dict[str, str]:
    """Every file under the data dir except the databases, with a hash of its bytes."""
    result = {}
    for root, _dirs, files in os.walk(base_dir):
        for name in files:
            path = Path(root) / name
            if "sqlite3" in name or name == "secret_key":
                continue
            result[str(path.relative_to(base_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return result


def thread_routes(app: Flask) -> list[tuple[str, str, str]]:
    """(method, url, endpoint) for every rule whose URL has a thread id."""
    routes = []
    for rule in app.url_map.iter_rules():
        if "thread_id" not in rule.arguments:
            continue
        values = {name: PLACEHOLDERS.get(name, "x") for name in rule.arguments}
        values["thread_id"] = T
        with app.test_request_context():
            from flask import url_for

            url = url_for(rule.endpoint, **values)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            routes.append((method, url, rule.endpoint))
    return routes


@pytest.fixture
def alice_app(app: Flask) -> Flask:
    """The test user (alice) owns thread `shared`, with a file, a record and a preview turn."""
    client = app.test_client()
    data = {"files": [(BytesIO(b"alice's secret"), "a.txt")]}
    assert client.post(f"/api/threads/{T}/uploads", data=data).status_code == 200
    chat = client.post(f"/threads/{T}/chat", data={"message": "hi", "mode": "current"})
    assert chat.status_code == 302
    outputs = thread_dir(app_base(app), T) / "user-data" / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / "report.md").write_text("# alice's report")
    return app


def app_base(app: Flask) -> Path:
    return Path(app.extensions[EXTENSION_KEY].settings.base_dir)


@pytest.fixture
def bob(alice_app: Flask) -> FlaskClient:
    services = alice_app.extensions[EXTENSION_KEY]
    account = services.accounts.create_user("bob@example.com", "bob's password")
    return alice_app.test_client(user_id=account.id)


def test_every_thread_route_hides_alices_thread_from_bob(
    alice_app: Flask, bob: FlaskClient, base_dir: Path
) -> None:
    services = alice_app.extensions[EXTENSION_KEY]
    before = snapshot(base_dir)
    records = services.uploads.list_uploads(T, USER_ID)
    turns = services.chat_previews.history(T, USER_ID)
    routes = thread_routes(alice_app)
    assert len(routes) >= 20  # the API, the pages and the chat preview
    for method, url, endpoint in routes:
        kwargs = {}
        if method in ("POST", "PUT", "PATCH"):
            kwargs["data"] = {
                "files": [(BytesIO(b"bob"), "a.txt")],
                "filename": "a.txt",
                "filenames": "a.txt",
                "new_name": "b.txt",
                "confirmed": "yes",
                "message": "hi",
                "mode": "current",
            }
        response = bob.open(url, method=method, **kwargs)
        body = response.get_data(as_text=True)
        response.close()
        assert response.status_code == 404, (method, url, endpoint, body[:200])
        if url.startswith("/api/"):
            assert response.get_json() == {"detail": f"Thread {T} not found"}, (method, url)
        else:
            assert f"Thread {T} not found" in body and "<html" in body, (method, url)
    assert snapshot(base_dir) == before
    assert services.uploads.list_uploads(T, USER_ID) == records
    assert services.chat_previews.history(T, USER_ID) == turns
    assert services.owners.owner(T) == USER_ID
    bob_id = services.accounts.find_by_email("bob@example.com").id
    assert not (base_dir / "users" / bob_id).exists()


def test_the_index_lists_only_the_callers_threads(alice_app: Flask, bob: FlaskClient) -> None:
    alice = alice_app.test_client()
    assert f"/threads/{T}" in alice.get("/").get_data(as_text=True)
    assert bob.post("/threads").status_code == 302
    page = bob.get("/").get_data(as_text=True)
    assert f"/threads/{T}" not in page and "thread-link" in page
    bobs = alice_app.extensions[EXTENSION_KEY].owners.owned(
        alice_app.extensions[EXTENSION_KEY].accounts.find_by_email("bob@example.com").id
    )
    assert len(bobs) == 1 and f"/threads/{bobs[0]}" in page
    assert f"/threads/{bobs[0]}" not in alice.get("/").get_data(as_text=True)


def test_bobs_token_is_refused_on_alices_thread(alice_app: Flask, bob: FlaskClient) -> None:
    secret = bob.post("/api/v1/auth/tokens", json={"name": "script"}).get_json()["token"]
    client = alice_app.test_client(user_id=None)
    headers = {"Authorization": f"Bearer {secret}"}
    listing = client.get(f"/api/threads/{T}/uploads/list", headers=headers)
    assert listing.status_code == 404
    gone = client.delete(f"/api/threads/{T}/uploads/a.txt", headers=headers)
    assert gone.status_code == 404
    assert [
        r.filename for r in alice_app.extensions[EXTENSION_KEY].uploads.list_uploads(T, USER_ID)
    ] == ["a.txt"]


def test_two_users_racing_for_one_new_thread_id(app: Flask, base_dir: Path) -> None:
    services = app.extensions[EXTENSION_KEY]
    users = [services.accounts.create_user(f"u{i}@example.com", "racer password") for i in range(4)]
    clients = [app.test_client(user_id=user.id) for user in users]
    barrier = threading.Barrier(len(clients))
    statuses: dict[str, int] = {}

    def race(user_id: str, client: FlaskClient) -> None:
        barrier.wait()
        data = {"files": [(BytesIO(user_id.encode()), "mine.txt")]}
        statuses[user_id] = client.post("/api/threads/race/uploads", data=data).status_code

    workers = [
        threading.Thread(target=race, args=(user.id, client))
        for user, client in zip(users, clients, strict=True)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    winners = [user_id for user_id, status in statuses.items() if status == 200]
    assert len(winners) == 1
    assert sorted(statuses.values()) == [200, 404, 404, 404]
    winner = winners[0]
    assert services.owners.owner("race") == winner
    assert (uploads_dir(base_dir, "race", winner) / "mine.txt").read_bytes() == winner.encode()
    for user in users:
        if user.id != winner:
            assert not thread_dir(base_dir, "race", user.id).exists()


def test_the_same_id_string_is_one_thread_not_two(app: Flask) -> None:
    """Thread ids are global: once claimed, another user cannot start a thread under it."""
    services = app.extensions[EXTENSION_KEY]
    alice = app.test_client()
    assert (
        alice.post(
            "/api/threads/project/uploads", data={"files": [(BytesIO(b"a"), "a.txt")]}
        ).status_code
        == 200
    )
    carol = services.accounts.create_user("carol@example.com", "carol password")
    response = app.test_client(user_id=carol.id).post(
        "/threads/project/upload", data={"files": [(BytesIO(b"c"), "c.txt")]}
    )
    assert response.status_code == 404


def test_agent_tools_with_bobs_user_id_see_nothing_of_alices_thread(
    alice_app: Flask, bob: FlaskClient, base_dir: Path
) -> None:
    services = alice_app.extensions[EXTENSION_KEY]
    bob_id = services.accounts.find_by_email("bob@example.com").id
    before = snapshot(base_dir)
    tools = {
        tool.name: tool
        for tool in make_file_tools(
            paths=services.uploads.paths, upload_service=services.uploads, require_user=True
        )
    }
    runtime = make_runtime({"thread_id": T, "user_id": bob_id})
    listed = tools["list_uploaded_files"].invoke({"runtime": runtime})
    assert listed["files"] == []
    read = tools["read_file"].invoke({"path": "/mnt/user-data/uploads/a.txt", "runtime": runtime})
    assert "alice's secret" not in str(read)
    found = tools["glob"].invoke({"pattern": "**/*", "runtime": runtime})
    assert "a.txt" not in str(found) and "report.md" not in str(found)
    grep = tools["grep"].invoke({"pattern": "secret", "path": "/mnt/user-data", "runtime": runtime})
    assert "alice" not in str(grep)
    assert snapshot(base_dir) == before
    assert not (base_dir / "users" / bob_id).exists()
    mine = tools["read_file"].invoke(
        {
            "path": "/mnt/user-data/uploads/a.txt",
            "runtime": make_runtime({"thread_id": T, "user_id": USER_ID}),
        }
    )
    assert "alice's secret" in str(mine)


def test_agent_tools_refuse_a_run_without_a_user_when_accounts_are_on(
    alice_app: Flask, base_dir: Path
) -> None:
    services = alice_app.extensions[EXTENSION_KEY]
    (uploads_dir(base_dir, T, None)).mkdir(parents=True)  # a flat-layout decoy
    (uploads_dir(base_dir, T, None) / "a.txt").write_text("flat")
    tools = {
        tool.name: tool for tool in make_file_tools(paths=services.uploads.paths, require_user=True)
    }
    runtime = make_runtime({"thread_id": T})
    for name, args in (
        ("list_uploaded_files", {}),
        ("read_file", {"path": "/mnt/user-data/uploads/a.txt"}),
        ("glob", {"pattern": "*"}),
        ("grep", {"pattern": "flat"}),
    ):
        answer = tools[name].invoke({**args, "runtime": runtime})
        assert "no user id" in str(answer), name
        assert "flat" not in str(answer).replace("no user id", ""), name
