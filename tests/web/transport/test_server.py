"""`make run`'s server under faults: real gunicorn processes with the gevent worker.

Each test starts gunicorn the way `make run` does (web/transport/server.py's worker) on a free port,
with a short `server.idle_timeout_seconds`, and plays a misbehaving client against it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import uploads_dir
from tests.support.documents import make_docx
from tests.support.live_server import LiveServer
from tests.support.live_server import raw_request

# Every server here is single-user whatever the pass (`gunicorn` below), and nothing in
# this process reads the mode: the single-user pass would run the very same tests again.
pytestmark = pytest.mark.same_in_both_modes

IDLE_SECONDS = 1.0


def request(port: int, method: str, path: str, body: bytes = b"", timeout: float = 30) -> bytes:
    """One request on its own connection; the whole raw response."""
    return raw_request(port, method, path, body=body, timeout=timeout)


def json_body(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


@contextlib.contextmanager
def gunicorn(
    base_dir: Path, tmp_path: Path, server_keys: dict | None = None, **uploads: object
) -> Iterator[int]:
    """`make run`'s server with one worker, stopped and reaped at the end.

    The server mechanics are the same with accounts on; these raw clients sign in as no one.
    """
    config = tmp_path / "config.yaml"
    server_keys = {"idle_timeout_seconds": IDLE_SECONDS, **(server_keys or {})}
    config.write_text(yaml.safe_dump({"server": server_keys, "uploads": uploads}))
    server = LiveServer(base_dir, config=config, single_user=True, worker_connections=2000)
    with server.start():
        yield server.port


@pytest.fixture(autouse=True)
def _many_files() -> None:
    """Room for a thousand client sockets in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or hard == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))


def upload_head(thread_id: str, name: str, size: int) -> tuple[bytes, bytes]:
    """Request head and part head of a one-file upload whose data is `size` bytes."""
    part = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="'
        + name.encode()
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
    )
    tail = b"\r\n--XYZ--\r\n"
    head = (
        f"POST /api/threads/{thread_id}/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: multipart/form-data; boundary=XYZ\r\n"
        f"Content-Length: {len(part) + size + len(tail)}\r\n\r\n"
    ).encode()
    return head + part, tail


def staging_files(folder: Path) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(".upload-")] if folder.exists() else []


def wait_for(condition, seconds: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_thousand_silent_connections_do_not_stop_others(base_dir: Path, tmp_path: Path) -> None:
    # All from one loopback address: without its cap (tests/system/test_slow_clients.py has that).
    with gunicorn(base_dir, tmp_path, {"max_connections_per_address": 0}) as port:
        silent = []
        try:
            for _ in range(1000):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
                silent.append(sock)
            response = request(port, "GET", "/api/threads/T/uploads/list", timeout=10)
            assert response.startswith(b"HTTP/1.1 200")
            assert json_body(response) == {"files": [], "count": 0}
            assert request(port, "GET", "/healthz", timeout=10).startswith(b"HTTP/1.1 200")
        finally:
            for sock in silent:
                sock.close()


def test_health_endpoints_under_gunicorn(base_dir: Path, tmp_path: Path) -> None:
    with gunicorn(base_dir, tmp_path) as port:
        assert json_body(request(port, "GET", "/healthz")) == {"status": "ok"}
        ready = request(port, "GET", "/readyz")
        assert ready.startswith(b"HTTP/1.1 200")
        assert json_body(ready) == {
            "status": "ok",
            "database": "ok",
            "storage": "ok",
            "bucket": "off",
            "scanner": "off",
            "jobs": "on",
        }


def test_a_stalled_upload_is_cut_and_its_staging_file_removed(
    base_dir: Path, tmp_path: Path
) -> None:
    folder = uploads_dir(base_dir, "T", None)
    with gunicorn(base_dir, tmp_path) as port:
        head, _tail = upload_head("T", "slow.bin", 1_000_000)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head + b"x" * 200_000)  # then nothing more, connection kept open
            assert wait_for(lambda: staging_files(folder), 10), "the upload never started"
            started = time.monotonic()
            answer = b"".join(iter(lambda: sock.recv(65536), b""))  # until the server closes
            waited = time.monotonic() - started
        assert waited < IDLE_SECONDS + 10
        if answer:  # the server may still get its 408 out before closing
            assert answer.startswith(b"HTTP/1.1 408")
        assert wait_for(lambda: not staging_files(folder), 10), staging_files(folder)
        assert not (folder / "slow.bin").exists()
        # the server is fine afterwards
        assert request(port, "GET", "/api/threads/T/uploads/list").startswith(b"HTTP/1.1 200")


def test_an_upload_that_keeps_sending_slowly_is_not_cut(base_dir: Path, tmp_path: Path) -> None:
    """The timeout is on silence, not on the whole request: a slow but steady client wins."""
    with gunicorn(base_dir, tmp_path) as port:
        size = 40_000
        head, tail = upload_head("T", "steady.bin", size)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head)
            for _ in range(8):  # 8 x 0.4 s: longer than the idle timeout in total
                sock.sendall(b"s" * (size // 8))
                time.sleep(IDLE_SECONDS * 0.4)
            sock.sendall(tail)
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert (uploads_dir(base_dir, "T", None) / "steady.bin").read_bytes() == b"s" * size


def test_a_client_that_stops_reading_a_download_is_dropped(base_dir: Path, tmp_path: Path) -> None:
    size = 64 * 1024 * 1024  # far more than the socket buffers on both sides hold
    folder = uploads_dir(base_dir, "T", None)
    folder.mkdir(parents=True)
    with open(folder / "big.bin", "wb") as handle:
        handle.truncate(size)
    with gunicorn(base_dir, tmp_path) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", port))
        with sock:
            sock.sendall(
                b"GET /api/threads/T/artifacts/mnt/user-data/uploads/big.bin HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\n\r\n"
            )
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            time.sleep(IDLE_SECONDS + 3)  # read nothing: the server's sendfile waits, then gives up
            received = len(first)
            while chunk := sock.recv(1 << 20):  # what was in flight, then the end
                received += len(chunk)
        assert received < size
        # the same download read normally arrives whole (sendfile through the gevent socket)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as other:
            other.sendall(
                b"GET /api/threads/T/artifacts/mnt/user-data/uploads/big.bin HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            total = sum(len(chunk) for chunk in iter(lambda: other.recv(1 << 20), b""))
        assert total > size  # headers + every byte of the file


def test_conversion_jobs_and_their_waits_under_the_gevent_worker(
    base_dir: Path, tmp_path: Path
) -> None:
    """A job runs on the worker's pool with a child process; the request's wait is
    cooperative, so other requests are answered while it converts."""
    document = make_docx(tmp_path / "notes.docx", title="Quarterly notes")
    with gunicorn(base_dir, tmp_path, conversion_wait_seconds=0.2) as port:
        head, tail = upload_head("T", "notes.docx", document.stat().st_size)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(head + document.read_bytes() + tail)
            assert b"".join(iter(lambda: sock.recv(65536), b"")).startswith(b"HTTP/1.1 200")
        answer = request(port, "POST", "/api/threads/T/uploads/notes.docx/convert")
        assert answer.split(b" ", 2)[1] in (b"200", b"202"), answer[:300]
        assert request(port, "GET", "/healthz", timeout=5).startswith(b"HTTP/1.1 200")

        def converted() -> bool:
            files = json_body(request(port, "GET", "/api/threads/T/uploads/list"))["files"]
            states = {f["filename"]: f["conversion_state"] for f in files}
            assert states.get("notes.docx") != "failed", files
            return "notes.md" in states

        assert wait_for(converted, 240)
    markdown = (uploads_dir(base_dir, "T", None) / "notes.md").read_text(encoding="utf-8")
    assert "Quarterly notes" in markdown
