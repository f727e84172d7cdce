"""GET /uploads/list and DELETE /uploads/<name> (SPEC 2.3, 2.4, D7, D8, D10; cases 56-71)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import UploadActions
from tests.helpers import threads_root
from tests.helpers import uploads_dir
from tests.helpers import user_data_dir
from tests.helpers import wait_until


def on_disk(base_dir: Path, *names: str, thread_id: str = "T") -> Path:
    folder = uploads_dir(base_dir, thread_id)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(name.encode())
    return folder


@pytest.mark.local_disk
def test_list_is_sorted_by_code_point(uploads: UploadActions, base_dir: Path) -> None:
    on_disk(base_dir, "b.txt", "a.txt", "B.txt")
    body = uploads.list("T")
    assert [f["filename"] for f in body["files"]] == ["B.txt", "a.txt", "b.txt"]
    assert body["count"] == 3
    entry = body["files"][1]
    assert entry["extension"] == ".txt"
    assert isinstance(entry["modified"], float)
    assert isinstance(entry["size"], int)
    assert entry["original_filename"] is None and entry["markdown_file"] is None


@pytest.mark.local_disk
def test_list_hides_staging_files_and_keeps_dotfiles(
    uploads: UploadActions, base_dir: Path
) -> None:
    on_disk(
        base_dir, ".env", ".upload-active.part", ".upload-note.txt", "draft.part", "visible.txt"
    )
    assert uploads.names("T") == [".env", ".upload-note.txt", "draft.part", "visible.txt"]
    assert uploads.list("T")["files"][0]["extension"] == ""


@pytest.mark.local_disk
def test_list_skips_subdirectories_and_symlinks(uploads: UploadActions, base_dir: Path) -> None:
    folder = on_disk(base_dir, "file.txt", "real.pdf")
    (folder / "subdir").mkdir()
    (folder / "link.pdf").symlink_to(folder / "real.pdf")
    assert uploads.names("T") == ["file.txt", "real.pdf"]


def test_list_of_unknown_thread_creates_nothing(client, base_dir: Path) -> None:
    response = client.get("/api/threads/nobody/uploads/list")
    assert response.get_json() == {"files": [], "count": 0}
    assert not threads_root(base_dir).exists()


@pytest.mark.local_disk
def test_list_shows_companions_found_on_disk(uploads: UploadActions, base_dir: Path) -> None:
    on_disk(base_dir, "report.pdf", "report.md")
    assert uploads.names("T") == ["report.md", "report.pdf"]


@pytest.mark.local_disk
def test_records_follow_changes_behind_the_apps_back(
    uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload("T", (b"uploaded", "kept.txt"), (b"gone", "gone.txt"))
    folder = uploads_dir(base_dir, "T")
    (folder / "gone.txt").unlink()
    (folder / "added.bin").write_bytes(b"\x00\x01binary")
    (folder / "kept.txt").write_bytes(b"edited in place, longer")
    files = {f["filename"]: f for f in uploads.list("T")["files"]}
    assert sorted(files) == ["added.bin", "kept.txt"]
    assert files["added.bin"]["content_type"] == "application/octet-stream"
    assert files["kept.txt"]["size"] == len(b"edited in place, longer")
    import hashlib

    assert files["kept.txt"]["sha256"] == hashlib.sha256(b"edited in place, longer").hexdigest()


def test_content_type_is_sniffed_not_trusted(uploads: UploadActions) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20
    files = uploads.upload("T", (png, "picture.txt"), (b"%PDF-1.7 ...", "doc.bin")).get_json()[
        "files"
    ]
    assert [f["content_type"] for f in files] == ["image/png", "application/pdf"]


def test_delete(uploads: UploadActions, base_dir: Path) -> None:
    uploads.upload("T", (b"x", "test.txt"))
    response = uploads.delete("T", "test.txt")
    assert response.status_code == 200
    assert response.get_json() == {"success": True, "message": "Deleted test.txt"}
    assert not (uploads_dir(base_dir, "T") / "test.txt").exists()
    assert uploads.names("T") == []


def test_delete_missing(uploads: UploadActions) -> None:
    uploads.upload("T", (b"1", "keep.txt"))
    response = uploads.delete("T", "nope.txt")
    assert response.status_code == 404
    assert response.get_json() == {"detail": "File not found: nope.txt"}


def test_delete_in_a_thread_the_caller_does_not_have(
    uploads: UploadActions, base_dir: Path
) -> None:
    """Issue 25 item 5: the thread is named as missing, and nothing is created for it."""
    response = uploads.delete("nobody", "nope.txt")
    assert response.status_code == 404
    assert response.get_json() == {"detail": "Thread nobody not found"}
    assert not list(base_dir.rglob("nobody"))
    assert uploads.list("nobody") == {"files": [], "count": 0}


@pytest.mark.local_disk
def test_delete_cascades_to_a_companion_of_unknown_origin(
    uploads: UploadActions, base_dir: Path
) -> None:
    folder = on_disk(base_dir, "report.pdf", "report.md", "REPORT.PDF", "REPORT.md")
    assert uploads.delete("T", "report.pdf").get_json()["message"] == "Deleted report.pdf"
    assert uploads.delete("T", "REPORT.PDF").status_code == 200
    assert os.listdir(folder) == []


@pytest.mark.local_disk
def test_delete_of_a_non_convertible_keeps_its_md(uploads: UploadActions, base_dir: Path) -> None:
    folder = on_disk(base_dir, "data.csv", "data.md")
    uploads.delete("T", "data.csv")
    assert os.listdir(folder) == ["data.md"]


@pytest.mark.local_disk
def test_delete_of_an_image_keeps_a_md_of_the_same_name(
    uploads: UploadActions, base_dir: Path
) -> None:
    """Images convert (OCR), but DeerFlow's converter never makes Markdown of them: a
    `photo.md` found next to `photo.png` is the user's own file."""
    folder = on_disk(base_dir, "photo.png", "photo.md")
    uploads.delete("T", "photo.png")
    assert os.listdir(folder) == ["photo.md"]


def test_an_uploaded_image_converts_to_its_text_and_size(
    uploads: UploadActions, base_dir: Path, client: Any, tmp_path: Path
) -> None:
    from tests.support.images import make_text_png

    png = make_text_png(tmp_path / "shot.png")
    uploads.upload("T", (png.read_bytes(), "shot.png"))

    response = client.post("/api/threads/T/uploads/shot.png/convert")
    if response.status_code == 202:  # a busy machine: follow the job in the list
        wait_until(
            lambda: (
                next(f for f in uploads.list("T")["files"] if f["filename"] == "shot.png")[
                    "conversion_state"
                ]
                == "done"
            ),
            timeout=120,
        )
    else:
        assert response.status_code == 200, response.get_json()
    markdown = (uploads_dir(base_dir, "T") / "shot.md").read_text(encoding="utf-8")
    assert markdown.startswith("<!-- image: 1400 x ")
    assert "pixels (PNG); OCR, mean confidence" in markdown
    assert "Invoice 2026-11 total 4,210.50 EUR" in markdown


def test_delete_never_removes_a_md_the_user_uploaded(
    uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload("T", (b"%PDF-1.4", "notes.pdf"), (b"# my notes", "notes.md"))
    uploads.delete("T", "notes.pdf")
    assert (uploads_dir(base_dir, "T") / "notes.md").read_bytes() == b"# my notes"


def test_delete_of_a_directory_is_not_found(uploads: UploadActions, base_dir: Path) -> None:
    (on_disk(base_dir) / "d").mkdir()
    assert uploads.delete("T", "d").status_code == 404
    assert (on_disk(base_dir) / "d").is_dir()


@pytest.mark.local_disk
def test_delete_never_follows_a_symlink(
    uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    folder = on_disk(base_dir, "victim.pdf", "victim.md")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (folder / "out.txt").symlink_to(outside)
    (folder / "alias.pdf").symlink_to(folder / "victim.pdf")
    for name in ("out.txt", "alias.pdf"):
        response = uploads.delete("T", name)
        assert response.status_code == 404
        assert response.get_json() == {"detail": f"File not found: {name}"}
    assert outside.read_text() == "keep me"
    assert sorted(os.listdir(folder)) == ["alias.pdf", "out.txt", "victim.md", "victim.pdf"]


def test_delete_percent_encoded_name(uploads: UploadActions, client) -> None:
    uploads.upload("T", (b"x", "report#1?.txt"))
    response = client.delete("/api/threads/T/uploads/report%231%3F.txt")
    assert response.get_json()["message"] == "Deleted report#1?.txt"


def test_delete_with_encoded_slash_never_leaves_the_folder(client, base_dir: Path) -> None:
    victim = user_data_dir(base_dir, "T") / "x"
    victim.parent.mkdir(parents=True)
    victim.write_text("x")
    response = client.delete("/api/threads/T/uploads/..%2Fx")
    assert response.status_code in (400, 404)
    assert response.get_json()["detail"]
    assert victim.exists()


def test_get_on_a_delete_route_is_405(client) -> None:
    response = client.get("/api/threads/T/uploads/x.txt")
    assert response.status_code == 405
    assert response.get_json() == {"detail": "Method Not Allowed"}


def test_unknown_api_path_is_json_404(client) -> None:
    response = client.get("/api/nothing/here")
    assert response.status_code == 404
    assert response.get_json() == {"detail": "Not Found"}


def test_rename_keeps_the_record(uploads: UploadActions, client, base_dir: Path) -> None:
    sha = uploads.upload("T", (b"content", "a.txt")).get_json()["files"][0]["sha256"]
    response = client.post("/api/threads/T/uploads/a.txt/rename", json={"new_name": "b.txt"})
    assert response.status_code == 200
    assert response.get_json()["file"]["filename"] == "b.txt"
    files = uploads.list("T")["files"]
    assert [(f["filename"], f["sha256"]) for f in files] == [("b.txt", sha)]


def test_rename_conflicts(uploads: UploadActions, client, base_dir: Path) -> None:
    uploads.upload("T", (b"a", "a.txt"), (b"b", "b.txt"))
    url = "/api/threads/T/uploads/a.txt/rename"
    assert client.post(url, json={"new_name": "b.txt"}).status_code == 409
    renamed = client.post(url, json={"new_name": "b.txt", "on_conflict": "rename"}).get_json()
    assert renamed["file"]["filename"] == "b_1.txt"
    replaced = client.post(
        "/api/threads/T/uploads/b_1.txt/rename",
        json={"new_name": "b.txt", "on_conflict": "replace"},
    )
    assert replaced.status_code == 200
    assert uploads.names("T") == ["b.txt"]
    assert (uploads_dir(base_dir, "T") / "b.txt").read_bytes() == b"a"


def test_rename_refuses_bad_names(uploads: UploadActions, client) -> None:
    uploads.upload("T", (b"a", "a.txt"))
    url = "/api/threads/T/uploads/a.txt/rename"
    assert client.post(url, json={"new_name": ".."}).status_code == 400
    assert client.post(url, json={"new_name": ".upload-x.part"}).status_code == 400
    assert client.post(url, json={}).status_code == 422
    assert (
        client.post("/api/threads/T/uploads/zz.txt/rename", json={"new_name": "q"}).status_code
        == 404
    )
    assert uploads.names("T") == ["a.txt"]
