"""Uploads scanned by a real clamd while they stream: refused, fail-closed, recorded."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import UploadActions
from tests.helpers import needs_auth
from tests.helpers import uploads_dir
from tests.support.clamd import EICAR
from tests.support.clamd import EICAR_SIGNATURE
from tests.support.clamd import Clamd
from tests.support.documents import make_docx
from tests.support.tus import TusActions


def scanning_app(make_app: Any, clamd: Clamd, **scanning: Any) -> Flask:
    return make_app(scanning={"clamd": clamd.address, "timeout_seconds": 3, **scanning})


def zip_holding(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


def stored(base_dir: Path, thread_id: str) -> list[str]:
    folder = uploads_dir(base_dir, thread_id)
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def events(app: Flask) -> list[Any]:
    return app.extensions[EXTENSION_KEY].scan_events.recent()


@pytest.fixture
def scanned(make_app: Any, clamd: Clamd) -> Flask:
    return scanning_app(make_app, clamd)


@pytest.fixture
def scanned_client(scanned: Flask) -> FlaskClient:
    return scanned.test_client()


def docx_holding_eicar(tmp_path: Path) -> bytes:
    path = tmp_path / "clean.docx"
    make_docx(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
        for item in source.infolist():
            target.writestr(item, source.read(item.filename))
        target.writestr("word/media/eicar.com", EICAR)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("eicar.com", lambda _: EICAR),
        ("bundle.zip", lambda _: zip_holding("inner/eicar.com", EICAR)),
        ("report.docx", docx_holding_eicar),
    ],
)
def test_infected_upload_is_refused_and_nothing_is_stored(
    scanned: Flask,
    scanned_client: FlaskClient,
    base_dir: Path,
    tmp_path: Path,
    name: str,
    make: Any,
) -> None:
    data = make(tmp_path)
    response = UploadActions(scanned_client).upload("t1", (data, name))
    assert response.status_code == 422
    body = response.get_json()
    assert body["success"] is False
    assert body["files"] == []
    assert body["rejected_files"][0]["filename"] == name
    assert EICAR_SIGNATURE in body["rejected_files"][0]["found"]
    assert EICAR_SIGNATURE in body["detail"]
    assert stored(base_dir, "t1") == []
    assert UploadActions(scanned_client).list("t1")["files"] == []
    (event,) = events(scanned)
    assert (event.kind, event.thread_id, event.filename) == ("refused", "t1", name)
    assert len(event.sha256 or "") == 64


def test_clean_files_of_the_same_request_are_stored_in_deerflows_shape(
    scanned_client: FlaskClient, base_dir: Path
) -> None:
    response = UploadActions(scanned_client).upload(
        "t1", (b"hello", "clean.txt"), (EICAR, "eicar.txt"), (b"more", "also.txt")
    )
    assert response.status_code == 200
    body = response.get_json()
    assert body["success"] is False
    assert [f["filename"] for f in body["files"]] == ["clean.txt", "also.txt"]
    assert all(f["scan_state"] == "clean" for f in body["files"])
    assert [r["filename"] for r in body["rejected_files"]] == ["eicar.txt"]
    assert stored(base_dir, "t1") == ["also.txt", "clean.txt"]
    listed = UploadActions(scanned_client).list("t1")["files"]
    assert {f["filename"]: f["scan_state"] for f in listed} == {
        "also.txt": "clean",
        "clean.txt": "clean",
    }
    assert all(f["scan_signatures"] == "100" for f in listed)


def multipart_body(*files: tuple[bytes, str]) -> tuple[bytes, str]:
    """A multipart body built in memory (the test client would spool a large file)."""
    boundary = "scan-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
        for data, name in files
    ]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), boundary


def test_eicar_split_across_multipart_chunks_is_found(
    scanned_client: FlaskClient, base_dir: Path
) -> None:
    # A stored (uncompressed) zip member at an offset that puts the test file across the
    # reader's 1 MiB chunks: clamd sees the one stream, whatever the chunks.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("padding.bin", b"\0" * (1024 * 1024 - 60))
        archive.writestr("eicar.com", EICAR)
    body, boundary = multipart_body((buffer.getvalue(), "split.zip"), (b"fine", "ok.txt"))
    response = scanned_client.post(
        "/api/threads/t1/uploads",
        data=body,
        content_type=f"multipart/form-data; boundary={boundary}",
    )
    assert response.status_code == 200
    assert [r["filename"] for r in response.get_json()["rejected_files"]] == ["split.zip"]
    assert stored(base_dir, "t1") == ["ok.txt"]


def test_eicar_split_across_tus_patches_is_refused(
    scanned: Flask, scanned_client: FlaskClient, base_dir: Path
) -> None:
    tus = TusActions(scanned_client)
    url = tus.start("t1", len(EICAR), filename="eicar.com")
    assert tus.patch(url, 0, EICAR[:30]).status_code == 204
    response = tus.patch(url, 30, EICAR[30:])
    assert response.status_code == 422
    assert EICAR_SIGNATURE in response.get_json()["detail"]
    assert stored(base_dir, "t1") == []
    assert tus.head(url).status_code == 404
    assert events(scanned)[0].filename == "eicar.com"


def test_clean_tus_upload_is_recorded_clean(scanned_client: FlaskClient) -> None:
    tus = TusActions(scanned_client)
    data = b"clean bytes " * 1000
    url = tus.start("t1", len(data), filename="clean.bin")
    assert tus.patch(url, 0, data[:5000]).status_code == 204
    assert tus.patch(url, 5000, data[5000:]).status_code == 204
    (listed,) = UploadActions(scanned_client).list("t1")["files"]
    assert listed["scan_state"] == "clean"


def test_artifact_edit_with_eicar_is_refused(
    scanned: Flask, scanned_client: FlaskClient, base_dir: Path
) -> None:
    from tests.helpers import user_data_dir

    outputs = user_data_dir(base_dir, "t1") / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "notes.txt").write_text("hello", encoding="utf-8")
    import hashlib

    response = scanned_client.put(
        "/api/threads/t1/artifacts/mnt/user-data/outputs/notes.txt",
        json={"content": EICAR.decode(), "expected_sha256": hashlib.sha256(b"hello").hexdigest()},
    )
    assert response.status_code == 422
    assert EICAR_SIGNATURE in response.get_json()["detail"]
    assert (outputs / "notes.txt").read_text(encoding="utf-8") == "hello"


def test_scanner_down_refuses_with_503_and_stores_nothing(
    make_app: Any, make_clamd: Any, base_dir: Path
) -> None:
    clamd = make_clamd()
    app = scanning_app(make_app, clamd)
    clamd.stop()
    client = app.test_client()
    response = UploadActions(client).upload("t1", (b"hello", "clean.txt"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "30"
    assert "scanning is unavailable" in response.get_json()["detail"]
    assert stored(base_dir, "t1") == []


def test_scanner_down_with_accept_unscanned_stores_the_file_as_unscanned(
    make_app: Any, make_clamd: Any, base_dir: Path
) -> None:
    clamd = make_clamd()
    app = scanning_app(make_app, clamd, on_unavailable="accept_unscanned")
    clamd.stop()
    client = app.test_client()
    response = UploadActions(client).upload("t1", (b"hello", "clean.txt"))
    assert response.status_code == 200
    assert response.get_json()["files"][0]["scan_state"] == "unscanned"
    assert stored(base_dir, "t1") == ["clean.txt"]


def test_slow_scanner_times_out_and_refuses(make_app: Any, make_clamd: Any, base_dir: Path) -> None:
    clamd = make_clamd()
    app = scanning_app(make_app, clamd, timeout_seconds=1)
    client = app.test_client()
    clamd.pause()
    try:
        response = UploadActions(client).upload("t1", (b"hello" * 1000, "clean.txt"))
    finally:
        clamd.resume()
    assert response.status_code == 503
    assert stored(base_dir, "t1") == []


def test_over_the_stream_limit_is_refused_unless_accepted(
    make_app: Any, make_clamd: Any, base_dir: Path
) -> None:
    clamd = make_clamd(stream_max="100K")
    app = scanning_app(make_app, clamd)
    big = b"x" * (300 * 1024)  # the test client spools bodies over 500 KiB
    response = UploadActions(app.test_client()).upload("t1", (big, "big.bin"))
    assert response.status_code == 413
    assert "larger than the virus scanner accepts" in response.get_json()["detail"]
    assert stored(base_dir, "t1") == []


def test_over_the_stream_limit_accepted_unscanned(
    make_app: Any, make_clamd: Any, base_dir: Path
) -> None:
    clamd = make_clamd(stream_max="100K")
    app = scanning_app(make_app, clamd, on_too_large="accept_unscanned")
    big = b"x" * (300 * 1024)  # the test client spools bodies over 500 KiB
    response = UploadActions(app.test_client()).upload("t1", (big, "big.bin"))
    assert response.status_code == 200
    assert response.get_json()["files"][0]["scan_state"] == "unscanned"


def test_scanning_off_stores_files_without_a_state(uploads: UploadActions) -> None:
    response = uploads.upload("t1", (EICAR, "eicar.com"))
    assert response.status_code == 200
    assert response.get_json()["files"][0]["scan_state"] is None


def test_clean_100_mib_file_is_scanned_while_it_streams_and_stored(
    make_app: Any, clamd: Clamd, base_dir: Path
) -> None:
    size = 100 * 1024 * 1024
    app_limits = {"max_file_size": size, "max_total_size": size + 1024}
    app = make_app(uploads=app_limits, scanning={"clamd": clamd.address})
    data = bytes(range(256)) * (size // 256)
    body, boundary = multipart_body((data, "large.bin"))
    del data
    response = app.test_client().post(
        "/api/threads/t1/uploads",
        data=body,
        content_type=f"multipart/form-data; boundary={boundary}",
    )
    assert response.status_code == 200, response.get_json()
    (saved,) = response.get_json()["files"]
    assert (saved["size"], saved["scan_state"]) == (size, "clean")


# ------------------------------------------------------------------ readiness, pages, command


def test_readyz_reports_the_scanner(make_app: Any, make_clamd: Any, client: FlaskClient) -> None:
    assert client.get("/readyz").get_json()["scanner"] == "off"
    clamd = make_clamd()
    app = scanning_app(make_app, clamd)
    ready = app.test_client().get("/readyz")
    assert (ready.status_code, ready.get_json()["scanner"]) == (200, "ok")
    clamd.stop()
    down = app.test_client().get("/readyz")
    body = down.get_json()
    assert (down.status_code, body["status"], body["scanner"]) == (200, "degraded", "failed")
    assert "scanner" in body["detail"]


def test_rescan_command_and_the_owner_sees_what_was_quarantined(
    make_app: Any, make_clamd: Any, base_dir: Path
) -> None:
    clamd = make_clamd()
    app = scanning_app(make_app, clamd)
    client = app.test_client()
    later = b"bytes the first signatures do not know " * 3
    UploadActions(client).upload("t1", (later, "later.bin"), (b"fine", "fine.txt"))
    result = app.test_cli_runner().invoke(args=["files", "rescan"])
    assert result.exit_code == 0 and "scanned 0" in result.output  # nothing due yet
    clamd.add_signature("Later-Test-Signature", later)
    result = app.test_cli_runner().invoke(args=["files", "rescan"])
    assert result.exit_code == 0, result.output
    assert "quarantined 1" in result.output
    assert UploadActions(client).names("t1") == ["fine.txt"]
    page = client.get("/threads/t1").get_data(as_text=True)
    assert "later.bin" in page and "Later-Test-Signature" in page
    assert "scan-clean" in page  # fine.txt's badge


def test_rescan_command_with_scanning_off(app: Flask) -> None:
    result = app.test_cli_runner().invoke(args=["files", "rescan"])
    assert result.exit_code != 0 and "Scanning is off" in result.output


@needs_auth
def test_admin_page_lists_refused_uploads(scanned: Flask, scanned_client: FlaskClient) -> None:
    UploadActions(scanned_client).upload("t1", (EICAR, "bad.com"))
    page = scanned_client.get("/admin/refused-uploads")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "bad.com" in html and EICAR_SIGNATURE in html and "Refused at upload" in html


def test_thread_files_page_shows_the_scan_badge(
    scanned_client: FlaskClient,
) -> None:
    UploadActions(scanned_client).upload("t1", (b"ok", "ok.txt"))
    html = scanned_client.get("/threads/t1").get_data(as_text=True)
    assert 'class="badge scan-state scan-clean"' in html
