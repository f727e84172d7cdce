"""DeerFlow's thread records (`/api/threads`, issue 25 items 4 and 5), in both modes.

Requests are shaped exactly as DeerFlow's frontend sends them through the LangGraph SDK
(`threads.create`, `search`, `get`, `update`, `delete`): JSON bodies, the SDK's own extra
fields (`if_exists`, `sort_by`, `select`...), and, with accounts on, the session cookie
with `X-CSRF-Token` (the test client sends it) and a same-site `Origin`.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func
from sqlalchemy import select

from deerflow_web.storage.database import preview_turns
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import uploads
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import thread_dir
from tests.helpers import uploads_dir

ORIGIN = {"Origin": "http://localhost"}
TUS = {"Tus-Resumable": "1.0.0"}
ANSWER_KEYS = {
    "thread_id",
    "status",
    "created_at",
    "updated_at",
    "metadata",
    "values",
    "interrupts",
}


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


DEEP = nested(300)  # deeper than the answers' encoder goes


def post(client: FlaskClient, url: str, body: Any = None) -> Any:
    """A JSON post encoded by the standard library, which writes what orjson cannot."""
    data = b"" if body is None else json.dumps(body).encode()
    return client.post(url, data=data, content_type="application/json", headers=ORIGIN)


def when(stamp: str) -> datetime:
    """A DeerFlow timestamp: ISO 8601 with the UTC offset."""
    parsed = datetime.fromisoformat(stamp)
    assert parsed.tzinfo is not None and parsed.utcoffset().total_seconds() == 0, stamp
    return parsed


def count_rows(app: Flask, table: Any) -> int:
    with app.extensions[EXTENSION_KEY].engine.connect() as db:
        return db.execute(select(func.count()).select_from(table)).scalar_one()


def test_create_search_get_patch_delete_as_deerflows_client_sends_them(
    client: FlaskClient,
) -> None:
    before = datetime.now(UTC)
    created = post(client, "/api/threads", {"metadata": {"agent_name": "researcher"}})
    assert created.status_code == 200
    thread = created.get_json()
    assert set(thread) == ANSWER_KEYS
    assert str(uuid.UUID(thread["thread_id"])) == thread["thread_id"]
    assert thread["status"] == "idle" and thread["values"] == {} and thread["interrupts"] == {}
    assert thread["metadata"] == {"agent_name": "researcher"}
    assert before <= when(thread["created_at"]) == when(thread["updated_at"])
    thread_id = thread["thread_id"]

    # The SDK's create with an id, as a new chat page sends it; again: the same record.
    body = {
        "thread_id": "chat-1",
        "metadata": {"user_id": "forged", "k": 1},
        "if_exists": "do_nothing",
    }
    first = post(client, "/api/threads", body).get_json()
    assert first["thread_id"] == "chat-1" and first["metadata"] == {"k": 1}  # server's keys dropped
    again = post(client, "/api/threads", {"thread_id": "chat-1", "metadata": {"k": 2}}).get_json()
    assert again == first

    patched = client.patch(
        "/api/threads/chat-1", json={"metadata": {"agent_name": "writer"}}, headers=ORIGIN
    ).get_json()
    assert patched["metadata"] == {"k": 1, "agent_name": "writer"}  # merged
    assert when(patched["updated_at"]) >= when(first["updated_at"])
    assert patched["created_at"] == first["created_at"]
    titled = client.patch(
        "/api/threads/chat-1", json={"values": {"title": "  Quarterly\nreport "}}, headers=ORIGIN
    ).get_json()
    assert titled["values"] == {"title": "Quarterly report"}
    assert client.get("/api/threads/chat-1").get_json() == titled

    search = {
        "limit": 50,
        "offset": 0,
        "sort_by": "updated_at",
        "sort_order": "desc",
        "select": ["thread_id", "updated_at", "values", "metadata"],
    }
    listed = post(client, "/api/threads/search", search).get_json()
    assert [t["thread_id"] for t in listed] == ["chat-1", thread_id]  # last updated first
    assert listed[0]["values"] == {"title": "Quarterly report"}
    filtered = post(client, "/api/threads/search", {"metadata": {"agent_name": "researcher"}})
    assert [t["thread_id"] for t in filtered.get_json()] == [thread_id]
    assert post(client, "/api/threads/search", {"metadata": {"k": True}}).get_json() == []
    paged = post(client, "/api/threads/search", {"limit": 1, "offset": 1}).get_json()
    assert [t["thread_id"] for t in paged] == [thread_id]
    assert post(client, "/api/threads/search", {"status": "busy"}).get_json() == []
    assert len(post(client, "/api/threads/search").get_json()) == 2  # no body at all

    deleted = client.delete("/api/threads/chat-1", headers=ORIGIN)
    assert deleted.get_json() == {
        "success": True,
        "message": "Deleted local thread data for chat-1",
    }
    missing = client.get("/api/threads/chat-1")
    assert missing.status_code == 404
    assert missing.get_json() == {"detail": "Thread chat-1 not found"}
    for method in ("patch", "delete"):
        again = getattr(client, method)("/api/threads/chat-1", json={}, headers=ORIGIN)
        assert again.get_json() == {"detail": "Thread chat-1 not found"}
    assert [t["thread_id"] for t in post(client, "/api/threads/search").get_json()] == [thread_id]


@pytest.mark.parametrize(
    ("url", "body", "where"),
    [
        ("/api/threads", [], ["body"]),
        ("/api/threads", {"metadata": "x"}, ["body", "metadata"]),
        ("/api/threads", {"thread_id": "../up"}, ["body", "thread_id"]),
        ("/api/threads", {"thread_id": 7}, ["body", "thread_id"]),
        ("/api/threads", {"values": {"title": 5}}, ["body", "values", "title"]),
        ("/api/threads", {"values": {"title": "x" * 257}}, ["body", "values", "title"]),
        ("/api/threads", {"metadata": {"n": 2**70}}, ["body", "metadata"]),  # found by fuzzing
        ("/api/threads", {"metadata": DEEP}, ["body", "metadata"]),
        ("/api/threads/search", {"limit": 0}, ["body", "limit"]),
        ("/api/threads/search", {"limit": 1001}, ["body", "limit"]),
        ("/api/threads/search", {"limit": "5"}, ["body", "limit"]),
        ("/api/threads/search", {"offset": -1}, ["body", "offset"]),
        ("/api/threads/search", {"metadata": {"a.b": 1}}, ["body", "metadata"]),
        ("/api/threads/search", {"metadata": {"a": [1]}}, ["body", "metadata"]),
    ],
)
def test_bad_bodies_are_refused_and_create_nothing(
    app: Flask, client: FlaskClient, base_dir: Path, url: str, body: Any, where: list[str]
) -> None:
    response = post(client, url, body)
    assert response.status_code == 422, response.get_json()
    [error] = response.get_json()["detail"]
    assert error["loc"] == where and error["msg"]
    assert count_rows(app, threads) == 0
    assert not (base_dir / "threads").exists() and not (base_dir / "users").exists()


def test_malformed_and_oversized_bodies(app: Flask, client: FlaskClient) -> None:
    broken = client.post(
        "/api/threads", data=b"{nope", content_type="application/json", headers=ORIGIN
    )
    assert broken.status_code == 400 and broken.get_json()["detail"]
    big = {"metadata": {"blob": "x" * 300_000}}
    assert post(client, "/api/threads", big).status_code == 413
    thread = post(client, "/api/threads", {}).get_json()["thread_id"]
    patch = client.patch(f"/api/threads/{thread}", json={"metadata": []}, headers=ORIGIN)
    assert patch.status_code == 422
    assert count_rows(app, threads) == 1


def test_deleting_a_thread_takes_everything_it_holds(
    app: Flask, client: FlaskClient, base_dir: Path
) -> None:
    data = {"files": [(BytesIO(b"one"), "a.txt")]}
    assert client.post("/api/threads/doomed/uploads", data=data).status_code == 200
    outputs = thread_dir(base_dir, "doomed") / "user-data" / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / "report.md").write_text("# by the agent")
    chat = client.post("/threads/doomed/chat", data={"message": "hi", "mode": "current"})
    assert chat.status_code == 302
    unfinished = client.post(
        "/api/threads/doomed/uploads/tus",
        headers={**TUS, "Upload-Length": "10", "Upload-Metadata": "filename Yi50eHQ="},
    )
    assert unfinished.status_code == 201
    assert client.post("/api/threads/kept/uploads", data={"files": [(BytesIO(b"k"), "k.txt")]})
    for table in (uploads, preview_turns, resumable_uploads, threads):
        assert count_rows(app, table) >= 1, table.name

    assert client.delete("/api/threads/doomed", headers=ORIGIN).status_code == 200
    assert not thread_dir(base_dir, "doomed").exists()
    assert [p.name for p in thread_dir(base_dir, "doomed").parent.iterdir()] == ["kept"]
    assert (count_rows(app, preview_turns), count_rows(app, resumable_uploads)) == (0, 0)
    assert count_rows(app, uploads) == 1  # kept's
    status = client.head(unfinished.headers["Location"], headers=TUS)
    assert status.status_code == 404
    assert client.get("/api/threads/doomed").status_code == 404
    patched = client.patch("/api/threads/doomed", json={"metadata": {}}, headers=ORIGIN)
    assert patched.status_code == 404
    assert not thread_dir(base_dir, "doomed").exists()  # nothing made by the refusals
    # The id is free again: a new thread of that id starts empty, and an upload makes it.
    assert client.get("/api/threads/doomed/uploads/list").get_json() == {"files": [], "count": 0}
    fresh = client.post("/api/threads/doomed/uploads", data={"files": [(BytesIO(b"2"), "b.txt")]})
    assert [f["filename"] for f in fresh.get_json()["files"]] == ["b.txt"]
    assert client.get("/api/threads/doomed").status_code == 200
    assert sorted(p.name for p in uploads_dir(base_dir, "doomed").iterdir()) == ["b.txt"]
    assert "No turns yet" in client.get("/threads/doomed/chat").get_data(as_text=True)


def test_runs_state_and_history_are_not_served(client: FlaskClient) -> None:
    """Out of scope (an agent server's business): they answer 404 as any unknown route."""
    post(client, "/api/threads", {"thread_id": "t1"})
    for method, url in (
        ("post", "/api/threads/t1/runs"),
        ("post", "/api/threads/t1/runs/stream"),
        ("get", "/api/threads/t1/state"),
        ("post", "/api/threads/t1/state"),
        ("post", "/api/threads/t1/history"),
    ):
        response = getattr(client, method)(url, json={}, headers=ORIGIN)
        assert response.status_code in (404, 405), url
        assert response.status_code == 404 or method == "get"


# ---- Issue 25 item 5: writes in a thread the caller does not have ---------------------


def test_writes_in_a_missing_thread_answer_thread_not_found_and_create_nothing(
    app: Flask, client: FlaskClient, base_dir: Path
) -> None:
    for method, url, kwargs in (
        ("delete", "/api/threads/ghost/uploads/x.txt", {}),
        ("post", "/api/threads/ghost/uploads/x.txt/rename", {"json": {"new_name": "y.txt"}}),
        ("post", "/api/threads/ghost/uploads/x.pdf/convert", {}),
        ("get", "/api/threads/ghost/artifacts/mnt/user-data/uploads/x.txt", {}),
        ("patch", "/api/threads/ghost/uploads/tus/abc", {"headers": TUS, "data": b"x"}),
        ("delete", "/api/threads/ghost/uploads/tus/abc", {"headers": TUS}),
        ("get", "/api/threads/ghost", {}),
        ("patch", "/api/threads/ghost", {"json": {"metadata": {"a": 1}}}),
        ("delete", "/api/threads/ghost", {}),
    ):
        response = getattr(client, method)(url, **kwargs)
        assert response.status_code == 404, (method, url)
        assert response.get_json() == {"detail": "Thread ghost not found"}, (method, url)
    assert client.head("/api/threads/ghost/uploads/tus/abc", headers=TUS).status_code == 404
    assert count_rows(app, threads) == 0 and count_rows(app, resumable_uploads) == 0
    assert not list(base_dir.rglob("ghost"))


def test_an_upload_to_a_new_id_makes_the_thread_only_when_it_succeeds(
    make_app: Any, base_dir: Path
) -> None:
    app = make_app({"max_file_size": 8})
    client = app.test_client()
    too_big = client.post("/api/threads/new1/uploads", data={"files": [(BytesIO(b"x" * 9), "a")]})
    assert too_big.status_code == 413
    too_long = client.post(
        "/api/threads/new1/uploads/tus",
        headers={**TUS, "Upload-Length": "9", "Upload-Metadata": "filename YQ=="},
    )
    assert too_long.status_code == 413
    assert client.get("/api/threads/new1").status_code == 404
    assert not list(base_dir.rglob("new1")) and count_rows(app, threads) == 0

    assert client.post("/api/threads/new1/uploads", data={"files": [(BytesIO(b"ok"), "a")]})
    assert client.get("/api/threads/new1").get_json()["thread_id"] == "new1"
    started = client.post(
        "/api/threads/new2/uploads/tus",
        headers={**TUS, "Upload-Length": "4", "Upload-Metadata": "filename Yg=="},
    )
    assert started.status_code == 201  # a resumable upload's creation makes the thread
    found = post(client, "/api/threads/search", {}).get_json()
    assert sorted(t["thread_id"] for t in found) == ["new1", "new2"]


# ---- The file manager: titles, search, rename, delete with a confirmation --------------


def test_new_thread_asks_a_title_and_the_index_shows_and_searches_it(
    app: Flask, client: FlaskClient
) -> None:
    page = client.get("/").get_data(as_text=True)
    assert 'name="title"' in page and 'name="q"' in page
    made = client.post("/threads", data={"title": "Budget 2027"})
    assert made.status_code == 302
    thread_id = made.headers["Location"].rsplit("/", 1)[1]
    client.post("/threads", data={"title": ""})  # a title is optional
    assert client.post("/api/threads/agent-made/uploads", data={"files": [(BytesIO(b"1"), "a")]})
    index = client.get("/").get_data(as_text=True)
    assert "Budget 2027" in index and index.count('class="thread-link"') == 3
    found = client.get("/", query_string={"q": "budget"}).get_data(as_text=True)
    assert "Budget 2027" in found and found.count('class="thread-link"') == 1
    by_id = client.get("/", query_string={"q": "AGENT-m"}).get_data(as_text=True)
    assert "/threads/agent-made" in by_id and by_id.count('class="thread-link"') == 1
    none = client.get("/", query_string={"q": "zzz"}).get_data(as_text=True)
    assert "No thread matches" in none and 'class="thread-link"' not in none
    record = client.get(f"/api/threads/{thread_id}").get_json()
    assert record["values"] == {"title": "Budget 2027"}  # the same records as the API
    too_long = client.post("/threads", data={"title": "x" * 300}, follow_redirects=True)
    assert "256" in too_long.get_data(as_text=True)
    assert len(post(client, "/api/threads/search", {}).get_json()) == 3


def test_the_thread_page_renames_the_thread(client: FlaskClient) -> None:
    post(client, "/api/threads", {"thread_id": "t1"})
    page = client.get("/threads/t1").get_data(as_text=True)
    assert 'action="/threads/t1/title"' in page
    renamed = client.post("/threads/t1/title", data={"title": "Trip plans"}, follow_redirects=True)
    assert "Title saved." in renamed.get_data(as_text=True)
    assert "Trip plans" in client.get("/threads/t1").get_data(as_text=True)
    assert client.get("/api/threads/t1").get_json()["values"] == {"title": "Trip plans"}
    cleared = client.post("/threads/t1/title", data={"title": " "}, follow_redirects=True)
    assert "Title removed." in cleared.get_data(as_text=True)
    assert client.get("/api/threads/t1").get_json()["values"] == {}
    # A thread not made yet has no title form (nothing to rename) and refuses a post.
    assert 'action="/threads/t2/title"' not in client.get("/threads/t2").get_data(as_text=True)
    assert client.post("/threads/t2/title", data={"title": "x"}).status_code == 404


def test_deleting_a_thread_from_the_pages_asks_first(
    app: Flask, client: FlaskClient, base_dir: Path
) -> None:
    assert client.post("/api/threads/t1/uploads", data={"files": [(BytesIO(b"1"), "a.txt")]})
    client.patch("/api/threads/t1", json={"values": {"title": "Old stuff"}}, headers=ORIGIN)
    index = client.get("/").get_data(as_text=True)
    assert 'href="/threads/t1/delete-thread"' in index
    confirm = client.get("/threads/t1/delete-thread")
    assert confirm.status_code == 200
    html = confirm.get_data(as_text=True)
    assert "Delete this thread?" in html and "Old stuff" in html
    assert 'name="confirmed" value="yes"' in html
    unconfirmed = client.post("/threads/t1/delete-thread", data={})
    assert unconfirmed.status_code == 302
    assert unconfirmed.headers["Location"].endswith("/threads/t1/delete-thread")
    assert (uploads_dir(base_dir, "t1") / "a.txt").exists()
    done = client.post("/threads/t1/delete-thread", data={"confirmed": "yes"})
    assert done.status_code == 302 and done.headers["Location"].endswith("/")
    assert "Deleted thread t1" in client.get("/").get_data(as_text=True)
    assert not thread_dir(base_dir, "t1").exists()
    assert count_rows(app, threads) == 0 and count_rows(app, uploads) == 0
    assert client.get("/threads/t1/delete-thread").status_code == 404


def test_csrf_guards_the_new_page_forms(make_app: Any) -> None:
    app = make_app(WTF_CSRF_ENABLED=True)
    client = app.test_client()
    post(client, "/api/threads", {"thread_id": "t1"})
    for url, data in (
        ("/threads", {"title": "x"}),
        ("/threads/t1/title", {"title": "x"}),
        ("/threads/t1/delete-thread", {"confirmed": "yes"}),
    ):
        response = client.post(url, data=data)
        assert response.status_code in (302, 400), url
    assert client.get("/api/threads/t1").get_json()["values"] == {}
    assert [t["thread_id"] for t in post(client, "/api/threads/search", {}).get_json()] == ["t1"]


def test_the_single_user_layout_keeps_its_flat_folders(make_app: Any, base_dir: Path) -> None:
    app = make_app(auth={"enabled": False})
    client = app.test_client()
    thread = post(client, "/api/threads", {"thread_id": "flat-1"}).get_json()
    assert thread["thread_id"] == "flat-1"
    assert (base_dir / "threads" / "flat-1" / "user-data" / "uploads").is_dir()
    assert not (base_dir / "users").exists()
    assert client.delete("/api/threads/flat-1").status_code == 200
    assert not (base_dir / "threads" / "flat-1").exists()
