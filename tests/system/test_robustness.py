"""Failures mid-request, restarts, concurrent writers and cross-site callers (issue 2)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.storage.local import StagingFile
from deerflow_web.storage.local import sweep_staging_files
from deerflow_web.storage.paths import ThreadPaths
from tests.helpers import UploadActions
from tests.helpers import auth_header_line
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.live_server import raw_request
from tests.support.live_server import start_server

ROOT = Path(__file__).resolve().parents[2]
HOST = "Host: 127.0.0.1\r\n" + auth_header_line()  # raw requests carry the test user's token


def test_sweep_removes_only_stale_staging_files(base_dir: Path) -> None:
    def make(relative: str) -> Path:
        path = base_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        return path

    stale = [
        make("threads/t/user-data/uploads/.upload-old.part"),
        make("users/o/threads/t2/user-data/uploads/.upload-new.part"),
    ]
    kept = [
        make("misc/x/user-data/uploads/.upload-ignore.part"),
        make("threads/t/user-data/uploads/.env"),
        make("threads/t/user-data/uploads/.upload-note.txt"),
        make("threads/t/user-data/uploads/draft.part"),
    ]
    live = StagingFile(base_dir / "threads/t/user-data/uploads")  # an upload in progress
    try:
        assert sweep_staging_files(ThreadPaths(base_dir).iter_uploads_dirs()) == 2
        assert not any(path.exists() for path in stale)
        assert all(path.exists() for path in kept)
        assert live.path.exists()
    finally:
        live.discard()


def test_app_start_sweeps(base_dir: Path, make_app) -> None:
    leftover = uploads_dir(base_dir, "t") / ".upload-dead.part"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("half")
    make_app()
    assert not leftover.exists()


def test_disk_full_mid_write(
    uploads: UploadActions, base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploads.upload("T", (b"old bytes", "a.txt"))
    real_write = StagingFile.write

    def full_disk(self: StagingFile, data: bytes, **options: Any) -> None:
        real_write(self, data[:1], **options)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StagingFile, "write", full_disk)
    response = uploads.upload("T", (b"new bytes", "a.txt"), (b"more", "b.txt"))
    assert response.status_code == 507
    assert "disk space" in response.get_json()["detail"]
    folder = uploads_dir(base_dir, "T")
    assert os.listdir(folder) == ["a.txt"]
    assert (folder / "a.txt").read_bytes() == b"old bytes"
    monkeypatch.setattr(StagingFile, "write", real_write)
    assert uploads.upload("T", (b"fine", "c.txt")).status_code == 200


def test_io_error_mid_write_is_a_500_naming_the_file(
    uploads: UploadActions, base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: StagingFile, data: bytes, **options: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(StagingFile, "write", broken)
    response = uploads.upload("T", (b"x", "a.txt"))
    assert response.status_code == 500
    assert response.get_json()["detail"].startswith("Failed to upload a.txt:")
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or os.listdir(folder) == []


def test_client_disconnect_mid_upload(client, base_dir: Path) -> None:
    head = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\n'
        + b"x" * 5000
    )
    response = client.post(  # the client promised more bytes than it sent
        "/api/threads/T/uploads",
        input_stream=io.BytesIO(head),
        content_type="multipart/form-data; boundary=XYZ",
        environ_overrides={"CONTENT_LENGTH": str(len(head) + 10000)},
    )
    assert response.status_code == 400
    assert response.get_json()["detail"]
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or os.listdir(folder) == []


def http(port: int, method: str, path: str) -> bytes:
    return raw_request(port, method, path, auth_header_line())


def test_server_killed_mid_upload(base_dir: Path) -> None:
    server = start_server(base_dir)
    port = server.port
    folder = uploads_dir(base_dir, "T")
    try:
        head = b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="big.bin"\r\n\r\n'
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            f"POST /api/threads/T/uploads HTTP/1.1\r\n{HOST}".encode()
            + b"Content-Type: multipart/form-data; boundary=XYZ\r\n"
            b"Content-Length: 100000000\r\n\r\n" + head + b"y" * 3_000_000
        )
        wait_until(lambda: folder.exists() and os.listdir(folder))
        assert [name.startswith(".upload-") for name in os.listdir(folder)] == [True]
        server.kill()
        sock.close()
        server.start()
        listing = http(port, "GET", "/api/threads/T/uploads/list")
        assert listing.endswith(b'{"files":[],"count":0}\n')
        assert os.listdir(folder) == []  # swept at start-up
        assert b"404" in http(port, "GET", "/api/threads/T/artifacts/mnt/user-data/uploads/big.bin")
    finally:
        server.kill()


def read_response(sock: socket.socket, pending: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length from a kept-alive connection.

    `pending` holds what was received past the previous response.
    """
    while b"\r\n\r\n" not in pending:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        pending += data
    head, _, _ = bytes(pending).partition(b"\r\n\r\n")
    del pending[: len(head) + 4]
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(pending) < length:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        pending += data
    body = bytes(pending[:length])
    del pending[:length]
    return int(lines[0].split()[1]), body


def upload_request(name: str, data: bytes, chunked: bool = False) -> bytes:
    body = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="'
        + name.encode()
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
        + data
        + b"\r\n--XYZ--\r\n"
    )
    head = (
        f"POST /api/threads/T/uploads HTTP/1.1\r\n{HOST}"
        "Content-Type: multipart/form-data; boundary=XYZ\r\n"
    )
    if not chunked:
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    pieces = [body[i : i + 70_000] for i in range(0, len(body), 70_000)]
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + encoded + b"0\r\n\r\n"


LIST_REQUEST = f"GET /api/threads/T/uploads/list HTTP/1.1\r\n{HOST}\r\n".encode()


def test_keep_alive_connection_after_uploads_under_gunicorn(tmp_path: Path) -> None:
    """Bodies read straight from gunicorn's socket leave its connection state intact.

    Large, chunked, small and pipelined uploads on one connection, then an upload refused
    with 413 part-way through its body, whose unread rest gunicorn must skip to find the
    next request.
    """
    config = tmp_path / "config.yaml"
    config.write_text(f"uploads:\n  max_file_size: {3 * 2**20 // 2}\n", encoding="utf-8")
    base_dir = tmp_path / "home"
    server = start_server(base_dir, config)
    port = server.port
    big, small, chunked = os.urandom(1_300_000), b"small file", os.urandom(200_000)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            pending = bytearray()
            sock.sendall(upload_request("big.bin", big))
            assert read_response(sock, pending)[0] == 200
            sock.sendall(upload_request("chunked.bin", chunked, chunked=True))
            assert read_response(sock, pending)[0] == 200
            # Two requests in one send: the second starts inside gunicorn's read-ahead.
            sock.sendall(upload_request("small.txt", small) + LIST_REQUEST)
            assert read_response(sock, pending)[0] == 200
            status, listing = read_response(sock, pending)
            assert status == 200
            files = {f["filename"]: f for f in json.loads(listing)["files"]}
            assert files["big.bin"]["sha256"] == hashlib.sha256(big).hexdigest()
            assert files["small.txt"]["sha256"] == hashlib.sha256(small).hexdigest()
            assert files["chunked.bin"]["sha256"] == hashlib.sha256(chunked).hexdigest()
            # Over the limit after the second MiB: 413 with ~10 KiB of the body unread.
            sock.sendall(upload_request("huge.bin", os.urandom(2 * 2**20 + 10_000)))
            status, answer = read_response(sock, pending)
            assert status == 413 and json.loads(answer)["detail"]
            sock.sendall(LIST_REQUEST)
            status, listing = read_response(sock, pending)
            assert status == 200
            names = sorted(f["filename"] for f in json.loads(listing)["files"])
            assert names == ["big.bin", "chunked.bin", "small.txt"]
        assert sorted(os.listdir(uploads_dir(base_dir, "T"))) == names
    finally:
        server.kill()


def test_client_gone_mid_upload_under_gunicorn_leaves_nothing(base_dir: Path) -> None:
    """The body read straight from gunicorn's socket ends early: no file, server still up."""
    server = start_server(base_dir)
    port = server.port
    folder = uploads_dir(base_dir, "T")
    try:
        request = upload_request("cut.bin", os.urandom(3_000_000))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request[: len(request) // 2])
            wait_until(lambda: folder.exists() and os.listdir(folder), interval=0.02)
            assert [name.startswith(".upload-") for name in os.listdir(folder)] == [True]
        wait_until(lambda: not folder.exists() or os.listdir(folder) == [], interval=0.02)
        assert http(port, "GET", "/api/threads/T/uploads/list").endswith(
            b'{"files":[],"count":0}\n'
        )
    finally:
        server.kill()


WRITER = textwrap.dedent(
    """
    import io, sys
    from pathlib import Path
    from deerflow_web.models import IncomingFile, ThreadRef
    from deerflow_web.services.uploads.service import make_upload_service

    service = make_upload_service(Path(sys.argv[1]))
    thread = ThreadRef.single_user("T")
    for i in range(40):
        body = (sys.argv[2] * 1000 + str(i)).encode()
        service.save_uploads(thread, [IncomingFile("same.txt", io.BytesIO(body))])
    """
)


def test_concurrent_processes_writing_one_name(base_dir: Path) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(base_dir), letter], cwd=ROOT)
        for letter in "ABC"
    ]
    assert [w.wait(timeout=60) for w in writers] == [0, 0, 0]
    from deerflow_web.services.uploads.service import make_upload_service

    service = make_upload_service(base_dir)
    [record] = service.list_uploads(ThreadRef.single_user("T"))
    data = (uploads_dir(base_dir, "T", None) / "same.txt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == record.sha256
    assert record.source.value == "upload"  # the record was written with the bytes
    assert len(data) == record.size and data[:1] in (b"A", b"B", b"C")
    assert os.listdir(uploads_dir(base_dir, "T", None)) == ["same.txt"]


def test_api_refuses_cross_site_browser_requests(make_app, tmp_path: Path) -> None:
    client = make_app().test_client()
    actions = UploadActions(client)
    data = {"files": [(io.BytesIO(b"x"), "a.txt")]}
    evil = client.post(
        "/api/threads/T/uploads", data=data, headers={"Origin": "http://evil.example"}
    )
    assert evil.status_code == 403
    assert "Cross-site" in evil.get_json()["detail"]
    fetch = client.delete("/api/threads/T/uploads/a.txt", headers={"Sec-Fetch-Site": "cross-site"})
    assert fetch.status_code == 403
    assert actions.names("T") == []
    assert actions.upload("T", (b"x", "a.txt")).status_code == 200  # curl: no browser headers
    same = client.post(
        "/api/threads/T/uploads",
        data={"files": [(io.BytesIO(b"y"), "b.txt")]},
        headers={"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
    )
    assert same.status_code == 200
    read = client.get("/api/threads/T/uploads/list", headers={"Origin": "http://evil.example"})
    assert read.status_code == 200


def test_allowed_origins_from_config(base_dir: Path, tmp_path: Path, make_app) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"server": {"allowed_origins": ["http://ui.example:3000"]}}))
    client = make_app(CONFIG_PATH=str(path)).test_client()
    response = client.post(
        "/api/threads/T/uploads",
        data={"files": [(io.BytesIO(b"x"), "a.txt")]},
        headers={"Origin": "http://ui.example:3000"},
    )
    assert response.status_code == 200
    assert (uploads_dir(base_dir, "T") / "a.txt").read_bytes() == b"x"


def test_records_cache_sees_writes_of_other_processes(base_dir: Path) -> None:
    from deerflow_web.services.uploads.service import make_upload_service

    service = make_upload_service(base_dir)
    assert service.list_uploads(ThreadRef.single_user("T")) == []
    writer = subprocess.run(
        [sys.executable, "-c", WRITER.replace("range(40)", "range(1)"), str(base_dir), "Z"],
        cwd=ROOT,
    )
    assert writer.returncode == 0
    [record] = service.records.all(service.paths.scope(ThreadRef.single_user("T")))
    assert record.record.filename == "same.txt"


def test_records_cache_never_keeps_a_rolled_back_write(base_dir: Path) -> None:
    from deerflow_web.services.uploads.service import make_upload_service

    service = make_upload_service(base_dir)
    scope = service.paths.scope(ThreadRef.single_user("T"))
    service.save_uploads(ThreadRef.single_user("T"), [IncomingFile("a.txt", io.BytesIO(b"a"))])
    [stored] = service.records.all(scope)
    with pytest.raises(RuntimeError), service.records.locked(scope) as txn:
        txn.delete("a.txt")
        assert service.records.all(scope) == []  # this connection sees its own change
        raise RuntimeError("roll back")
    assert service.records.all(scope) == [stored]


def test_every_worker_gets_the_same_complete_secret_key(base_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from deerflow_web.web.wiring import persistent_secret_key

    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: persistent_secret_key(base_dir), range(32)))
    [key] = keys
    assert len(key) == 64
    assert (base_dir / "secret_key").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in base_dir.iterdir()) == ["secret_key"]


def test_a_configured_secret_key_is_used_and_none_is_generated(
    make_app: Any, base_dir: Path
) -> None:
    """Instances on different volumes agree through `server.secret_key` / SECRET_KEY."""
    app = make_app(server={"secret_key": "one key for every instance"})
    assert app.config["SECRET_KEY"] == "one key for every instance"
    assert not (base_dir / "secret_key").exists()
