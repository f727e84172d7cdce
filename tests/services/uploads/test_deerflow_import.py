"""`flask --app app import-deerflow DIR` (issue 25 item 10) on generated DeerFlow trees.

Both of DeerFlow's layouts, with everything an old data directory may hold: documents and
their Markdown, a user's own `.md`, agent outputs in subfolders, links, a FIFO, a staging
file, bad ids. DIR must not change (unless `--move`), and a second run must change nothing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from flask import Flask

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import AUTH_ON
from tests.helpers import TEST_EMAIL
from tests.helpers import needs_auth
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.helpers import user_data_dir

PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n%%EOF\n"
PNG = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + b"\0" * 16


def write(path: Path, data: bytes, mtime: int = 1_700_000_000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def deerflow_tree(root: Path, secret: Path) -> Path:
    """A DeerFlow data dir in both layouts, with every awkward thing on disk."""
    flat = root / "threads" / "t1" / "user-data"
    write(flat / "uploads" / "report.pdf", PDF, 1_700_000_000)
    write(flat / "uploads" / "report.md", b"# Quarterly report\n", 1_700_000_005)  # converted
    write(flat / "uploads" / "notes.docx", b"PK\x03\x04 docx", 1_700_000_100)
    write(flat / "uploads" / "notes.md", b"# my own notes\n", 1_700_000_050)  # older: the user's
    write(flat / "uploads" / "data.csv", b"a,b\n1,2\n")
    write(flat / "outputs" / "answer.md", b"# Answer\n")
    write(flat / "outputs" / "charts" / "plot.png", PNG)
    write(flat / "workspace" / "tmp.txt", b"scratch")
    (flat / "uploads" / "link.txt").symlink_to(secret)
    os.mkfifo(flat / "uploads" / "pipe")
    write(flat / "uploads" / ".upload-0123456789abcdef.part", b"half")
    (flat / "uploads" / "sub").mkdir()
    write(root / "threads" / "bad.id" / "user-data" / "uploads" / "x.txt", b"x")
    (root / "threads" / "linked").symlink_to(secret.parent, target_is_directory=True)
    write(root / "users" / "u1" / "threads" / "t2" / "user-data" / "uploads" / "a.txt", b"a")
    write(root / "users" / "u2" / "threads" / "t3" / "user-data" / "uploads" / "b.txt", b"b")
    write(root / "users" / "bad.uid" / "threads" / "t4" / "user-data" / "uploads" / "c.txt", b"c")
    return root


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: kind, and for files their bytes' hash and mtime."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            info = path.lstat()
            digest = None
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            seen[path.relative_to(root).as_posix()] = (info.st_mode, digest, info.st_mtime_ns)
    return seen


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    secret = write(tmp_path / "elsewhere" / "secret.txt", b"not DeerFlow's")
    return deerflow_tree(tmp_path / "deerflow", secret)


def run(app: Flask, *args: str):
    return app.test_cli_runner().invoke(args=["import-deerflow", *args])


def options() -> list[str]:
    return ["--owner", TEST_EMAIL, "--map", f"u1={TEST_EMAIL}"] if AUTH_ON else []


def records(app: Flask, thread_id: str) -> dict[str, object]:
    services = app.extensions[EXTENSION_KEY]
    scope = services.uploads.paths.scope(thread_ref(thread_id))
    return {s.record.filename: s for s in services.uploads.records.all(scope)}


def test_import_adopts_files_records_and_companions(app: Flask, tree: Path, base_dir: Path) -> None:
    before = snapshot(tree)
    result = run(app, str(tree), *options())
    assert result.exit_code == 0, result.output
    assert snapshot(tree) == before  # DIR is read, never changed

    uploads = uploads_dir(base_dir, "t1")
    assert sorted(os.listdir(uploads)) == [
        "data.csv",
        "notes.docx",
        "notes.md",
        "report.md",
        "report.pdf",
    ]
    assert (uploads / "report.pdf").read_bytes() == PDF
    assert (uploads / "report.pdf").stat().st_mtime == 1_700_000_000  # DeerFlow's time kept
    found = {name: stored.record for name, stored in records(app, "t1").items()}
    assert set(found) == set(os.listdir(uploads))
    for name, record in found.items():
        assert record.sha256 == hashlib.sha256((uploads / name).read_bytes()).hexdigest()
    assert found["report.pdf"].content_type == "application/pdf"  # sniffed from the bytes
    assert found["data.csv"].content_type == "text/csv"
    assert found["report.md"].converted_from == "report.pdf"
    assert found["report.md"].source_sha256 == found["report.pdf"].sha256
    assert found["notes.md"].converted_from is None  # older than notes.docx: the user's own
    outputs = user_data_dir(base_dir, "t1") / "outputs"
    assert (outputs / "charts" / "plot.png").read_bytes() == PNG
    assert (user_data_dir(base_dir, "t1") / "workspace" / "tmp.txt").read_bytes() == b"scratch"

    skipped = result.output
    for reason in (
        "threads/t1/user-data/uploads/link.txt: a symbolic link",
        "threads/t1/user-data/uploads/pipe: a special file",
        "threads/t1/user-data/uploads/.upload-0123456789abcdef.part: an unfinished upload",
        "threads/t1/user-data/uploads/sub: a folder inside uploads/",
        "threads/bad.id: not a valid thread id",
        "threads/linked: not a folder (links are never followed)",
        "users/bad.uid: not a valid DeerFlow user id",
    ):
        assert f"skipped {reason}" in skipped, reason
    assert all(p.read_bytes() != b"not DeerFlow's" for p in uploads.iterdir())

    # The file manager's API sees the adopted records as they are: companion under original.
    client = app.test_client()
    listing = client.get("/api/threads/t1/uploads/list").get_json()
    by_name = {f["filename"]: f for f in listing["files"]}
    assert by_name["report.pdf"]["markdown_file"] == "report.md"
    assert by_name["notes.docx"]["markdown_file"] is None
    # Deleting the document takes its companion along, never the user's own notes.md.
    assert client.delete("/api/threads/t1/uploads/report.pdf").status_code == 200
    assert client.delete("/api/threads/t1/uploads/notes.docx").status_code == 200
    assert sorted(os.listdir(uploads)) == ["data.csv", "notes.md"]


def test_a_second_run_adopts_nothing_and_changes_nothing(
    app: Flask, tree: Path, base_dir: Path
) -> None:
    assert run(app, str(tree), *options()).exit_code == 0
    ours = snapshot(base_dir / ("users" if AUTH_ON else "threads"))
    stored = {t: records(app, t) for t in ("t1", "t2")}
    again = run(app, str(tree), *options())
    assert again.exit_code == 0, again.output
    assert "adopted " not in again.output
    assert "0 file(s) copied" in again.output and "0 upload record(s) written" in again.output
    assert snapshot(base_dir / ("users" if AUTH_ON else "threads")) == ours
    assert {t: records(app, t) for t in ("t1", "t2")} == stored


def test_a_different_file_of_the_same_name_is_never_replaced(
    app: Flask, tree: Path, base_dir: Path
) -> None:
    mine = write(uploads_dir(base_dir, "t1") / "data.csv", b"our own data")
    result = run(app, str(tree), *options())
    assert result.exit_code == 0
    assert "skipped threads/t1/user-data/uploads/data.csv: name collision" in result.output
    assert mine.read_bytes() == b"our own data"


def test_move_takes_only_what_it_adopted(app: Flask, tree: Path, base_dir: Path) -> None:
    source = tree / "threads" / "t1" / "user-data"
    result = run(app, str(tree), *options(), "--move")
    assert result.exit_code == 0, result.output
    assert not (source / "uploads" / "report.pdf").exists()
    assert not (source / "outputs" / "charts" / "plot.png").exists()
    assert (uploads_dir(base_dir, "t1") / "report.pdf").read_bytes() == PDF
    assert (uploads_dir(base_dir, "t1") / "report.pdf").stat().st_nlink == 1
    assert (source / "uploads" / "link.txt").is_symlink()  # skipped: left where it was
    assert (source / "uploads" / ".upload-0123456789abcdef.part").exists()
    assert records(app, "t1")["report.md"].record.converted_from == "report.pdf"


@needs_auth
def test_owners_by_rule(app: Flask, tree: Path, base_dir: Path) -> None:
    services = app.extensions[EXTENSION_KEY]
    other = services.accounts.create_user("other@example.com", "other password")
    services.threads.create(other.id, "t2")  # ids are per user: this one is in no one's way
    result = run(app, str(tree), "--map", f"u1={TEST_EMAIL}", "--map", "u2=other@example.com")
    assert result.exit_code == 0, result.output
    assert "skipped threads/t1: no owner for DeerFlow's flat layout" in result.output
    assert (uploads_dir(base_dir, "t2") / "a.txt").exists()  # u1's t2 is the test user's
    assert (uploads_dir(base_dir, "t3", other.id) / "b.txt").read_bytes() == b"b"
    assert services.threads.exists(thread_ref("t3", other.id))
    assert not services.threads.exists(thread_ref("t3"))
    assert not uploads_dir(base_dir, "t1").exists()
    unmapped = run(app, str(tree), "--owner", TEST_EMAIL)
    assert "skipped users/u1/threads/t2: DeerFlow user u1 is not mapped" in unmapped.output
    assert services.threads.exists(thread_ref("t1"))
    unknown = run(app, str(tree), "--owner", "nobody@example.com")
    assert unknown.exit_code != 0 and "No account with email nobody@example.com" in unknown.output
    bad = run(app, str(tree), "--map", "u1")
    assert bad.exit_code != 0 and "UID=EMAIL" in bad.output


@pytest.mark.skipif(AUTH_ON, reason="single-user mode only")
def test_single_user_mode_takes_both_layouts_into_the_flat_one(
    app: Flask, tree: Path, base_dir: Path
) -> None:
    write(tree / "users" / "u2" / "threads" / "t1" / "user-data" / "uploads" / "z.txt", b"z")
    result = run(app, str(tree))
    assert result.exit_code == 0, result.output
    assert (uploads_dir(base_dir, "t2") / "a.txt").read_bytes() == b"a"
    assert (uploads_dir(base_dir, "t3") / "b.txt").read_bytes() == b"b"
    assert "skipped users/u2/threads/t1: thread t1 is already imported from threads/t1" in (
        result.output
    )
    assert not (uploads_dir(base_dir, "t1") / "z.txt").exists()
    refused = run(app, str(tree), "--owner", "someone@example.com")
    assert refused.exit_code != 0 and "Accounts are off" in refused.output
