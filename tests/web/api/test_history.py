"""Versions of replaced files and the trash of deleted ones, through the JSON API (issue 27).

Every test runs on SQLite and on PostgreSQL (`database_url`), in the mode of the run
(accounts on or off).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.storage.records import StoredRecord
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import UploadActions
from tests.helpers import needs_auth
from tests.helpers import thread_dir
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.helpers import user_data_dir
from tests.support.tus import TusActions

T = "hist"
BASE = f"/api/threads/{T}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def app(make_app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Flask:
    monkeypatch.setenv("DATABASE_URL", database_url)
    return make_app()


def fetch(client: FlaskClient, url: str, **kwargs: Any) -> Any:
    """GET a download and close it (its file is held open until then)."""
    response = client.get(url, **kwargs)
    response.get_data()
    response.close()
    return response


def versions(client: FlaskClient, name: str) -> list[dict[str, Any]]:
    response = client.get(f"{BASE}/uploads/{name}/versions")
    assert response.status_code == 200, response.get_json()
    return response.get_json()["versions"]


def trash(client: FlaskClient) -> list[dict[str, Any]]:
    response = client.get(f"{BASE}/trash")
    assert response.status_code == 200, response.get_json()
    return response.get_json()["files"]


def history_files(base_dir: Path) -> set[str]:
    folder = thread_dir(base_dir, T) / "history"
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


# ---- versions ---------------------------------------------------------------------------


def test_a_multipart_replace_keeps_a_version_and_restore_brings_it_back(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    first, second = os.urandom(50_000), b"second version"
    assert uploads.upload(T, (first, "notes.bin")).status_code == 200
    folder = uploads_dir(base_dir, T)
    assert versions(client, "notes.bin") == []
    assert uploads.upload(T, (second, "notes.bin"), on_conflict="replace").status_code == 200
    assert (folder / "notes.bin").read_bytes() == second
    (kept,) = versions(client, "notes.bin")
    assert kept["sha256"] == sha(first) and kept["size"] == len(first)
    assert set(kept) == {"version_id", "size", "sha256", "created_at", "created_by"}

    download = fetch(client, f"{BASE}/uploads/notes.bin/versions/{kept['version_id']}")
    assert download.status_code == 200 and download.data == first
    assert download.headers["X-Content-Type-Options"] == "nosniff"
    assert download.headers["Content-Disposition"] == "attachment; filename*=UTF-8''notes.bin"

    restored = client.post(f"{BASE}/uploads/notes.bin/versions/{kept['version_id']}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert restored.get_json()["file"]["filename"] == "notes.bin"
    assert (folder / "notes.bin").read_bytes() == first
    assert (folder / "notes.bin").stat().st_nlink == 1
    listed = {f["filename"]: f for f in uploads.list(T)["files"]}
    assert listed["notes.bin"]["size"] == len(first)
    # The restore is undoable: the bytes it replaced are the newest version now.
    (undo,) = versions(client, "notes.bin")
    assert undo["sha256"] == sha(second)
    client.post(f"{BASE}/uploads/notes.bin/versions/{undo['version_id']}/restore")
    assert (folder / "notes.bin").read_bytes() == second


def test_the_same_bytes_again_keep_no_version(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(T, (b"same", "a.txt"))
    uploads.upload(T, (b"same", "a.txt"), on_conflict="replace")
    assert versions(client, "a.txt") == []


def test_a_tus_upload_finished_over_a_name_keeps_a_version(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"before tus", "big.bin"))
    body = os.urandom(200_000)
    tus = TusActions(client)
    url = tus.start(T, len(body), "big.bin")
    assert tus.patch(url, 0, body).status_code == 204
    assert (uploads_dir(base_dir, T) / "big.bin").read_bytes() == body
    (kept,) = versions(client, "big.bin")
    assert kept["sha256"] == sha(b"before tus")
    client.post(f"{BASE}/uploads/big.bin/versions/{kept['version_id']}/restore")
    assert (uploads_dir(base_dir, T) / "big.bin").read_bytes() == b"before tus"
    assert versions(client, "big.bin")[0]["sha256"] == sha(body)


def test_an_artifact_edit_keeps_a_version_restored_by_path(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"x", "seed.txt"))  # makes the thread
    outputs = user_data_dir(base_dir, T) / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / "report.md").write_bytes(b"# draft\n")
    edited = client.put(
        f"{BASE}/artifacts/mnt/user-data/outputs/report.md",
        json={"content": "# final\n", "expected_sha256": sha(b"# draft\n")},
    )
    assert edited.status_code == 200, edited.get_json()
    path = "/mnt/user-data/outputs/report.md"
    listing = client.get(f"{BASE}/versions", query_string={"path": path})
    assert listing.status_code == 200, listing.get_json()
    (kept,) = listing.get_json()["versions"]
    assert kept["sha256"] == sha(b"# draft\n")
    download = fetch(client, f"{BASE}/versions/{kept['version_id']}", query_string={"path": path})
    assert download.data == b"# draft\n"
    assert download.headers["Content-Type"].startswith("text/markdown")
    restored = client.post(
        f"{BASE}/versions/{kept['version_id']}/restore", query_string={"path": path}
    )
    assert restored.status_code == 200, restored.get_json()
    assert (outputs / "report.md").read_bytes() == b"# draft\n"
    (undo,) = client.get(f"{BASE}/versions", query_string={"path": path}).get_json()["versions"]
    assert undo["sha256"] == sha(b"# final\n")


def test_restore_drops_the_converted_companion(
    app: Flask, client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"%PDF-1.4 one", "report.pdf"))
    uploads.upload(T, (b"%PDF-1.4 two", "report.pdf"), on_conflict="replace")
    folder = uploads_dir(base_dir, T)
    (folder / "report.md").write_text("converted text")
    service = app.extensions[EXTENSION_KEY].uploads
    ref = thread_ref(T)
    scope = service.folders(ref).scope
    with service.records.locked(scope) as txn:
        info = (folder / "report.md").lstat()
        record = UploadRecord(
            "report.md",
            info.st_size,
            sha(b"converted text"),
            "text/markdown",
            uploaded_at=0.0,
            modified=info.st_mtime_ns / 1e9,
            source=RecordSource.CONVERSION,
            converted_from="report.pdf",
            conversion_state=ConversionState.DONE,
        )
        txn.put(StoredRecord(record, info.st_mtime_ns, info.st_ino, info.st_ctime_ns))
    (kept,) = versions(client, "report.pdf")
    client.post(f"{BASE}/uploads/report.pdf/versions/{kept['version_id']}/restore")
    assert not (folder / "report.md").exists()
    assert uploads.names(T) == ["report.pdf"]


def test_keep_last_bounds_the_versions(make_app: Any, database_url: str, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    app = make_app(versions={"keep_last": 2})
    client = app.test_client()
    actions = UploadActions(client)
    for n in range(6):
        actions.upload(T, (f"v{n}".encode(), "a.txt"), on_conflict="replace")
    kept = versions(client, "a.txt")
    # the two newest, and thinning keeps one per hour of the rest: all made this hour
    assert [v["sha256"] for v in kept] == [sha(b"v4"), sha(b"v3"), sha(b"v2")][: len(kept)]
    assert 2 <= len(kept) <= 3
    assert len(history_files(app.extensions[EXTENSION_KEY].settings.base_dir)) == len(kept)


def test_versions_are_never_listed_served_or_zipped(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"old secret", "a.txt"))
    uploads.upload(T, (b"new", "a.txt"), on_conflict="replace")
    (kept,) = versions(client, "a.txt")
    assert uploads.names(T) == ["a.txt"]
    assert history_files(base_dir) == {f"versions/{kept['version_id']}"}
    for path in (
        f"mnt/user-data/../history/versions/{kept['version_id']}",
        f"mnt/user-data/uploads/../../history/versions/{kept['version_id']}",
    ):
        response = fetch(client, f"{BASE}/artifacts/{path}")
        assert response.status_code in (400, 403, 404)
        assert b"old secret" not in response.data
    zipped = fetch(client, f"{BASE}/zip", query_string={"area": "uploads"})
    assert b"old secret" not in zipped.data


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/uploads/missing.txt/versions", 404),
        ("/uploads/a.txt/versions/" + "0" * 32, 404),
        ("/uploads/a.txt/versions/not-an-id", 404),
        ("/uploads/a.txt/versions/..", 404),
        ("/versions?path=/etc/passwd", 400),
        ("/versions?path=/mnt/user-data/workspace/a.txt", 400),
        ("/versions?path=/mnt/user-data/uploads/../a.txt", 400),
        ("/versions", 422),
    ],
)
def test_bad_names_and_ids_are_refused_with_a_detail(
    client: FlaskClient, uploads: UploadActions, path: str, status: int
) -> None:
    uploads.upload(T, (b"one", "a.txt"))
    uploads.upload(T, (b"two", "a.txt"), on_conflict="replace")
    response = client.get(BASE + path)
    assert response.status_code == status
    assert response.get_json()["detail"]


def test_a_version_id_of_another_file_or_thread_finds_nothing(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"one", "a.txt"))
    uploads.upload(T, (b"two", "a.txt"), on_conflict="replace")
    uploads.upload(T, (b"b", "b.txt"))
    uploads.upload("other", (b"c", "a.txt"))
    (kept,) = versions(client, "a.txt")
    vid = kept["version_id"]
    for url in (
        f"{BASE}/uploads/b.txt/versions/{vid}",
        f"/api/threads/other/uploads/a.txt/versions/{vid}",
    ):
        assert fetch(client, url).status_code == 404
        refused = client.post(url + "/restore")
        assert refused.status_code == 404 and refused.get_json()["detail"]
    assert (uploads_dir(base_dir, T) / "a.txt").read_bytes() == b"two"
    assert (uploads_dir(base_dir, "other") / "a.txt").read_bytes() == b"c"
    assert client.get("/api/threads/nothread/uploads/a.txt/versions").status_code == 404


@needs_auth
def test_another_users_versions_and_trash_are_out_of_reach(
    app: Flask, client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"one", "a.txt"))
    uploads.upload(T, (b"two", "a.txt"), on_conflict="replace")
    (kept,) = versions(client, "a.txt")
    uploads.upload(T, (b"gone", "gone.txt"))
    uploads.delete(T, "gone.txt")
    (entry,) = trash(client)
    accounts = app.extensions[EXTENSION_KEY].accounts
    other = accounts.create_user("other@example.com", "another long passphrase 7")
    stranger = app.test_client(user_id=other.id)
    for method, url in (
        ("get", f"{BASE}/uploads/a.txt/versions"),
        ("get", f"{BASE}/uploads/a.txt/versions/{kept['version_id']}"),
        ("post", f"{BASE}/uploads/a.txt/versions/{kept['version_id']}/restore"),
        ("get", f"{BASE}/trash"),
        ("post", f"{BASE}/trash/{entry['trash_id']}/restore"),
        ("delete", f"{BASE}/trash/{entry['trash_id']}"),
        ("delete", f"{BASE}/trash"),
    ):
        response = getattr(stranger, method)(url)
        assert response.status_code in (403, 404), (url, response.status_code)
        assert response.get_json()["detail"]
    assert (uploads_dir(base_dir, T) / "a.txt").read_bytes() == b"two"
    assert len(versions(client, "a.txt")) == 1 and len(trash(client)) == 1


# ---- the trash ---------------------------------------------------------------------------


def test_delete_moves_to_the_trash_and_restore_puts_it_back(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    body = os.urandom(10_000)
    uploads.upload(T, (body, "report.bin"))
    deleted = uploads.delete(T, "report.bin")
    assert deleted.status_code == 200
    assert deleted.get_json() == {"success": True, "message": "Deleted report.bin"}
    assert uploads.names(T) == []
    assert not (uploads_dir(base_dir, T) / "report.bin").exists()
    (entry,) = trash(client)
    assert entry["filename"] == "report.bin" and entry["sha256"] == sha(body)
    assert entry["expires_at"] == pytest.approx(entry["deleted_at"] + 30 * 86400)
    assert client.get(f"{BASE}/artifacts/mnt/user-data/uploads/report.bin").status_code == 404
    restored = client.post(f"{BASE}/trash/{entry['trash_id']}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert restored.get_json()["file"]["filename"] == "report.bin"
    assert (uploads_dir(base_dir, T) / "report.bin").read_bytes() == body
    assert uploads.names(T) == ["report.bin"]
    assert trash(client) == []
    assert history_files(base_dir) == set()


def test_the_companion_goes_to_the_trash_and_comes_back(
    app: Flask, client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"%PDF-1.4 x", "report.pdf"))
    folder = uploads_dir(base_dir, T)
    (folder / "report.md").write_text("converted")
    service = app.extensions[EXTENSION_KEY].uploads
    with service.records.locked(service.folders(thread_ref(T)).scope) as txn:
        info = (folder / "report.md").lstat()
        record = UploadRecord(
            "report.md",
            info.st_size,
            sha(b"converted"),
            "text/markdown",
            uploaded_at=0.0,
            modified=info.st_mtime_ns / 1e9,
            source=RecordSource.CONVERSION,
            converted_from="report.pdf",
        )
        txn.put(StoredRecord(record, info.st_mtime_ns, info.st_ino, info.st_ctime_ns))
    uploads.delete(T, "report.pdf")
    assert uploads.names(T) == []
    (entry,) = trash(client)
    assert entry["companions"] == ["report.md"]
    client.post(f"{BASE}/trash/{entry['trash_id']}/restore")
    listed = {f["filename"]: f for f in uploads.list(T)["files"]}
    assert set(listed) == {"report.pdf", "report.md"}
    assert (folder / "report.md").read_text() == "converted"


@pytest.mark.parametrize("how", ["fail", "rename", "replace"])
def test_restore_when_the_name_is_taken_now(
    client: FlaskClient, uploads: UploadActions, base_dir: Path, how: str
) -> None:
    uploads.upload(T, (b"deleted one", "a.txt"))
    uploads.delete(T, "a.txt")
    uploads.upload(T, (b"newcomer", "a.txt"))
    (entry,) = trash(client)
    folder = uploads_dir(base_dir, T)
    body = None if how == "fail" else {"on_conflict": how}
    response = client.post(f"{BASE}/trash/{entry['trash_id']}/restore", json=body)
    if how == "fail":
        assert response.status_code == 409
        assert response.get_json()["detail"] == "A file named a.txt already exists"
        assert (folder / "a.txt").read_bytes() == b"newcomer"
        assert len(trash(client)) == 1
        assert uploads.names(T) == ["a.txt"]
        return
    assert response.status_code == 200, response.get_json()
    if how == "rename":
        assert response.get_json()["file"]["filename"] == "a_1.txt"
        assert (folder / "a_1.txt").read_bytes() == b"deleted one"
        assert (folder / "a.txt").read_bytes() == b"newcomer"
    else:
        assert (folder / "a.txt").read_bytes() == b"deleted one"
        (kept,) = versions(client, "a.txt")
        assert kept["sha256"] == sha(b"newcomer")
    assert trash(client) == []


def test_bad_trash_requests_are_refused_with_a_detail(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload(T, (b"x", "a.txt"))
    uploads.delete(T, "a.txt")
    (entry,) = trash(client)
    for response, status in (
        (client.post(f"{BASE}/trash/{'0' * 32}/restore"), 404),
        (client.post(f"{BASE}/trash/nonsense/restore"), 404),
        (client.delete(f"{BASE}/trash/{'f' * 32}"), 404),
        (client.post(f"{BASE}/trash/{entry['trash_id']}/restore", json={"on_conflict": "x"}), 400),
        (client.post(f"{BASE}/trash/{entry['trash_id']}/restore", json=["rename"]), 422),
    ):
        assert response.status_code == status
        assert response.get_json()["detail"]
    assert len(trash(client)) == 1


def test_delete_for_good_one_entry_and_empty(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        uploads.upload(T, (name.encode(), name))
        uploads.delete(T, name)
    entries = trash(client)
    assert [e["filename"] for e in entries] == ["c.txt", "b.txt", "a.txt"]
    gone = client.delete(f"{BASE}/trash/{entries[0]['trash_id']}")
    assert gone.status_code == 200
    assert [e["filename"] for e in trash(client)] == ["b.txt", "a.txt"]
    emptied = client.delete(f"{BASE}/trash")
    assert emptied.status_code == 200 and emptied.get_json()["count"] == 2
    assert trash(client) == []
    assert history_files(base_dir) == set()


def test_permanent_delete_and_a_disabled_trash_delete_for_good(
    make_app: Any, database_url: str, monkeypatch, base_dir: Path
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    client = make_app().test_client()
    actions = UploadActions(client)
    actions.upload(T, (b"one", "a.txt"))
    actions.upload(T, (b"two", "a.txt"), on_conflict="replace")
    response = client.delete(f"{BASE}/uploads/a.txt", query_string={"permanent": "true"})
    assert response.get_json() == {"success": True, "message": "Deleted a.txt"}
    assert trash(client) == [] and history_files(base_dir) == set()
    bad = client.delete(f"{BASE}/uploads/a.txt", query_string={"permanent": "maybe"})
    assert bad.status_code == 422

    off = make_app(trash={"enabled": False}).test_client()
    UploadActions(off).upload(T, (b"x", "b.txt"))
    assert UploadActions(off).delete(T, "b.txt").status_code == 200
    assert trash(off) == []
    assert not (uploads_dir(base_dir, T) / "b.txt").exists()


def test_expired_entries_are_purged(
    app: Flask, client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"old", "old.txt"))
    uploads.delete(T, "old.txt")
    uploads.upload(T, (b"new", "new.txt"))
    uploads.delete(T, "new.txt")
    history = app.extensions[EXTENSION_KEY].history
    service_trash = history.trash_bin
    entries = trash(client)
    old = next(e for e in entries if e["filename"] == "old.txt")
    # 31 days on, for the old entry only: the sweeper's function purges it everywhere.
    assert service_trash.purge_expired_trash(old["deleted_at"] + 30 * 86400 + 1) >= 1
    assert [e["filename"] for e in trash(client)] == [] or all(
        e["filename"] != "old.txt" for e in trash(client)
    )
    assert not any(p.startswith(f"trash/{old['trash_id']}") for p in history_files(base_dir))


def test_bulk_delete_trashes_too(client: FlaskClient, uploads: UploadActions) -> None:
    from deerflow_web.services.uploads.bulk_delete import delete_uploads

    uploads.upload(T, (b"1", "a.txt"), (b"2", "b.txt"))
    service = client.application.extensions[EXTENSION_KEY].uploads
    result = delete_uploads(service, thread_ref(T), ["a.txt", "b.txt"])
    assert result.deleted == ["a.txt", "b.txt"]
    assert sorted(e["filename"] for e in trash(client)) == ["a.txt", "b.txt"]


def test_deleting_the_thread_takes_versions_and_trash_with_it(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"1", "a.txt"))
    uploads.upload(T, (b"2", "a.txt"), on_conflict="replace")
    uploads.upload(T, (b"3", "b.txt"))
    uploads.delete(T, "b.txt")
    assert client.delete(BASE).status_code == 200
    assert not thread_dir(base_dir, T).exists()
    uploads.upload(T, (b"fresh", "a.txt"))
    assert versions(client, "a.txt") == [] and trash(client) == []


def test_the_history_api_answers_api_clients_with_csrf_on(
    make_app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API guards against cross-site requests by origin, as all of /api does; Flask-WTF's
    form token is for the pages (a nested blueprint must be exempted on its own)."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    client = make_app(WTF_CSRF_ENABLED=True).test_client()
    actions = UploadActions(client)
    assert actions.upload(T, (b"one", "a.txt")).status_code == 200
    assert actions.upload(T, (b"two", "a.txt"), on_conflict="replace").status_code == 200
    (kept,) = versions(client, "a.txt")
    restored = client.post(f"{BASE}/uploads/a.txt/versions/{kept['version_id']}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert actions.delete(T, "a.txt").status_code == 200
    (entry,) = trash(client)
    assert client.post(f"{BASE}/trash/{entry['trash_id']}/restore").status_code == 200
    assert client.delete(f"{BASE}/trash").status_code == 200


def test_share_links_serve_neither_versions_nor_the_trash(
    app: Flask, client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload(T, (b"old secret", "a.txt"))
    response = client.post(f"/threads/{T}/share", data={"filenames": ["a.txt"], "hours": "24"})
    link = re.search(r'id="share-url"[^>]*value="([^"]+)"', response.get_data(as_text=True))
    assert link is not None
    path = link.group(1).removeprefix("http://localhost")
    uploads.upload(T, (b"CURRENT-BYTES", "a.txt"), on_conflict="replace")
    visitor = app.test_client(user_id=None)
    assert fetch(visitor, f"{path}/0").data == b"CURRENT-BYTES"  # never the kept version
    (kept,) = versions(client, "a.txt")
    sneaky = client.post(
        f"/threads/{T}/share",
        data={"filenames": [f"../../history/versions/{kept['version_id']}"], "hours": "24"},
    )
    if sneaky.status_code == 200:
        made = re.search(r'id="share-url"[^>]*value="([^"]+)"', sneaky.get_data(as_text=True))
        if made is not None:
            opened = fetch(visitor, made.group(1).removeprefix("http://localhost") + "/0")
            assert opened.status_code in (400, 403, 404) and b"old secret" not in opened.data
    uploads.delete(T, "a.txt")
    gone = fetch(visitor, f"{path}/0")
    assert gone.status_code == 404 and b"CURRENT-BYTES" not in gone.data  # in the trash now


@pytest.mark.local_disk
def test_a_restored_version_is_scanned_again(
    make_app: Any, clamd: Any, base_dir: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With scanning on, a version becomes current only with today's verdict: clean bytes
    come back `clean`; bytes today's signatures call infected stay a version (422)."""
    from tests.support.clamd import EICAR

    monkeypatch.setenv("DATABASE_URL", database_url)
    app = make_app(scanning={"clamd": clamd.address, "timeout_seconds": 3})
    client = app.test_client()
    actions = UploadActions(client)
    actions.upload(T, (b"first clean text", "a.txt"))
    actions.upload(T, (b"second clean text", "a.txt"), on_conflict="replace")
    (kept,) = versions(client, "a.txt")
    restored = client.post(f"{BASE}/uploads/a.txt/versions/{kept['version_id']}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert restored.get_json()["file"]["scan_state"] == "clean"
    # The version of the second text is on disk now; pretend signatures learnt since
    # call those bytes infected (the file is rewritten in place under the same id).
    (undo,) = versions(client, "a.txt")
    version_file = thread_dir(base_dir, T) / "history" / "versions" / undo["version_id"]
    version_file.write_bytes(EICAR)
    refused = client.post(f"{BASE}/uploads/a.txt/versions/{undo['version_id']}/restore")
    assert refused.status_code == 422, refused.get_json()
    assert refused.get_json()["detail"]
    assert (uploads_dir(base_dir, T) / "a.txt").read_bytes() == b"first clean text"
    assert version_file.exists() and len(versions(client, "a.txt")) == 1


def test_a_file_restored_from_the_trash_is_scanned_unless_clean_by_todays_signatures(
    make_app: Any,
    make_clamd: Any,
    base_dir: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore is an upload (issue 28): files trashed before scanning was turned on come
    back only with a verdict of today's signatures. Clean bytes come back `clean`; bytes
    they call infected stay in the trash (422); clamd down refuses (503), leaving the entry."""
    from tests.support.clamd import EICAR

    monkeypatch.setenv("DATABASE_URL", database_url)
    unscanned = UploadActions(make_app().test_client())
    unscanned.upload(T, (b"plain words", "clean.txt"), (EICAR, "eicar.txt"))
    unscanned.delete(T, "clean.txt")
    unscanned.delete(T, "eicar.txt")

    clamd = make_clamd()
    app = make_app(scanning={"clamd": clamd.address, "timeout_seconds": 3})
    client = app.test_client()
    entries = {entry["filename"]: entry["trash_id"] for entry in trash(client)}
    refused = client.post(f"{BASE}/trash/{entries['eicar.txt']}/restore")
    assert refused.status_code == 422, refused.get_json()
    assert "eicar.txt" in refused.get_json()["detail"]
    assert not (uploads_dir(base_dir, T) / "eicar.txt").exists()
    clamd.stop()
    down = client.post(f"{BASE}/trash/{entries['clean.txt']}/restore")
    assert down.status_code == 503 and down.headers["Retry-After"], down.get_json()
    assert {entry["filename"] for entry in trash(client)} == {"clean.txt", "eicar.txt"}
    clamd.start()
    restored = client.post(f"{BASE}/trash/{entries['clean.txt']}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert restored.get_json()["file"]["scan_state"] == "clean"
    assert (uploads_dir(base_dir, T) / "clean.txt").read_bytes() == b"plain words"
    assert [entry["filename"] for entry in trash(client)] == ["eicar.txt"]
    # Clean by today's signatures: deleted and restored again without a new scan.
    UploadActions(client).delete(T, "clean.txt")
    (again,) = [e["trash_id"] for e in trash(client) if e["filename"] == "clean.txt"]
    clamd.stop()
    back = client.post(f"{BASE}/trash/{again}/restore")
    assert back.status_code == 200, back.get_json()
    assert back.get_json()["file"]["scan_state"] == "clean"
