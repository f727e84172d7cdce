"""Changes behind the app's back: what is served from a record is checked against the file
at the moment of use (size, mtime, inode and ctime of the opened file), so an edit in place
(same inode) is never answered with the old bytes' ETag, text or companion."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.agent import UploadTools
from deerflow_web.services.uploads import service as uploads_module
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import uploads_dir
from tests.support.agent_helpers import make_runtime
from tests.support.documents import make_docx

URL = "/api/threads/T/artifacts/mnt/user-data/uploads"
PATIENT = {"conversion_wait_seconds": 120}  # a real conversion on a busy machine


@pytest.fixture(autouse=True)
def _settled_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Folders count as settled at once, as one untouched for a few seconds does: a list
    then trusts the records until the folder changes or the periodic scan comes."""
    monkeypatch.setattr(uploads_module, "SETTLED_SECONDS", 0.0)


def edit_in_place(path: Path, data: bytes) -> None:
    """Overwrite the file's bytes through the same inode, as an editor saving in place."""
    inode = path.stat().st_ino
    with path.open("r+b") as handle:
        handle.write(data)
        handle.truncate()
    assert path.stat().st_ino == inode


def get(client: Any, name: str, **headers: str) -> tuple[Any, bytes]:
    response = client.get(f"{URL}/{name}", headers=headers)
    body = response.get_data()
    response.close()
    return response, body


def listed(uploads: UploadActions, name: str) -> dict[str, Any]:
    return {f["filename"]: f for f in uploads.list("T")["files"]}[name]


def read_file(app: Any, name: str) -> str:
    services = app.extensions["deerflow_web"]
    tool = UploadTools(
        paths=services.uploads.paths,
        upload_service=services.uploads,
        conversion_jobs=services.conversions,
        read_wait_seconds=120,
        require_user=False,
    ).by_name()["read_file"]
    runtime = make_runtime({"thread_id": "T", "user_id": USER_ID})
    return tool.invoke({"path": f"/mnt/user-data/uploads/{name}", "runtime": runtime})


def test_an_in_place_edit_of_a_text_file_is_served_with_a_new_etag(
    app: Any, client: Any, uploads: UploadActions, base_dir: Path
) -> None:
    assert uploads.upload("T", (b"first version\n", "notes.txt")).status_code == 200
    listed(uploads, "notes.txt")  # the folder is scanned and trusted from here on
    first, _ = get(client, "notes.txt")
    old_etag = first.headers["ETag"]
    new = b"the second, longer version\n"
    edit_in_place(uploads_dir(base_dir, "T") / "notes.txt", new)

    response, body = get(client, "notes.txt", **{"If-None-Match": old_etag})
    assert response.status_code == 200 and body == new
    assert response.headers["ETag"] != old_etag
    assert response.headers["Content-Length"] == str(len(new))
    again, _ = get(client, "notes.txt", **{"If-None-Match": response.headers["ETag"]})
    assert again.status_code == 304  # the new bytes' ETag holds while they are unchanged
    assert "the second, longer version" in read_file(app, "notes.txt")
    entry = listed(uploads, "notes.txt")
    assert entry["size"] == len(new)
    assert entry["sha256"] == hashlib.sha256(new).hexdigest()


def test_a_same_size_edit_with_its_mtime_restored_is_noticed(
    client: Any, uploads: UploadActions, base_dir: Path
) -> None:
    """What `cp -p` does: same size, the old mtime to the nanosecond; only the ctime moves."""
    assert uploads.upload("T", (b"AAAA-original", "same.txt")).status_code == 200
    listed(uploads, "same.txt")
    first, _ = get(client, "same.txt")
    path = uploads_dir(base_dir, "T") / "same.txt"
    before = path.stat()
    edit_in_place(path, b"BBBB-replaced")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    response, body = get(client, "same.txt", **{"If-None-Match": first.headers["ETag"]})
    assert response.status_code == 200, "304 for different bytes"
    assert body == b"BBBB-replaced"
    assert listed(uploads, "same.txt")["sha256"] == hashlib.sha256(b"BBBB-replaced").hexdigest()


def test_an_in_place_edit_of_a_docx_is_read_as_the_new_document(
    make_app: Any, base_dir: Path, tmp_path: Path
) -> None:
    app = make_app(uploads=PATIENT)
    client = app.test_client()
    uploads = UploadActions(client)
    old = make_docx(tmp_path / "old.docx", title="Budget Draft", paragraphs=("Old plan.",))
    new = make_docx(tmp_path / "new.docx", title="Final Budget", paragraphs=("New plan.",))
    assert uploads.upload("T", (old.read_bytes(), "plan.docx")).status_code == 200
    assert "Budget Draft" in read_file(app, "plan.docx")  # converted once, companion recorded
    first, _ = get(client, "plan.docx")
    edit_in_place(uploads_dir(base_dir, "T") / "plan.docx", new.read_bytes())

    text = read_file(app, "plan.docx")
    assert "Final Budget" in text and "Budget Draft" not in text
    response, body = get(client, "plan.docx", **{"If-None-Match": first.headers["ETag"]})
    assert response.status_code == 200 and body == new.read_bytes()
    entry = listed(uploads, "plan.docx")
    assert entry["sha256"] == hashlib.sha256(new.read_bytes()).hexdigest()
    assert entry["markdown_file"] == "plan.md"
    companion, markdown = get(client, "plan.md")
    assert companion.status_code == 200 and b"Final Budget" in markdown
