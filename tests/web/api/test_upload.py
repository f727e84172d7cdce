"""POST /api/threads/<tid>/uploads (SPEC 2.1, D5, D13, D14; cases 10-41)."""

from __future__ import annotations

import io
import os
from io import BytesIO
from pathlib import Path

import pytest

from tests.helpers import UploadActions
from tests.helpers import threads_root
from tests.helpers import uploads_dir

UPLOAD_KEYS = {
    "filename",
    "size",
    "path",
    "virtual_path",
    "artifact_url",
    "extension",
    "modified",
    "original_filename",
    "markdown_file",
    "markdown_path",
    "markdown_virtual_path",
    "markdown_artifact_url",
}


def test_single_upload(uploads: UploadActions, base_dir: Path) -> None:
    response = uploads.upload("T", (b"hello uploads", "notes.txt"))
    assert response.status_code == 200
    body = response.get_json()
    assert body["success"] is True
    assert body["skipped_files"] == []
    assert body["rejected_files"] == []
    assert body["message"] == "Successfully uploaded 1 file(s)"
    entry = body["files"][0]
    assert UPLOAD_KEYS <= entry.keys()
    assert entry["filename"] == "notes.txt"
    assert entry["size"] == 13 and isinstance(entry["size"], int)
    assert entry["virtual_path"] == "/mnt/user-data/uploads/notes.txt"
    assert entry["artifact_url"] == "/api/threads/T/artifacts/mnt/user-data/uploads/notes.txt"
    assert entry["path"].endswith("/user-data/uploads/notes.txt")
    for key in (
        "extension",
        "modified",
        "original_filename",
        "markdown_file",
        "markdown_path",
        "markdown_virtual_path",
        "markdown_artifact_url",
        "duplicate_of",
    ):
        assert entry[key] is None, key
    assert entry["sha256"] == "5a197852e6ea45acb3d9e89ce5e385e027779db232eefec39e4f97ce97c4fbb7"
    assert entry["content_type"] == "text/plain"
    assert (uploads_dir(base_dir, "T") / "notes.txt").read_bytes() == b"hello uploads"


def test_path_is_absolute_outside_the_working_dir(uploads: UploadActions, base_dir: Path) -> None:
    entry = uploads.upload("T", (b"x", "a.txt")).get_json()["files"][0]
    assert entry["path"] == str(uploads_dir(base_dir, "T") / "a.txt")


def test_path_is_relative_inside_the_working_dir(
    make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = make_app(BASE_DIR=str(tmp_path / ".deer-flow")).test_client()
    entry = UploadActions(client).upload("T", (b"x", "a.txt")).get_json()["files"][0]
    expected = uploads_dir(Path(".deer-flow"), "T") / "a.txt"
    assert entry["path"] == expected.as_posix()


def test_same_name_twice_in_one_request(uploads: UploadActions, base_dir: Path) -> None:
    files = uploads.upload("T", (b"first", "data.txt"), (b"second", "data.txt")).get_json()["files"]
    assert [f["filename"] for f in files] == ["data.txt", "data_1.txt"]
    assert [f["original_filename"] for f in files] == [None, "data.txt"]
    folder = uploads_dir(base_dir, "T")
    assert (folder / "data.txt").read_bytes() == b"first"
    assert (folder / "data_1.txt").read_bytes() == b"second"


def test_urls_are_percent_encoded_but_virtual_paths_are_not(uploads: UploadActions) -> None:
    files = uploads.upload("T", (b"1", "report final.pdf"), (b"2", "a#b?.txt")).get_json()["files"]
    assert files[0]["artifact_url"].endswith("/report%20final.pdf")
    assert files[1]["artifact_url"].endswith("/a%23b%3F.txt")
    assert files[1]["virtual_path"] == "/mnt/user-data/uploads/a#b?.txt"


def test_traversal_in_filename_keeps_the_basename(uploads: UploadActions, base_dir: Path) -> None:
    assert (
        uploads.upload("T", (b"x", "../etc/passwd")).get_json()["files"][0]["filename"] == "passwd"
    )
    assert os.listdir(uploads_dir(base_dir, "T")) == ["passwd"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("..", "Filename is empty or names a folder"),
        (".", "Filename is empty or names a folder"),
        ("/", "Filename is empty or names a folder"),
        ("a\\b.txt", "Filename contains a backslash, which is a folder separator on Windows"),
        ("x" * 256, "Filename too long: more than 255 bytes in UTF-8"),
        (".upload-abc.part", "Filename .upload-abc.part is reserved for uploads in progress"),
    ],
)
def test_unusable_names_are_rejected_with_their_reason(
    uploads: UploadActions, base_dir: Path, name: str, reason: str
) -> None:
    response = uploads.upload("T", (b"x", name))
    assert response.status_code == 200
    assert response.get_json() == {
        "success": False,
        "files": [],
        "message": "Successfully uploaded 0 file(s); rejected 1 file(s) with an unusable name",
        "skipped_files": [],
        "rejected_files": [{"filename": name, "reason": reason}],
    }
    assert not uploads_dir(base_dir, "T").exists() or not os.listdir(uploads_dir(base_dir, "T"))


def test_name_of_exactly_255_bytes_is_accepted(uploads: UploadActions) -> None:
    name = "é" * 125 + "a.txt"
    assert len(name.encode()) == 255
    assert uploads.upload("T", (b"x", name)).get_json()["files"][0]["filename"] == name


def test_empty_filename_next_to_a_valid_one(uploads: UploadActions, client, base_dir: Path) -> None:
    data = {"files": [(BytesIO(b"a"), ""), (BytesIO(b"b"), "x.txt")]}
    body = client.post("/api/threads/T/uploads", data=data).get_json()
    assert body["message"] == "Successfully uploaded 1 file(s)"
    assert os.listdir(uploads_dir(base_dir, "T")) == ["x.txt"]


def test_too_many_files(uploads: UploadActions, base_dir: Path) -> None:
    files = [(b"x", f"f{i}.txt") for i in range(11)]
    response = uploads.upload("T", *files)
    assert response.status_code == 413
    assert response.get_json() == {"detail": "Too many files: maximum is 10"}
    assert not uploads_dir(base_dir, "T").exists()


def test_max_files_from_config(make_app) -> None:
    actions = UploadActions(make_app(uploads={"max_files": 1}).test_client())
    assert actions.upload("T", (b"a", "a.txt"), (b"b", "b.txt")).status_code == 413
    assert actions.names("T") == []


def test_file_too_large(make_app, base_dir: Path) -> None:
    actions = UploadActions(make_app(uploads={"max_file_size": 5}).test_client())
    response = actions.upload("T", (b"123456", "big.txt"))
    assert response.status_code == 413
    assert response.get_json() == {"detail": "File too large: big.txt"}
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or os.listdir(folder) == []
    assert actions.upload("T", (b"12345", "ok.txt")).status_code == 200


def test_total_too_large_removes_everything_of_the_request(make_app, base_dir: Path) -> None:
    actions = UploadActions(make_app(uploads={"max_total_size": 5}).test_client())
    response = actions.upload("T", (b"abc", "first.txt"), (b"def", "second.txt"))
    assert response.status_code == 413
    assert response.get_json() == {"detail": "Total upload size too large"}
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or os.listdir(folder) == []


def test_total_exactly_at_the_limit(make_app) -> None:
    actions = UploadActions(make_app(uploads={"max_total_size": 6}).test_client())
    assert actions.upload("T", (b"abc", "first.txt"), (b"def", "second.txt")).status_code == 200
    assert actions.names("T") == ["first.txt", "second.txt"]


def test_per_file_limit_wins_over_total(make_app) -> None:
    actions = UploadActions(
        make_app(uploads={"max_file_size": 2, "max_total_size": 2}).test_client()
    )
    assert actions.upload("T", (b"abc", "a.txt")).get_json()["detail"] == "File too large: a.txt"


def test_oversized_reupload_keeps_the_old_bytes(make_app, base_dir: Path) -> None:
    actions = UploadActions(make_app(uploads={"max_file_size": 10}).test_client())
    assert actions.upload("T", (b"original", "a.txt")).status_code == 200
    assert actions.upload("T", (b"x" * 12, "a.txt")).status_code == 413
    folder = uploads_dir(base_dir, "T")
    assert (folder / "a.txt").read_bytes() == b"original"
    assert os.listdir(folder) == ["a.txt"]


def test_failed_request_restores_a_file_it_replaced(make_app, base_dir: Path) -> None:
    actions = UploadActions(make_app(uploads={"max_total_size": 10}).test_client())
    actions.upload("T", (b"old bytes", "a.txt"))
    response = actions.upload("T", (b"new", "a.txt"), (b"y" * 9, "b.txt"))
    assert response.status_code == 413
    folder = uploads_dir(base_dir, "T")
    assert (folder / "a.txt").read_bytes() == b"old bytes"
    assert sorted(os.listdir(folder)) == ["a.txt"]
    assert actions.names("T") == ["a.txt"]


def test_existing_file_is_replaced_atomically(uploads: UploadActions, base_dir: Path) -> None:
    uploads.upload("T", (b"old upload", "notes.txt"))
    body = uploads.upload("T", (b"new upload", "notes.txt")).get_json()
    assert body["files"][0]["filename"] == "notes.txt"
    assert body["files"][0]["original_filename"] is None
    path = uploads_dir(base_dir, "T") / "notes.txt"
    assert path.read_bytes() == b"new upload"
    assert path.stat().st_nlink == 1
    assert uploads.list("T")["files"][0]["sha256"] == body["files"][0]["sha256"]


def test_on_conflict_rename_keeps_both(uploads: UploadActions, base_dir: Path) -> None:
    uploads.upload("T", (b"one", "a.txt"))
    body = uploads.upload("T", (b"two", "a.txt"), on_conflict="rename").get_json()
    assert body["files"][0]["filename"] == "a_1.txt"
    assert body["files"][0]["original_filename"] == "a.txt"
    assert (uploads_dir(base_dir, "T") / "a.txt").read_bytes() == b"one"


def test_on_conflict_reject(uploads: UploadActions, client, base_dir: Path) -> None:
    uploads.upload("T", (b"one", "a.txt"))
    response = uploads.upload("T", (b"new", "b.txt"), (b"two", "a.txt"), on_conflict="reject")
    assert response.status_code == 409
    assert "a.txt" in response.get_json()["detail"]
    assert sorted(os.listdir(uploads_dir(base_dir, "T"))) == ["a.txt"]
    assert (uploads_dir(base_dir, "T") / "a.txt").read_bytes() == b"one"
    query = client.post(
        "/api/threads/T/uploads?on_conflict=reject", data={"files": [(BytesIO(b"x"), "a.txt")]}
    )
    assert query.status_code == 409


def test_unknown_on_conflict_value(uploads: UploadActions) -> None:
    response = uploads.upload("T", (b"x", "a.txt"), on_conflict="merge")
    assert response.status_code == 400
    assert "on_conflict" in response.get_json()["detail"]


def test_duplicate_content_is_reported(uploads: UploadActions) -> None:
    uploads.upload("T", (b"same bytes", "a.txt"))
    files = uploads.upload("T", (b"same bytes", "b.txt"), (b"other", "c.txt")).get_json()["files"]
    assert files[0]["duplicate_of"] == "a.txt"
    assert files[1]["duplicate_of"] is None
    assert (
        uploads.upload("U", (b"same bytes", "x.txt")).get_json()["files"][0]["duplicate_of"] is None
    )


def test_staging_pattern_names_are_refused(uploads: UploadActions, base_dir: Path) -> None:
    body = uploads.upload("T", (b"x", ".upload-abc.part"), (b"y", "ok.txt")).get_json()
    assert body["skipped_files"] == []
    assert [r["filename"] for r in body["rejected_files"]] == [".upload-abc.part"]
    assert body["success"] is False
    assert os.listdir(uploads_dir(base_dir, "T")) == ["ok.txt"]


def prepare(base_dir: Path) -> Path:
    folder = uploads_dir(base_dir, "T")
    folder.mkdir(parents=True)
    return folder


def test_symlink_destination_is_skipped(
    uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    folder = prepare(base_dir)
    outside = tmp_path / "outside.txt"
    outside.write_text("protected")
    (folder / "victim.txt").symlink_to(outside)
    body = uploads.upload("T", (b"attack", "victim.txt")).get_json()
    assert body["success"] is False
    assert body["files"] == []
    assert body["skipped_files"] == ["victim.txt"]
    assert "skipped 1 unsafe file" in body["message"]
    assert outside.read_text() == "protected"
    assert (folder / "victim.txt").is_symlink()


def test_dangling_symlink_is_skipped(
    uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    folder = prepare(base_dir)
    (folder / "victim.txt").symlink_to(tmp_path / "not-there.txt")
    assert uploads.upload("T", (b"attack", "victim.txt")).get_json()["skipped_files"] == [
        "victim.txt"
    ]
    assert not (tmp_path / "not-there.txt").exists()


@pytest.mark.local_disk
def test_hard_link_destination_is_skipped(
    uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    folder = prepare(base_dir)
    outside = tmp_path / "outside.txt"
    outside.write_text("protected")
    os.link(outside, folder / "victim.txt")
    assert uploads.upload("T", (b"attack", "victim.txt")).get_json()["skipped_files"] == [
        "victim.txt"
    ]
    assert outside.read_text() == "protected"
    assert (folder / "victim.txt").read_text() == "protected"


def test_unsafe_part_does_not_stop_the_others(
    uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    folder = prepare(base_dir)
    (folder / "victim.txt").symlink_to(tmp_path / "x")
    response = uploads.upload("T", (b"a", "victim.txt"), (b"b", "ok.txt"))
    body = response.get_json()
    assert response.status_code == 200
    assert [f["filename"] for f in body["files"]] == ["ok.txt"]
    assert body["skipped_files"] == ["victim.txt"]


def test_directory_destination_is_skipped(uploads: UploadActions, base_dir: Path) -> None:
    (prepare(base_dir) / "d").mkdir()
    assert uploads.upload("T", (b"x", "d")).get_json()["skipped_files"] == ["d"]


def test_skipped_name_stays_claimed(uploads: UploadActions, base_dir: Path, tmp_path: Path) -> None:
    (prepare(base_dir) / "v.txt").symlink_to(tmp_path / "x")
    files = uploads.upload("T", (b"a", "v.txt"), (b"b", "v.txt")).get_json()["files"]
    assert [f["filename"] for f in files] == ["v_1.txt"]


def test_uploaded_files_are_the_service_users_only(uploads: UploadActions, base_dir: Path) -> None:
    uploads.upload("T", (b"x", "a.txt"))
    assert (uploads_dir(base_dir, "T") / "a.txt").stat().st_mode & 0o777 == 0o600


def test_empty_file_is_valid(uploads: UploadActions) -> None:
    assert uploads.upload("T", (b"", "empty.txt")).get_json()["files"][0]["size"] == 0


def test_missing_files_field_is_a_validation_error(client, base_dir: Path) -> None:
    response = client.post("/api/threads/T/uploads", data={"other": "x"})
    assert response.status_code == 422
    detail = response.get_json()["detail"]
    assert isinstance(detail, list) and detail[0]["loc"] == ["body", "files"]
    assert not threads_root(base_dir).exists()


def test_not_multipart_is_a_validation_error(client) -> None:
    response = client.post("/api/threads/T/uploads", json={"files": []})
    assert response.status_code == 422
    assert UploadActions(client).names("T") == []


@pytest.mark.parametrize(
    "body",
    [
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\nabc',
        b"garbage without any boundary",
        b"--XYZ\r\nNo-Disposition: x\r\n\r\nabc\r\n--XYZ--\r\n",
    ],
)
def test_malformed_multipart(client, base_dir: Path, body: bytes) -> None:
    response = client.post(
        "/api/threads/T/uploads", data=body, content_type="multipart/form-data; boundary=XYZ"
    )
    assert response.status_code in (400, 422)
    assert response.get_json()["detail"]
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or os.listdir(folder) == []


@pytest.mark.parametrize(
    "url",
    [
        "/api/threads/bad.thread.id/uploads",
        "/api/threads/bad.thread.id/uploads/limits",
        "/api/threads/bad.thread.id/uploads/list",
        "/api/threads/bad.thread.id/uploads/a.txt",
        "/api/threads/bad.thread.id/artifacts/mnt/user-data/uploads/a.txt",
    ],
)
def test_invalid_thread_id_everywhere(client, url: str, base_dir: Path) -> None:
    method = {"uploads": "post", "a.txt": "delete"}.get(url.rsplit("/", 1)[1], "get")
    if url.endswith("artifacts/mnt/user-data/uploads/a.txt"):
        method = "get"
    response = getattr(client, method)(
        url, data={"files": [(BytesIO(b"x"), "a.txt")]} if method == "post" else None
    )
    assert response.status_code == 422
    assert any("thread_id" in item["loc"] for item in response.get_json()["detail"])
    assert (
        list(base_dir.iterdir()) == [base_dir / "secret_key", base_dir / "uploads.sqlite3"]
        or not threads_root(base_dir).exists()
    )


def test_limits_endpoint(make_app) -> None:
    client = make_app(
        uploads={"max_files": 15, "max_file_size": "1048576", "max_total_size": 2097152}
    ).test_client()
    assert client.get("/api/threads/T/uploads/limits").get_json() == {
        "max_files": 15,
        "max_file_size": 1048576,
        "max_total_size": 2097152,
    }


def test_limits_defaults(client) -> None:
    assert client.get("/api/threads/T/uploads/limits").get_json() == {
        "max_files": 10,
        "max_file_size": 52428800,
        "max_total_size": 104857600,
    }


def test_declared_length_over_the_backstop_is_refused_unread(make_app) -> None:
    client = make_app(MAX_CONTENT_LENGTH=1000).test_client()
    response = client.post(
        "/api/threads/T/uploads",
        input_stream=io.BytesIO(b"x" * 10),
        content_type="multipart/form-data; boundary=XYZ",
        environ_overrides={"CONTENT_LENGTH": "5000"},
    )
    assert response.status_code == 413
    assert response.get_json() == {"detail": "Total upload size too large"}


def test_broken_config_stops_start_up(make_app, tmp_path: Path) -> None:
    from deerflow_web.errors import ConfigError

    bad = tmp_path / "broken.yaml"
    bad.write_text("uploads: {max_files: [\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        make_app(CONFIG_PATH=str(bad))


def test_html_pages_get_html_errors(client) -> None:
    response = client.get("/no/such/page")
    assert response.status_code == 404
    assert response.mimetype == "text/html"
