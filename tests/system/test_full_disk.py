"""A full disk under the embedded database: a write that cannot land changes nothing.

A real small tmpfs holds the data dir, SQLite database included. It is filled to the last
byte and the database's WAL journal checkpointed away, so the next record write cannot
grow the journal: SQLite says "database or disk is full". A rename then must leave disk and
records as they were (the file under its old name, the conversion companion still linked
to it) and answer 507 (storage full, free space) rather than 503 (database unreachable,
wait); `/readyz` says the storage is full. Once space is freed the same rename works and
the companion follows, and deleting the file still removes its companion.
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.storage.database import DATABASE_FILE
from tests.helpers import UploadActions
from tests.helpers import uploads_dir
from tests.support.documents import make_docx

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


DISK_BYTES = 16 * 1024 * 1024


@pytest.fixture
def base_dir(tmp_path: Path) -> Iterator[Path]:
    """The data dir on a tmpfs of its own (skipped where mounting is not permitted)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        data = mount_point / "data"
        data.mkdir()
        yield data
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of the file system holding `disk`; return the filler file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for size in (1024 * 1024, 4096, 1):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    handle.write(block)
    return filler


def leave_no_journal_room(base_dir: Path) -> Path:
    """Checkpoint the WAL to nothing and take the space it held: the next write must grow
    the journal and cannot."""
    with contextlib.closing(sqlite3.connect(base_dir / DATABASE_FILE)) as db:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, "a reader held the journal"
    filler = fill(base_dir.parent)
    with pytest.raises(OSError) as full:
        (base_dir.parent / "probe").write_bytes(b"x")
    assert full.value.errno == errno.ENOSPC
    return filler


def files(client: Any, thread: str) -> dict[str, dict]:
    response = client.get(f"/api/threads/{thread}/uploads/list")
    assert response.status_code == 200, response.text
    return {f["filename"]: f for f in response.get_json()["files"]}


def test_a_rename_on_a_full_disk_changes_nothing_and_answers_507(
    make_app: Any, base_dir: Path, tmp_path: Path
) -> None:
    app = make_app(uploads={"auto_convert_documents": True, "conversion_wait_seconds": 60})
    client = app.test_client()
    body = make_docx(tmp_path / "report.docx").read_bytes()
    UploadActions(client).upload("T", (body, "report.docx"))
    before = files(client, "T")
    assert before["report.md"]["converted_from"] == "report.docx"
    folder = uploads_dir(base_dir, "T")

    filler = leave_no_journal_room(base_dir)
    response = client.post("/api/threads/T/uploads/report.docx/rename", json={"new_name": "b.docx"})
    assert response.status_code == 507, response.text
    assert "full" in response.get_json()["detail"]
    assert (folder / "report.docx").read_bytes() == body  # the disk step was undone
    assert not (folder / "b.docx").exists()
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.get_json()["storage"] == "full"
    assert ready.get_json()["database"] == "ok"
    assert files(client, "T") == before

    filler.unlink()
    response = client.post("/api/threads/T/uploads/report.docx/rename", json={"new_name": "b.docx"})
    assert response.status_code == 200, response.text
    after = files(client, "T")
    assert sorted(after) == ["b.docx", "report.md"]
    assert after["report.md"]["converted_from"] == "b.docx"
    assert client.get("/readyz").status_code == 200

    deleted = client.delete("/api/threads/T/uploads/b.docx")
    assert deleted.status_code == 200, deleted.text
    assert files(client, "T") == {}
    assert sorted(p.name for p in folder.iterdir()) == []


def test_a_delete_on_a_full_disk_frees_the_space_and_takes_the_companion(
    make_app: Any, base_dir: Path, tmp_path: Path
) -> None:
    """Deleting is how a full disk is freed: the bytes go first, so the records' write
    has room."""
    app = make_app(uploads={"auto_convert_documents": True, "conversion_wait_seconds": 60})
    client = app.test_client()
    body = make_docx(tmp_path / "report.docx").read_bytes()
    UploadActions(client).upload("T", (body, "report.docx"))
    folder = uploads_dir(base_dir, "T")

    filler = leave_no_journal_room(base_dir)
    response = client.delete("/api/threads/T/uploads/report.docx")
    assert response.status_code == 200, response.text
    assert files(client, "T") == {}
    assert sorted(p.name for p in folder.iterdir()) == []
    filler.unlink()
