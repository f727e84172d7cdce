"""What describing the API and fuzzing it turned up: each answer now says what the document says."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient

from tests.helpers import UploadActions
from tests.helpers import uploads_dir

BOUNDARY = "b0undary"


def _multipart(*parts: tuple[str, str | None, bytes]) -> bytes:
    chunks = []
    for name, filename, body in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        chunks.append(f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode())
        chunks.append(body + b"\r\n")
    chunks.append(f"--{BOUNDARY}--\r\n".encode())
    return b"".join(chunks)


def _post_parts(client: FlaskClient, url: str, *parts: tuple[str, str | None, bytes]):
    return client.post(
        url,
        data=_multipart(*parts),
        content_type=f"multipart/form-data; boundary={BOUNDARY}",
    )


def test_on_conflict_after_the_files_is_refused_and_nothing_is_kept(
    client: FlaskClient, base_dir: Path
) -> None:
    response = _post_parts(
        client,
        "/api/threads/T/uploads",
        ("files", "a.txt", b"first"),
        ("on_conflict", None, b"reject"),
    )
    assert response.status_code == 400
    assert response.get_json() == {"detail": "The on_conflict field must come before the files"}
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or list(folder.iterdir()) == []


def test_on_conflict_before_the_files_applies(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("T", (b"old", "a.txt"))
    url = "/api/threads/T/uploads"
    refused = _post_parts(client, url, ("on_conflict", None, b"reject"), ("files", "a.txt", b"x"))
    assert refused.status_code == 409
    other = ("unrelated", None, b"ignored")  # unknown fields may come anywhere
    kept = _post_parts(client, url, ("files", "b.txt", b"y"), other)
    assert kept.status_code == 200


def test_an_invalid_on_conflict_field_is_refused_even_when_the_query_names_one(
    client: FlaskClient, base_dir: Path
) -> None:
    response = _post_parts(
        client,
        "/api/threads/T/uploads?on_conflict=replace",
        ("on_conflict", None, b"AAA"),
        ("files", "a.txt", b"x"),
    )
    assert response.status_code == 400
    assert not uploads_dir(base_dir, "T").exists()


def test_an_empty_on_conflict_means_the_default(uploads: UploadActions) -> None:
    uploads.upload("T", (b"old", "a.txt"))
    body = uploads.upload("T", (b"new", "a.txt"), on_conflict="").get_json()
    assert [f["filename"] for f in body["files"]] == ["a.txt"]


@pytest.mark.parametrize("body", (["a.txt"], "a.txt", 3, None))
def test_rename_wants_a_json_object(client: FlaskClient, uploads: UploadActions, body) -> None:
    uploads.upload("T", (b"a", "a.txt"))
    response = client.post("/api/threads/T/uploads/a.txt/rename", json=body)
    assert response.status_code == 422
    detail = response.get_json()["detail"]
    assert detail[0]["loc"][0] == "body"
    assert uploads.names("T") == ["a.txt"]


def test_rename_refuses_a_path_and_the_old_alias(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("T", (b"a", "a.txt"))
    url = "/api/threads/T/uploads/a.txt/rename"
    slash = client.post(url, json={"new_name": "dir/b.txt"})
    assert slash.status_code == 400
    assert slash.get_json() == {"detail": "A new name cannot contain /"}
    assert client.post(url, json={"name": "b.txt"}).status_code == 422  # `new_name` only
    assert client.post(url, data={"new_name": "b.txt"}).status_code == 200  # form fields work
    assert uploads.names("T") == ["b.txt"]


@pytest.mark.parametrize(
    "url",
    (
        "/api/threads//uploads/list",
        "/api/threads/T/uploads//rename",
        "/api/threads/T//uploads/limits",
    ),
)
def test_an_empty_segment_is_not_redirected(client: FlaskClient, url: str) -> None:
    response = client.open(url, method="POST" if url.endswith("rename") else "GET")
    assert response.status_code == 404
    assert response.get_json() == {"detail": "Not Found"}


def test_an_artifact_may_keep_its_leading_slash(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("T", (b"hello", "a.txt"))
    with client.get("/api/threads/T/artifacts//mnt/user-data/uploads/a.txt") as response:
        assert response.status_code == 200
        assert response.get_data() == b"hello"


def test_served_document_carries_this_servers_file_limit(make_app) -> None:
    client = make_app(uploads={"max_files": 3}).test_client()
    document = client.get("/openapi.json").get_json()
    form = document["paths"]["/api/threads/{thread_id}/uploads"]["post"]["requestBody"]
    files = form["content"]["multipart/form-data"]["schema"]["properties"]["files"]
    assert files["maxItems"] == 3
    assert files["minItems"] == 1


@pytest.mark.local_disk
@pytest.mark.parametrize("name", ("line\rbreak.txt", "new\nline.txt", "tab\there.txt"))
def test_a_name_with_control_characters_is_served(
    client: FlaskClient, base_dir: Path, name: str
) -> None:
    folder = uploads_dir(base_dir, "T")
    folder.mkdir(parents=True)
    (folder / name).write_bytes(b"body")
    url = f"/api/threads/T/artifacts/mnt/user-data/uploads/{quote(name, safe='')}"
    for query in ("", "?download=true"):
        with client.get(url + query) as response:
            assert response.status_code == 200
            assert response.get_data() == b"body"
            disposition = response.headers["Content-Disposition"]
            assert disposition.endswith("filename*=UTF-8''" + quote(name, safe=""))
