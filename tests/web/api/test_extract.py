"""POST /api/threads/{id}/uploads/{filename}/extract and `uploads.extract_archives`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient

from tests.helpers import UploadActions
from tests.helpers import thread_dir
from tests.helpers import user_data_dir
from tests.support.archives import ZEROS
from tests.support.archives import make_overlapping_zip
from tests.support.archives import make_tar
from tests.support.archives import make_zip

WORKSPACE = "/mnt/user-data/workspace"


def _tree(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if not p.name.startswith("deerflow.sqlite3")
    }


def _extract(client: FlaskClient, name: str, **body: Any) -> Any:
    return client.post(f"/api/threads/T/uploads/{name}/extract", json=body or None)


def test_extract_writes_the_members_and_lists_refusals(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    data = make_zip({"q3/notes.txt": b"notes", "../evil.txt": b"x", "/abs": b"x"})
    assert uploads.upload("T", (data, "reports.zip")).status_code == 200
    response = _extract(client, "reports.zip")
    assert response.status_code == 200
    assert response.get_json() == {
        "archive": "reports.zip",
        "folder": f"{WORKSPACE}/reports",
        "files": [
            {"name": "q3/notes.txt", "virtual_path": f"{WORKSPACE}/reports/q3/notes.txt", "size": 5}
        ],
        "refused": [
            {"name": "../evil.txt", "reason": "member '../evil.txt' leaves the archive"},
            {"name": "/abs", "reason": "member '/abs' has an absolute name"},
        ],
        "message": "Extracted 1 file(s) from reports.zip; refused 2 member(s)",
    }
    written = user_data_dir(base_dir, "T") / "workspace/reports/q3/notes.txt"
    assert written.read_bytes() == b"notes"
    artifact = client.get(f"/api/threads/T/artifacts{WORKSPACE}/reports/q3/notes.txt")
    assert artifact.data == b"notes"
    artifact.close()


def test_on_conflict_reject_is_409_and_rename_numbers(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("T", (make_zip({"a.txt": b"a"}), "r.zip"))
    assert _extract(client, "r.zip").get_json()["folder"] == f"{WORKSPACE}/r"
    assert _extract(client, "r.zip").get_json()["folder"] == f"{WORKSPACE}/r_1"
    refused = _extract(client, "r.zip", on_conflict="reject")
    assert refused.status_code == 409
    assert "detail" in refused.get_json()
    bad = _extract(client, "r.zip", on_conflict="sideways")
    assert bad.status_code == 400
    assert bad.get_json()["detail"] == "on_conflict must be one of: replace, rename, reject"


def test_a_refused_archive_is_422_with_its_rule_and_writes_nothing(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload("T", (make_overlapping_zip(), "overlap.zip"))
    uploads.upload("T", (make_tar([("zeros", b"\0" * ZEROS)], gzip=True), "bomb.tar.gz"))
    before = _tree(base_dir)
    overlap = _extract(client, "overlap.zip")
    assert overlap.status_code == 422
    assert overlap.get_json() == {
        "detail": "overlap.zip is refused: members 'a.txt' and 'b.txt' overlap "
        "(overlapping entries, a zip bomb)"
    }
    bomb = _extract(client, "bomb.tar.gz")
    assert bomb.status_code == 422
    assert bomb.get_json() == {"detail": "bomb.tar.gz is refused: compression ratio over 200"}
    assert _tree(base_dir) == before


def test_a_non_archive_is_400_and_a_missing_upload_404(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("T", (b"plain", "notes.txt"))
    response = _extract(client, "notes.txt")
    assert response.status_code == 400
    assert response.get_json() == {
        "detail": "notes.txt is not an archive: only .zip, .tar, .tar.gz and .tgz are read"
    }
    missing = _extract(client, "missing.zip")
    assert missing.status_code == 404
    assert "detail" in missing.get_json()
    assert client.post("/api/threads/bad.id/uploads/a.zip/extract").status_code == 422


def test_extract_archives_setting_extracts_on_upload(make_app: Any, base_dir: Path) -> None:
    client = make_app({"extract_archives": True}).test_client()
    good = make_zip({"a/b.txt": b"b"})
    bomb = make_overlapping_zip()
    response = client.post(
        "/api/threads/T/uploads",
        data={"files": [(io.BytesIO(good), "good.zip"), (io.BytesIO(bomb), "bomb.zip")]},
    )
    assert response.status_code == 200
    body = response.get_json()
    assert [f["filename"] for f in body["files"]] == ["good.zip", "bomb.zip"]
    assert body["extracted"][0]["folder"] == f"{WORKSPACE}/good"
    assert body["extracted"][0]["files"][0]["name"] == "a/b.txt"
    assert body["extracted"][1] == {
        "archive": "bomb.zip",
        "folder": None,
        "files": [],
        "refused": [],
        "error": "bomb.zip is refused: members 'a.txt' and 'b.txt' overlap "
        "(overlapping entries, a zip bomb)",
    }
    assert (thread_dir(base_dir, "T") / "user-data/workspace/good/a/b.txt").read_bytes() == b"b"


def test_without_the_setting_an_upload_extracts_nothing(
    uploads: UploadActions, base_dir: Path
) -> None:
    body = uploads.upload("T", (make_zip({"a.txt": b"a"}), "r.zip")).get_json()
    assert "extracted" not in body
    assert not (user_data_dir(base_dir, "T") / "workspace").exists()
