"""The file manager's trash, versions and undo pages (issue 27), through the test client,
on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.helpers import UploadActions
from tests.helpers import uploads_dir

T = "pages"


@pytest.fixture
def app(make_app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Flask:
    monkeypatch.setenv("DATABASE_URL", database_url)
    return make_app()


def delete_in_page(client: FlaskClient, *names: str) -> Any:
    data = {"filenames": list(names), "confirmed": "yes"}
    return client.post(f"/threads/{T}/delete", data=data)


def test_undo_right_after_a_delete_restores_the_file(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"keep me", "a.txt"), (b"b", "b.txt"))
    assert delete_in_page(client, "a.txt").status_code == 302
    page = client.get(f"/threads/{T}").get_data(as_text=True)
    assert 'id="undo-delete"' in page and "a.txt" in page
    ids = re.findall(r'name="trash_ids" value="([0-9a-f]{32})"', page)
    assert len(ids) == 1
    # shown once: the next visit offers no undo
    assert 'id="undo-delete"' not in client.get(f"/threads/{T}").get_data(as_text=True)
    undone = client.post(f"/threads/{T}/trash/restore", data={"trash_ids": ids})
    assert undone.status_code == 302
    assert (uploads_dir(base_dir, T) / "a.txt").read_bytes() == b"keep me"
    assert sorted(uploads.names(T)) == ["a.txt", "b.txt"]


def test_the_trash_page_restores_and_deletes_for_good(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"one", "a.txt"), (b"two", "b.txt"))
    delete_in_page(client, "a.txt", "b.txt")
    page = client.get(f"/threads/{T}/trash").get_data(as_text=True)
    rows = dict(
        re.findall(
            r'data-filename="([^"]+)">.*?name="trash_ids" value="([0-9a-f]{32})"', page, re.S
        )
    )
    assert set(rows) == {"a.txt", "b.txt"}
    uploads.upload(T, (b"newcomer", "a.txt"))
    refused = client.post(
        f"/threads/{T}/trash/restore",
        data={"trash_ids": rows["a.txt"], "on_conflict": "fail", "back": "trash"},
        follow_redirects=True,
    )
    assert "was not restored" in refused.get_data(as_text=True)
    kept = client.post(
        f"/threads/{T}/trash/restore",
        data={"trash_ids": rows["a.txt"], "on_conflict": "rename", "back": "trash"},
    )
    assert kept.status_code == 302
    assert (uploads_dir(base_dir, T) / "a_1.txt").read_bytes() == b"one"
    client.post(f"/threads/{T}/trash/delete", data={"trash_ids": rows["b.txt"]})
    assert "The trash is empty." in client.get(f"/threads/{T}/trash").get_data(as_text=True)


def test_empty_the_trash(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(T, (b"1", "a.txt"), (b"2", "b.txt"))
    delete_in_page(client, "a.txt", "b.txt")
    emptied = client.post(f"/threads/{T}/trash/empty", follow_redirects=True)
    assert "Deleted 2 files for good." in emptied.get_data(as_text=True)
    assert client.get(f"/api/threads/{T}/trash").get_json()["count"] == 0


def test_the_versions_page_lists_and_restores(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"first", "a.txt"))
    uploads.upload(T, (b"second", "a.txt"), on_conflict="replace")
    preview = client.get(f"/threads/{T}/files/uploads/a.txt").get_data(as_text=True)
    assert f"/threads/{T}/versions/a.txt" in preview
    page = client.get(f"/threads/{T}/versions/a.txt").get_data(as_text=True)
    (version_id,) = re.findall(r'name="version_id" value="([0-9a-f]{32})"', page)
    assert f"/api/threads/{T}/uploads/a.txt/versions/{version_id}?download=true" in page
    restored = client.post(
        f"/threads/{T}/versions/a.txt/restore",
        data={"version_id": version_id},
        follow_redirects=True,
    )
    assert "Restored an earlier version of a.txt" in restored.get_data(as_text=True)
    assert (uploads_dir(base_dir, T) / "a.txt").read_bytes() == b"first"


def test_bad_ids_on_the_pages_say_so(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(T, (b"first", "a.txt"))
    answer = client.post(
        f"/threads/{T}/versions/a.txt/restore", data={"version_id": "nope"}, follow_redirects=True
    )
    assert "That version does not exist any more" in answer.get_data(as_text=True)
    answer = client.post(
        f"/threads/{T}/trash/restore", data={"trash_ids": "0" * 32}, follow_redirects=True
    )
    assert "That file is not in the trash any more" in answer.get_data(as_text=True)
    missing = client.get(f"/threads/{T}/versions/missing.txt", follow_redirects=True)
    assert missing.status_code == 200 and "missing.txt" in missing.get_data(as_text=True)
