"""Resumable uploads over tus 1.0.0 (SPEC 8) through the app: protocol, bad input, commit."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.storage.paths import is_staging_name
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.support.documents import make_docx
from tests.support.tus import CHUNK_TYPE
from tests.support.tus import TUS
from tests.support.tus import TusActions
from tests.support.tus import b64digest
from tests.support.tus import encode_metadata


@pytest.fixture
def tus(client: FlaskClient) -> TusActions:
    return TusActions(client)


def staging_files(base_dir: Path, thread_id: str) -> list[Path]:
    folder = uploads_dir(base_dir, thread_id)
    if not folder.exists():
        return []
    return [folder / name for name in os.listdir(folder) if is_staging_name(name)]


def service(app: Flask) -> Any:
    return app.extensions[EXTENSION_KEY].resumable


DATA = os.urandom(300_000)


# ---- the protocol --------------------------------------------------------------------------


def test_options_announces_version_extensions_limit_and_checksums(client: FlaskClient) -> None:
    response = client.options("/api/threads/t1/uploads/tus")
    assert response.status_code == 204
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert response.headers["Tus-Version"] == "1.0.0"
    assert response.headers["Tus-Extension"] == "creation,termination,checksum,expiration"
    assert response.headers["Tus-Max-Size"] == str(50 * 1024 * 1024)
    assert response.headers["Tus-Checksum-Algorithm"] == "sha1,sha256"


def test_upload_in_chunks_commits_once_the_last_byte_arrives(
    tus: TusActions, uploads: UploadActions, base_dir: Path
) -> None:
    response = tus.create("t1", len(DATA), encode_metadata(filename="报告 big.bin"))
    assert response.status_code == 201
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert "Upload-Expires" in response.headers
    url = response.headers["Location"]
    assert url.startswith("/api/threads/t1/uploads/tus/")
    head = tus.head(url)
    assert head.status_code == 200
    assert head.headers["Upload-Offset"] == "0"
    assert head.headers["Upload-Length"] == str(len(DATA))
    assert head.headers["Cache-Control"] == "no-store"
    assert head.headers["Upload-Metadata"] == encode_metadata(filename="报告 big.bin")
    assert [p.name.startswith(".upload-") for p in staging_files(base_dir, "t1")] == [True]

    for start in range(0, len(DATA), 100_000):
        assert uploads.names("t1") == []  # staging files are never listed
        patched = tus.patch(url, start, DATA[start : start + 100_000])
        assert patched.status_code == 204
        assert patched.headers["Upload-Offset"] == str(min(start + 100_000, len(DATA)))
        assert patched.headers["Tus-Resumable"] == "1.0.0"

    assert (uploads_dir(base_dir, "t1") / "报告 big.bin").read_bytes() == DATA
    assert staging_files(base_dir, "t1") == []
    assert uploads.names("t1") == ["报告 big.bin"]
    # A finished upload answers with its full offset until it expires: a client whose
    # last answer was lost learns it is done (and a zero-byte PATCH there changes nothing).
    head = tus.head(url)
    assert head.status_code == 200
    assert head.headers["Upload-Offset"] == head.headers["Upload-Length"] == str(len(DATA))
    assert tus.patch(url, len(DATA), b"").status_code == 204
    assert tus.patch(url, 0, DATA[:10]).status_code == 409
    assert uploads.names("t1") == ["报告 big.bin"]


def test_tus_file_is_indistinguishable_from_a_multipart_one(
    tus: TusActions, uploads: UploadActions, app: Flask
) -> None:
    body = b"%PDF-1.4\n" + DATA
    url = tus.start("a", len(body), filename="doc.pdf")
    assert tus.patch(url, 0, body).status_code == 204
    assert uploads.upload("b", (body, "doc.pdf")).status_code == 200

    def comparable(thread_id: str) -> list[dict[str, Any]]:
        files = uploads.list(thread_id)["files"]
        for entry in files:
            for key in ("uploaded_at", "modified", "path", "virtual_path", "artifact_url"):
                entry.pop(key, None)
        return files

    assert comparable("a") == comparable("b")
    assert comparable("a")[0]["content_type"] == "application/pdf"
    records = app.extensions[EXTENSION_KEY].uploads.records
    paths = app.extensions[EXTENSION_KEY].uploads.paths

    def record(thread_id: str) -> tuple:
        stored = records.get(paths.scope(thread_ref(thread_id)), "doc.pdf").record
        return (stored.size, stored.sha256, stored.content_type, stored.source)

    assert record("a") == record("b")
    assert record("a")[1] == hashlib.sha256(body).hexdigest()


def test_on_conflict_rename_from_metadata(tus: TusActions, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"old", "a.txt"))
    url = tus.start("t1", 3, filename="a.txt", on_conflict="rename")
    assert tus.patch(url, 0, b"new").status_code == 204
    assert uploads.names("t1") == ["a.txt", "a_1.txt"]


def test_replace_is_the_default(tus: TusActions, uploads: UploadActions, base_dir: Path) -> None:
    uploads.upload("t1", (b"old", "a.txt"))
    url = tus.start("t1", 3, filename="a.txt")
    assert tus.patch(url, 0, b"new").status_code == 204
    assert (uploads_dir(base_dir, "t1") / "a.txt").read_bytes() == b"new"


def test_reject_refused_at_the_end_answers_409_and_removes_the_staging_file(
    tus: TusActions, uploads: UploadActions, base_dir: Path
) -> None:
    url = tus.start("t1", 3, filename="a.txt", on_conflict="reject")
    uploads.upload("t1", (b"old", "a.txt"))  # someone else took the name meanwhile
    response = tus.patch(url, 0, b"new")
    assert response.status_code == 409
    assert response.get_json() == {"detail": "A file named a.txt already exists"}
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert (uploads_dir(base_dir, "t1") / "a.txt").read_bytes() == b"old"
    assert staging_files(base_dir, "t1") == []
    assert tus.head(url).status_code == 404


def test_reject_when_the_name_is_taken_at_creation(
    tus: TusActions, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload("t1", (b"old", "a.txt"))
    response = tus.create("t1", 3, encode_metadata(filename="a.txt", on_conflict="reject"))
    assert response.status_code == 409
    assert staging_files(base_dir, "t1") == []


def test_empty_file_is_committed_at_creation(tus: TusActions, uploads: UploadActions) -> None:
    url = tus.start("t1", 0, filename="empty.txt")
    assert uploads.names("t1") == ["empty.txt"]
    assert tus.head(url).headers["Upload-Offset"] == "0"  # complete


def test_automatic_conversion_runs_after_a_tus_commit(make_app: Any, tmp_path: Path) -> None:
    app = make_app(uploads={"auto_convert_documents": True, "conversion_wait_seconds": 60})
    tus = TusActions(app.test_client())
    body = make_docx(tmp_path / "report.docx").read_bytes()
    url = tus.start("t1", len(body), filename="report.docx")
    assert tus.patch(url, 0, body).status_code == 204
    assert UploadActions(app.test_client()).names("t1") == ["report.docx", "report.md"]


def test_termination_removes_the_bytes(tus: TusActions, base_dir: Path) -> None:
    url = tus.start("t1", len(DATA))
    assert tus.patch(url, 0, DATA[:1000]).status_code == 204
    response = tus.delete(url)
    assert response.status_code == 204
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert staging_files(base_dir, "t1") == []
    assert tus.head(url).status_code == 404
    assert tus.patch(url, 1000, DATA[1000:]).status_code == 404
    assert tus.delete(url).status_code == 404


def test_a_cut_off_chunk_keeps_what_arrived(client: FlaskClient, tus: TusActions) -> None:
    url = tus.start("t1", len(DATA))
    headers = {**TUS, "Upload-Offset": "0", "Content-Type": CHUNK_TYPE}
    response = client.patch(  # the client promised more bytes than it sent
        url,
        input_stream=io.BytesIO(DATA[:70_000]),
        headers=headers,
        environ_overrides={"CONTENT_LENGTH": str(len(DATA))},
    )
    assert response.status_code == 400
    assert tus.offset(url) == 70_000
    assert tus.patch(url, 70_000, DATA[70_000:]).status_code == 204


def test_a_cut_off_checksummed_chunk_is_discarded(client: FlaskClient, tus: TusActions) -> None:
    url = tus.start("t1", len(DATA))
    headers = {**TUS, "Upload-Offset": "0", "Content-Type": CHUNK_TYPE}
    headers["Upload-Checksum"] = "sha1 " + b64digest("sha1", DATA)
    response = client.patch(
        url,
        input_stream=io.BytesIO(DATA[:70_000]),
        headers=headers,
        environ_overrides={"CONTENT_LENGTH": str(len(DATA))},
    )
    assert response.status_code == 400
    assert tus.offset(url) == 0


@pytest.mark.parametrize("algorithm", ["sha1", "sha256"])
def test_matching_checksums_are_accepted(tus: TusActions, algorithm: str) -> None:
    url = tus.start("t1", len(DATA))
    first = DATA[:1000]
    checksum = f"{algorithm} {b64digest(algorithm, first)}"
    assert tus.patch(url, 0, first, checksum=checksum).status_code == 204
    assert tus.offset(url) == 1000


# ---- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "HEAD", "PATCH", "DELETE"])
@pytest.mark.parametrize("version", [None, "0.2.2"])
def test_missing_or_other_tus_version_is_412(
    client: FlaskClient, tus: TusActions, base_dir: Path, method: str, version: str | None
) -> None:
    url = tus.start("t1", len(DATA))
    target = "/api/threads/t1/uploads/tus" if method == "POST" else url
    headers = {"Upload-Length": "10", "Upload-Offset": "0", "Content-Type": CHUNK_TYPE}
    if version is not None:
        headers["Tus-Resumable"] = version
    response = client.open(target, method=method, headers=headers, data=b"x" * 10)
    assert response.status_code == 412
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert response.headers["Tus-Version"] == "1.0.0"
    if method != "HEAD":
        assert "detail" in response.get_json()
    assert tus.offset(url) == 0
    assert len(staging_files(base_dir, "t1")) == 1


@pytest.mark.parametrize("content_type", ["application/octet-stream", "text/plain", ""])
def test_wrong_content_type_is_415(tus: TusActions, content_type: str) -> None:
    url = tus.start("t1", len(DATA))
    response = tus.patch(url, 0, DATA[:100], content_type=content_type)
    assert response.status_code == 415
    assert response.get_json() == {"detail": "Content-Type must be application/offset+octet-stream"}
    assert tus.offset(url) == 0


@pytest.mark.parametrize("claimed", [0, 50, 150])
def test_offset_mismatch_is_409(tus: TusActions, base_dir: Path, claimed: int) -> None:
    url = tus.start("t1", len(DATA))
    assert tus.patch(url, 0, DATA[:100]).status_code == 204
    response = tus.patch(url, claimed, DATA[claimed : claimed + 100])
    assert response.status_code == 409
    assert "detail" in response.get_json()
    assert tus.offset(url) == 100
    assert staging_files(base_dir, "t1")[0].read_bytes() == DATA[:100]


@pytest.mark.parametrize("algorithm", ["sha1", "sha256"])
def test_checksum_mismatch_is_460_and_the_chunk_is_discarded(
    tus: TusActions, base_dir: Path, algorithm: str
) -> None:
    url = tus.start("t1", len(DATA))
    assert tus.patch(url, 0, DATA[:1000]).status_code == 204
    wrong = f"{algorithm} {b64digest(algorithm, b'something else')}"
    response = tus.patch(url, 1000, DATA[1000:5000], checksum=wrong)
    assert response.status_code == 460
    assert "detail" in response.get_json()
    assert tus.offset(url) == 1000
    assert staging_files(base_dir, "t1")[0].read_bytes() == DATA[:1000]
    right = f"{algorithm} {b64digest(algorithm, DATA[1000:5000])}"
    assert tus.patch(url, 1000, DATA[1000:5000], checksum=right).status_code == 204


@pytest.mark.parametrize(
    "checksum", ["md5 AAAA", "sha1 not-base64!", "sha256", "sha1 " + b64digest("sha256", b"x")]
)
def test_unsupported_or_malformed_checksum_is_400(tus: TusActions, checksum: str) -> None:
    url = tus.start("t1", len(DATA))
    response = tus.patch(url, 0, DATA[:10], checksum=checksum)
    assert response.status_code == 400
    assert tus.offset(url) == 0


def test_chunk_past_upload_length_is_400(tus: TusActions, base_dir: Path) -> None:
    url = tus.start("t1", 1000)
    assert tus.patch(url, 0, DATA[:600]).status_code == 204
    response = tus.patch(url, 600, DATA[600:1001])
    assert response.status_code == 400
    assert response.get_json()["detail"].startswith("The chunk goes past Upload-Length")
    assert tus.offset(url) == 600
    assert staging_files(base_dir, "t1")[0].read_bytes() == DATA[:600]


def test_chunked_body_is_streamed(client: FlaskClient, tus: TusActions) -> None:
    url = tus.start("t1", len(DATA))
    headers = {**TUS, "Upload-Offset": "0", "Content-Type": CHUNK_TYPE}
    headers["Transfer-Encoding"] = "chunked"
    response = client.patch(
        url,
        input_stream=io.BytesIO(DATA[:2000]),
        headers=headers,
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert response.status_code == 204
    assert tus.offset(url) == 2000


def test_chunked_body_past_upload_length_is_400(client: FlaskClient, tus: TusActions) -> None:
    url = tus.start("t1", 1000)
    headers = {**TUS, "Upload-Offset": "0", "Content-Type": CHUNK_TYPE}
    headers["Transfer-Encoding"] = "chunked"
    response = client.patch(  # as servers pass a chunked body: its end is marked
        url,
        input_stream=io.BytesIO(DATA[:2000]),
        headers=headers,
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert response.status_code == 400
    assert tus.offset(url) == 0


def test_length_over_the_file_limit_is_413_at_creation(tus: TusActions, base_dir: Path) -> None:
    response = tus.create("t1", 50 * 1024 * 1024 + 1, encode_metadata(filename="big.bin"))
    assert response.status_code == 413
    assert response.get_json() == {"detail": "File too large: big.bin"}
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert not uploads_dir(base_dir, "t1").exists()


def test_length_at_the_file_limit_is_accepted(make_app: Any) -> None:
    tus = TusActions(make_app(uploads={"max_file_size": 1000}).test_client())
    assert tus.create("t1", 1000, encode_metadata(filename="a.bin")).status_code == 201
    assert tus.create("t1", 1001, encode_metadata(filename="a.bin")).status_code == 413


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "",
        encode_metadata(other="x"),
        encode_metadata(filename=""),
        encode_metadata(filename=".."),
        encode_metadata(filename="a\\b.txt"),
        encode_metadata(filename="nul\x00.txt"),
        encode_metadata(filename="x" * 256),
        encode_metadata(filename=".upload-abc.part"),
        "filename not-base64!",
        "filename " + base64.b64encode(b"\xff\xfe").decode(),
        encode_metadata(filename="a.txt") + "," + encode_metadata(filename="b.txt"),
        encode_metadata(filename="a.txt", on_conflict="overwrite"),
    ],
)
def test_bad_or_missing_filename_is_400_at_creation(
    tus: TusActions, base_dir: Path, metadata: str | None
) -> None:
    response = tus.create("t1", 10, metadata)
    assert response.status_code == 400
    assert isinstance(response.get_json()["detail"], str)
    assert not uploads_dir(base_dir, "t1").exists()


@pytest.mark.parametrize("length", [None, "", "-1", "1.5", "ten", "１０"])
def test_missing_or_bad_upload_length_is_400(
    client: FlaskClient, base_dir: Path, length: str | None
) -> None:
    headers = {**TUS, "Upload-Metadata": encode_metadata(filename="a.txt")}
    if length is not None:
        headers["Upload-Length"] = length
    response = client.post("/api/threads/t1/uploads/tus", headers=headers)
    assert response.status_code == 400
    assert not uploads_dir(base_dir, "t1").exists()


def test_deferred_length_is_refused(client: FlaskClient) -> None:
    headers = {**TUS, "Upload-Defer-Length": "1", "Upload-Metadata": encode_metadata(filename="a")}
    assert client.post("/api/threads/t1/uploads/tus", headers=headers).status_code == 400


@pytest.mark.parametrize("offset", [None, "", "-5", "abc"])
def test_missing_or_bad_upload_offset_is_400(tus: TusActions, offset: str | None) -> None:
    url = tus.start("t1", len(DATA))
    headers = {**TUS, "Content-Type": CHUNK_TYPE}
    if offset is not None:
        headers["Upload-Offset"] = offset
    assert tus._client.patch(url, data=b"abc", headers=headers).status_code == 400
    assert tus.offset(url) == 0


def test_invalid_thread_id_is_422(tus: TusActions, client: FlaskClient) -> None:
    response = tus.create("bad id!", 10, encode_metadata(filename="a.txt"))
    assert response.status_code == 422
    assert client.options("/api/threads/bad%20id!/uploads/tus").status_code == 422


@pytest.mark.parametrize("upload_id", ["0" * 32, "nothex", "../../x", "A" * 32, "0" * 31])
def test_unknown_upload_is_404(tus: TusActions, upload_id: str) -> None:
    url = f"/api/threads/t1/uploads/tus/{upload_id}"
    assert tus.head(url).status_code == 404
    assert tus.patch(url, 0, b"x").status_code == 404
    assert tus.delete(url).status_code == 404


def test_another_threads_upload_url_is_404(tus: TusActions) -> None:
    url = tus.start("t1", len(DATA))
    other = url.replace("/threads/t1/", "/threads/t2/")
    assert tus.head(other).status_code == 404
    assert tus.patch(other, 0, DATA[:10]).status_code == 404
    assert tus.delete(other).status_code == 404
    assert tus.offset(url) == 0


def test_expired_upload_is_410_then_gone(app: Flask, tus: TusActions, base_dir: Path) -> None:
    url = tus.start("t1", len(DATA))
    assert tus.patch(url, 0, DATA[:100]).status_code == 204
    later = time.time() + 25 * 3600
    service(app)._clock = lambda: later
    head = tus.head(url)
    assert head.status_code == 410
    assert head.headers["Tus-Resumable"] == "1.0.0"
    assert staging_files(base_dir, "t1") == []
    assert tus.patch(url, 100, DATA[100:200]).status_code == 404
    assert tus.head(url).status_code == 404


def test_expired_patch_is_410(app: Flask, tus: TusActions) -> None:
    url = tus.start("t1", len(DATA))
    later = time.time() + 25 * 3600
    service(app)._clock = lambda: later
    response = tus.patch(url, 0, DATA[:100])
    assert response.status_code == 410
    assert response.get_json() == {"detail": "Upload expired"}


def test_expiry_hours_come_from_the_config(make_app: Any) -> None:
    app = make_app(uploads={"resumable_expiry_hours": 2})
    response = TusActions(app.test_client()).create("t1", 10, encode_metadata(filename="a"))
    expires = response.headers["Upload-Expires"]
    from email.utils import parsedate_to_datetime

    left = parsedate_to_datetime(expires).timestamp() - time.time()
    assert 7100 < left <= 7200


def test_each_chunk_moves_the_expiry_on(app: Flask, tus: TusActions) -> None:
    url = tus.start("t1", len(DATA))
    later = time.time() + 20 * 3600
    service(app)._clock = lambda: later
    assert tus.patch(url, 0, DATA[:100]).status_code == 204
    service(app)._clock = lambda: later + 20 * 3600
    assert tus.offset(url) == 100


def test_start_up_sweeps_expired_uploads_and_keeps_live_ones(make_app: Any, base_dir: Path) -> None:
    app = make_app()
    tus = TusActions(app.test_client())
    live = tus.start("t1", len(DATA), filename="live.bin")
    old = tus.start("t1", len(DATA), filename="old.bin")
    tus.patch(live, 0, DATA[:10])
    store = service(app).store
    upload_id = old.rsplit("/", 1)[1]
    store.update(upload_id, offset=0, pending_from=None, expires_at=time.time() - 1)
    assert len(staging_files(base_dir, "t1")) == 2

    restarted = TusActions(make_app().test_client())  # a new process starting up
    assert len(staging_files(base_dir, "t1")) == 1
    assert restarted.offset(live) == 10
    assert restarted.head(old).status_code == 404


def test_creation_sweeps_expired_uploads(app: Flask, tus: TusActions, base_dir: Path) -> None:
    old = tus.start("t1", len(DATA), filename="old.bin")
    service(app).store.update(
        old.rsplit("/", 1)[1], offset=0, pending_from=None, expires_at=time.time() - 1
    )
    tus.start("t1", len(DATA), filename="new.bin")
    assert len(staging_files(base_dir, "t1")) == 1


def test_cross_site_browser_requests_are_refused(tus: TusActions, base_dir: Path) -> None:
    response = tus.create(
        "t1", 10, encode_metadata(filename="a.txt"), Origin="https://evil.example"
    )
    assert response.status_code == 403
    assert not uploads_dir(base_dir, "t1").exists()


@pytest.mark.local_disk  # on S3 the bytes are in the bucket: a local file is only a copy
def test_staging_file_removed_behind_the_apps_back_is_404(tus: TusActions, base_dir: Path) -> None:
    url = tus.start("t1", len(DATA))
    staging_files(base_dir, "t1")[0].unlink()
    assert tus.head(url).status_code == 404
    assert tus.patch(url, 0, DATA[:10]).status_code == 404


def test_any_process_may_take_the_next_chunk(make_app: Any, base_dir: Path) -> None:
    """Two app instances over one data dir stand for two server processes: the state is
    in the database, and the commit hashes the bytes on disk when it saw only some go by."""
    body = b"%PDF-1.4\n" + DATA
    first = TusActions(make_app().test_client())
    second = TusActions(make_app().test_client())
    url = first.start("t1", len(body), filename="doc.pdf")
    assert first.patch(url, 0, body[:100_000]).status_code == 204
    assert second.offset(url) == 100_000
    assert second.patch(url, 100_000, body[100_000:200_000]).status_code == 204
    assert first.patch(url, 200_000, body[200_000:]).status_code == 204
    listing = UploadActions(second._client).list("t1")["files"]
    assert [(f["filename"], f["sha256"], f["content_type"]) for f in listing] == [
        ("doc.pdf", hashlib.sha256(body).hexdigest(), "application/pdf")
    ]


def test_sha256_is_right_after_a_discarded_chunk(tus: TusActions, uploads: UploadActions) -> None:
    url = tus.start("t1", len(DATA))
    assert tus.patch(url, 0, DATA[:1000]).status_code == 204
    wrong = "sha1 " + b64digest("sha1", b"other")
    assert tus.patch(url, 1000, DATA[1000:9000], checksum=wrong).status_code == 460
    assert tus.patch(url, 1000, DATA[1000:]).status_code == 204
    assert uploads.list("t1")["files"][0]["sha256"] == hashlib.sha256(DATA).hexdigest()


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/threads/t1/uploads/tus"), ("PUT", "/api/threads/t1/uploads/tus/" + "0" * 32)],
)
def test_unsupported_methods_are_405_and_still_speak_tus(
    client: FlaskClient, method: str, path: str
) -> None:
    response = client.open(path, method=method, headers=TUS)
    assert response.status_code == 405
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert response.get_json() == {"detail": "Method Not Allowed"}


def test_other_api_routes_do_not_speak_tus(client: FlaskClient) -> None:
    assert "Tus-Resumable" not in client.get("/api/threads/t1/uploads/list").headers


def test_a_link_that_took_the_name_meanwhile_is_never_written_through(
    tus: TusActions, base_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me")
    url = tus.start("t1", 3, filename="a.txt")
    (uploads_dir(base_dir, "t1") / "a.txt").symlink_to(outside)
    response = tus.patch(url, 0, b"new")
    assert response.status_code == 400
    assert "cannot be stored" in response.get_json()["detail"]
    assert outside.read_bytes() == b"keep me"
    assert (uploads_dir(base_dir, "t1") / "a.txt").is_symlink()
    assert staging_files(base_dir, "t1") == []
    assert tus.head(url).status_code == 404


def test_tus_clients_need_no_form_token(make_app: Any) -> None:
    """Like the rest of the API, tus resists cross-site requests by origin, not by token."""
    tus = TusActions(make_app(WTF_CSRF_ENABLED=True).test_client())
    url = tus.start("t1", 3, filename="a.txt")
    assert tus.patch(url, 0, b"abc").status_code == 204


def capped(make_app: Any, **caps: int) -> tuple[Flask, TusActions]:
    app = make_app(uploads={f"resumable_{key}": value for key, value in caps.items()})
    return app, TusActions(app.test_client())


def test_pending_uploads_are_capped_per_user_by_count(make_app: Any, base_dir: Path) -> None:
    app, tus = capped(make_app, max_pending=2)
    first = tus.start("t1", 100)
    tus.start("t2", 100)  # the cap counts the user's uploads in every thread
    refused = tus.create("t1", 100, encode_metadata(filename="c.bin"))
    assert refused.status_code == 429
    assert "uploads.resumable_max_pending" in refused.get_json()["detail"]
    assert refused.headers["Tus-Resumable"] == "1.0.0"
    assert len(staging_files(base_dir, "t1")) == 1  # nothing staged for the refused one

    assert tus.delete(first).status_code == 204  # a cancelled one frees its place
    finished = tus.start("t1", 3, filename="done.txt")
    assert tus.patch(finished, 0, b"abc").status_code == 204  # and so does a finished one
    assert tus.create("t1", 100, encode_metadata(filename="c.bin")).status_code == 201


def test_pending_uploads_are_capped_per_user_by_declared_bytes(
    make_app: Any, base_dir: Path
) -> None:
    app, tus = capped(make_app, max_pending_bytes=1000)
    tus.start("t1", 600)
    refused = tus.create("t1", 401, encode_metadata(filename="c.bin"))
    assert refused.status_code == 429
    assert "uploads.resumable_max_pending_bytes" in refused.get_json()["detail"]
    assert len(staging_files(base_dir, "t1")) == 1
    assert tus.create("t1", 400, encode_metadata(filename="c.bin")).status_code == 201


def test_expired_pending_uploads_do_not_count(make_app: Any) -> None:
    app, tus = capped(make_app, max_pending=1)
    tus.start("t1", 100)
    service = app.extensions[EXTENSION_KEY].resumable
    now = time.time()
    service._clock = lambda: now + service.expiry_seconds + 1  # a day later
    assert tus.create("t1", 100, encode_metadata(filename="c.bin")).status_code == 201


@pytest.mark.skipif(USER_ID is None, reason="accounts are off: one user holds every upload")
def test_one_users_pending_uploads_do_not_count_against_another(make_app: Any) -> None:
    app, tus = capped(make_app, max_pending=1)
    tus.start("t1", 100)
    accounts = app.extensions[EXTENSION_KEY].accounts
    other = accounts.create_user("other@example.com", "another test password").id
    theirs = TusActions(app.test_client(user_id=other))
    assert theirs.create("theirs", 100, encode_metadata(filename="c.bin")).status_code == 201
    assert tus.create("t9", 100, encode_metadata(filename="c.bin")).status_code == 429


@pytest.mark.parametrize(
    "value",
    ["9" * 5000, "0" * 5000 + "7", "9" * 20, str(2**63)],
    ids=["5000", "zeros", "20", "2^63"],
)
def test_a_huge_number_in_a_tus_header_is_400(tus: TusActions, base_dir: Path, value: str) -> None:
    created = tus.create("t1", 0, encode_metadata(filename="a.bin"), **{"Upload-Length": value})
    if value.lstrip("0") == "7":
        assert created.status_code == 201  # leading zeros are still a number
    else:
        assert created.status_code == 400
        assert "Upload-Length is too large" in created.get_json()["detail"]
    url = tus.start("t1", 10)
    patched = tus.patch(url, 0, b"x", **{"Upload-Offset": value})
    assert patched.status_code in (400, 409)
    assert "detail" in patched.get_json()
    if value.lstrip("0") != "7":
        assert "Upload-Offset is too large" in patched.get_json()["detail"]
    assert tus.offset(url) == 0  # nothing written
