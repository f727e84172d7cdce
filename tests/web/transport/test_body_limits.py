"""Every byte of an upload body counts toward `max_total_size`, not only the file data.

Text fields, part headers and parts the app ignores are read too, so a body made of them
must be stopped at the same limit, early, and without holding what it sent in memory.
"""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import tracemalloc
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from deerflow_web.errors import TotalTooLarge
from deerflow_web.web.transport.multipart import FRAMING_ALLOWANCE
from deerflow_web.web.transport.multipart import MAX_FIELDS_TOTAL_BYTES
from deerflow_web.web.transport.multipart import READ_SIZE
from deerflow_web.web.transport.multipart import MultipartReader
from deerflow_web.web.transport.multipart import upload_body_limit
from deerflow_web.web.transport.request_body import WsgiBody
from tests.helpers import uploads_dir
from tests.support.live_server import RAW_HOST
from tests.support.live_server import http
from tests.support.live_server import read_response
from tests.support.live_server import start_server

MAX_TOTAL = 256 * 1024
FIELD = b"f" * 64_000  # just under the 64 KiB a single field may hold


class GeneratedBody(io.RawIOBase):
    """A multipart body produced as it is read, counting what the server took.

    `parts` fields of 64 KB (each its own name, or no name at all), then one small file;
    nothing is built in memory ahead of the reader.
    """

    def __init__(self, parts: int, named: bool = True) -> None:
        self.parts = parts
        self.named = named
        self.index = 0
        self.pending = b""
        self.consumed = 0

    def _next_piece(self) -> bytes:
        if self.index < self.parts:
            name = f'; name="field{self.index}"' if self.named else ""
            self.index += 1
            return f"--B\r\nContent-Disposition: form-data{name}\r\n\r\n".encode() + FIELD + b"\r\n"
        if self.index == self.parts:
            self.index += 1
            return (
                b'--B\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\n'
                b"file\r\n--B--\r\n"
            )
        return b""

    def size(self) -> int:
        name_bytes = sum(len(f'; name="field{i}"') for i in range(self.parts)) if self.named else 0
        field = len(b"--B\r\nContent-Disposition: form-data\r\n\r\n") + len(FIELD) + 2
        last = len(
            b'--B\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\n'
            b"file\r\n--B--\r\n"
        )
        return self.parts * field + name_bytes + last

    def readable(self) -> bool:
        return True

    def tell(self) -> int:  # the test client asks; the body has no position to give
        return 0

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while len(self.pending) < len(buffer):
            piece = self._next_piece()
            if not piece:
                break
            self.pending += piece
        count = min(len(buffer), len(self.pending))
        buffer[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        self.consumed += count
        return count


def post(client: FlaskClient, body: GeneratedBody, declared: int | None = None):
    return client.post(
        "/api/threads/T/uploads",
        input_stream=body,
        content_type="multipart/form-data; boundary=B",
        environ_overrides={"CONTENT_LENGTH": str(declared or body.size())},
    )


def test_the_limit_is_the_file_limit_plus_the_framing_allowance() -> None:
    assert upload_body_limit(1000) == 1000 + FRAMING_ALLOWANCE
    assert upload_body_limit(1000, 500) == 500


@pytest.mark.parametrize("named", [True, False], ids=["fields", "nameless-parts"])
def test_a_declared_body_of_fields_past_the_limit_is_refused_unread(
    make_app, base_dir: Path, named: bool
) -> None:
    """The probe's body, scaled down: about 20 times the limit in 64 KB parts and one file,
    which the old backstop (`max_total_size` + 16 MiB) let through."""
    client = make_app(uploads={"max_total_size": MAX_TOTAL}).test_client()
    body = GeneratedBody(parts=80, named=named)
    assert upload_body_limit(MAX_TOTAL) < body.size() < MAX_TOTAL + 16 * 1024 * 1024
    tracemalloc.start()
    try:
        response = post(client, body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413
    assert response.get_json() == {"detail": "Total upload size too large"}
    assert body.consumed == 0
    assert peak < 4 * 1024 * 1024
    folder = uploads_dir(base_dir, "T")
    assert not folder.exists() or os.listdir(folder) == []


def test_a_declared_length_past_the_body_limit_is_refused_unread(make_app) -> None:
    client = make_app(uploads={"max_total_size": MAX_TOTAL}).test_client()
    body = GeneratedBody(parts=1)
    response = post(client, body, declared=MAX_TOTAL + FRAMING_ALLOWANCE + 1)
    assert response.status_code == 413
    assert body.consumed == 0


def test_a_few_small_fields_still_work(make_app, base_dir: Path) -> None:
    client = make_app(uploads={"max_total_size": MAX_TOTAL}).test_client()
    response = post(client, GeneratedBody(parts=3))
    assert response.status_code == 200, response.get_json()
    assert os.listdir(uploads_dir(base_dir, "T")) == ["a.txt"]


def test_fields_together_past_their_cap_are_refused() -> None:
    parts = MAX_FIELDS_TOTAL_BYTES // len(FIELD) + 1
    reader = MultipartReader(WsgiBody(io.BufferedReader(GeneratedBody(parts)), None), b"B")
    with pytest.raises(TotalTooLarge):
        list(reader)
    assert sum(len(v) for v in reader.fields.values()) <= MAX_FIELDS_TOTAL_BYTES


@pytest.mark.parametrize("named", [True, False])
def test_a_chunked_body_is_counted_too(named: bool) -> None:
    """Without a declared length only the count while reading can stop it."""
    body = GeneratedBody(parts=100, named=named)
    limit = MAX_TOTAL + FRAMING_ALLOWANCE
    reader = MultipartReader(WsgiBody(io.BufferedReader(body), None), b"B", max_length=limit)
    with pytest.raises(TotalTooLarge):
        for part in reader:
            while part.stream.read():
                pass
    assert body.consumed <= limit + 2 * READ_SIZE


def _worker_rss(master_pid: int) -> int:
    """Resident memory of the gunicorn worker (the master's one child), in bytes."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    status = Path(f"/proc/{children[0]}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.parametrize("named", [True, False], ids=["fields", "nameless-parts"])
def test_a_chunked_body_of_fields_is_cut_short_under_gunicorn(tmp_path: Path, named: bool) -> None:
    """The probe's attack on a real server: 40 MB of 64 KB parts, sent chunked so no
    declared length can refuse it; the answer must come long before the body ends, and
    the worker must not hold what was sent."""
    config = tmp_path / "config.yaml"
    config.write_text(f"uploads:\n  max_total_size: {MAX_TOTAL}\n", encoding="utf-8")
    base_dir = tmp_path / "home"
    server = start_server(base_dir, config)
    port = server.port
    total = 40 * 1024 * 1024
    sent = 0
    stop = threading.Event()
    try:
        assert b"200 OK" in http(port, "GET", "/api/threads/T/uploads/list")  # warm worker
        rss_before = _worker_rss(server.pid)
        body = GeneratedBody(parts=total // len(FIELD), named=named)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /api/threads/T/uploads HTTP/1.1\r\n"
                + RAW_HOST.encode()
                + b"Content-Type: multipart/form-data; boundary=B\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )

            def send() -> None:
                nonlocal sent
                buffer = bytearray(256 * 1024)
                try:
                    while not stop.is_set() and (count := body.readinto(memoryview(buffer))):
                        sock.sendall(b"%x\r\n%s\r\n" % (count, bytes(buffer[:count])))
                        sent += count
                    sock.sendall(b"0\r\n\r\n")
                except OSError:
                    pass  # the server answered and closed: exactly what is expected

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            status, answer = read_response(sock, bytearray())
            sent_at_answer = sent
            rss_after = _worker_rss(server.pid)
            stop.set()
        sender.join(timeout=30)
        assert status == 413
        assert json.loads(answer) == {"detail": "Total upload size too large"}
        assert sent_at_answer < total // 4
        assert rss_after - rss_before < 20 * 1024 * 1024
        folder = uploads_dir(base_dir, "T")
        assert not folder.exists() or os.listdir(folder) == []
    finally:
        stop.set()
        server.kill()
