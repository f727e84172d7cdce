"""Hostile names, paths and bodies answer 4xx with a `detail`, never 500 (issue 9, item 5).

The failures come from the file system (a NUL byte, a name over 255 bytes), the JSON
parser (a body nested 1,000 levels deep) and gunicorn's chunked decoder; each is mapped
once, wherever it surfaces, so every route is covered by the same rule.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from deerflow_web.web.errors import MALFORMED_BODY
from deerflow_web.web.errors import NAME_TOO_LONG
from tests.helpers import UploadActions
from tests.helpers import uploads_dir
from tests.support.live_server import RAW_HOST
from tests.support.live_server import start_server

HOST = RAW_HOST.encode()  # Host (and, with accounts on, the test token) of raw requests

LONG = "a" * 256
LONG_UNICODE = "文" * 86  # 258 bytes in UTF-8, 86 characters
ARTIFACT = "/api/threads/T/artifacts/mnt/user-data"


@pytest.fixture
def seeded(uploads: UploadActions, base_dir: Path) -> UploadActions:
    assert uploads.upload("T", (b"keep", "keep.txt")).status_code == 200
    for area in ("outputs", "workspace"):
        folder = uploads_dir(base_dir, "T").parent / area
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "keep.txt").write_bytes(b"keep")
    return uploads


def _unchanged(seeded: UploadActions, base_dir: Path) -> None:
    assert seeded.names("T") == ["keep.txt"]
    assert os.listdir(uploads_dir(base_dir, "T")) == ["keep.txt"]


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", f"{ARTIFACT}/uploads/a%00b.txt"),
        ("get", f"{ARTIFACT}/outputs/dir%00/keep.txt"),
        ("get", f"{ARTIFACT}/uploads/{LONG}"),
        ("get", f"{ARTIFACT}/workspace/{LONG_UNICODE}/keep.txt"),
        ("delete", f"/api/threads/T/uploads/{LONG}"),
        ("delete", f"/api/threads/T/uploads/{LONG_UNICODE}"),
        ("delete", "/api/threads/T/uploads/a%00b"),
        ("post", f"/api/threads/T/uploads/{LONG}/rename"),
        ("post", f"/api/threads/T/uploads/{LONG_UNICODE}/rename"),
        ("post", "/api/threads/T/uploads/keep%00.txt/rename"),
        ("post", f"/api/threads/T/uploads/{LONG}/convert"),
    ],
)
def test_api_names_the_file_system_refuses(
    client, seeded: UploadActions, base_dir: Path, method: str, url: str
) -> None:
    kwargs = {"json": {"new_name": "other.txt"}} if url.endswith("/rename") else {}
    response = getattr(client, method)(url, **kwargs)
    assert 400 <= response.status_code < 500, response.get_data()
    assert isinstance(response.get_json()["detail"], str)
    response.close()
    _unchanged(seeded, base_dir)


def test_over_long_names_say_why(client, seeded: UploadActions) -> None:
    with client.get(f"{ARTIFACT}/uploads/{LONG}") as response:
        assert (response.status_code, response.get_json()) == (400, {"detail": NAME_TOO_LONG})
    response = client.delete(f"/api/threads/T/uploads/{LONG_UNICODE}")
    assert (response.status_code, response.get_json()) == (400, {"detail": NAME_TOO_LONG})


@pytest.mark.parametrize(
    "url",
    [
        "/threads/T/files/uploads/a%00b.txt",
        f"/threads/T/files/uploads/{LONG}",
        f"/threads/T/files/outputs/{LONG_UNICODE}/x.txt",
        "/threads/T/browse/outputs/a%00b",
        f"/threads/T/browse/workspace/{LONG}",
        f"/threads/T/browse/workspace/{LONG}/deeper",
    ],
)
def test_pages_names_the_file_system_refuses(
    client, seeded: UploadActions, base_dir: Path, url: str
) -> None:
    response = client.get(url)
    assert 400 <= response.status_code < 500
    assert response.mimetype == "text/html"
    _unchanged(seeded, base_dir)


@pytest.mark.parametrize(
    "body",
    [
        "[" * 1000 + "]" * 1000,
        '{"new_name": ' + "[" * 1000 + "]" * 1000 + "}",
        '{"new_name": ' + '{"a":' * 1000 + "1" + "}" * 1001,
        '{"new_name": "b.txt"',
    ],
)
def test_rename_body_that_does_not_parse(
    client, seeded: UploadActions, base_dir: Path, body: str
) -> None:
    response = client.post(
        "/api/threads/T/uploads/keep.txt/rename", data=body, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.get_json()["detail"].startswith("Malformed JSON body")
    _unchanged(seeded, base_dir)


@pytest.mark.parametrize("body", ['["new_name", "b.txt"]', '"b.txt"', "null", "3"])
def test_rename_body_that_is_not_an_object(client, seeded: UploadActions, body: str) -> None:
    response = client.post(
        "/api/threads/T/uploads/keep.txt/rename", data=body, content_type="application/json"
    )
    assert response.status_code == 422
    assert response.get_json()["detail"][0]["msg"] == "Input should be a valid dictionary"
    assert seeded.names("T") == ["keep.txt"]


def test_rename_still_takes_json_and_form_bodies(client, seeded: UploadActions) -> None:
    response = client.post("/api/threads/T/uploads/keep.txt/rename", json={"new_name": "b.txt"})
    assert response.status_code == 200
    response = client.post("/api/threads/T/uploads/b.txt/rename", data={"new_name": "c.txt"})
    assert response.status_code == 200
    assert seeded.names("T") == ["c.txt"]


def _exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes on a fresh connection; return the first response (head and body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def _first_response(raw: bytes) -> tuple[int, dict]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    body = rest[: int(headers["content-length"])]
    return int(lines[0].split()[1]), json.loads(body)


MULTIPART_HEAD = (
    b"--XYZ\r\n"
    b'Content-Disposition: form-data; name="files"; filename="bad.txt"\r\n\r\n'
    b"payload\r\n--XYZ--\r\n"
)
BROKEN_CHUNKS = {
    "size zz": b"zz\r\n" + MULTIPART_HEAD + b"\r\n0\r\n\r\n",
    "size -5": b"-5\r\n" + MULTIPART_HEAD + b"\r\n0\r\n\r\n",
    "missing CRLF": b"%x\r\n" % len(MULTIPART_HEAD) + MULTIPART_HEAD + b"XX0\r\n\r\n",
    "size beyond the data": b"ffff\r\n" + MULTIPART_HEAD + b"\r\n",
}


def test_broken_chunked_bodies_under_gunicorn(base_dir: Path) -> None:
    """gunicorn decodes the chunks as the app reads: a broken one is 400, the server lives."""
    server = start_server(base_dir)
    port = server.port
    upload_head = (
        b"POST /api/threads/T/uploads HTTP/1.1\r\n"
        + HOST
        + b"Content-Type: multipart/form-data; boundary=XYZ\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    rename_head = (
        b"POST /api/threads/T/uploads/keep.txt/rename HTTP/1.1\r\n"
        + HOST
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    list_request = b"GET /api/threads/T/uploads/list HTTP/1.1\r\n" + HOST + b"\r\n"
    try:
        good = b'{"new_name": "x.txt"}'
        part = MULTIPART_HEAD.replace(b"bad.txt", b"keep.txt")
        keep = upload_head + b"%x\r\n" % len(part) + part + b"\r\n0\r\n\r\n"
        assert _first_response(_exchange(port, keep))[0] == 200
        for name, chunks in BROKEN_CHUNKS.items():
            for head in (upload_head, rename_head):
                body = chunks if head is upload_head else chunks.replace(MULTIPART_HEAD, good)
                status, answer = _first_response(_exchange(port, head + body))
                assert 400 <= status < 500, (name, status, answer)
                assert isinstance(answer["detail"], str), name
            status, listing = _first_response(_exchange(port, list_request))
            assert status == 200, name  # the server keeps answering
            assert [f["filename"] for f in listing["files"]] == ["keep.txt"], name
        status, answer = _first_response(_exchange(port, upload_head + BROKEN_CHUNKS["size zz"]))
        assert answer == {"detail": MALFORMED_BODY}
        assert sorted(os.listdir(uploads_dir(base_dir, "T"))) == ["keep.txt"]
        # A rebinding Host is refused by the real server too (issue 9, item 3).
        evil = list_request.replace(b"Host: 127.0.0.1", b"Host: rebind.evil.example")
        status, answer = _first_response(_exchange(port, evil))
        assert status == 400 and "Unknown host" in answer["detail"]
    finally:
        server.kill()


@pytest.mark.parametrize("url", ["/threads/T/chat", "/threads/T/rename", "/threads/T/delete"])
@pytest.mark.parametrize("body", [False, 3, "text", [1, 2], [["a"]], {"filename": "keep.txt"}])
def test_pages_ignore_json_bodies(client, seeded: UploadActions, url: str, body: object) -> None:
    """Page forms read form posts only; a JSON body (which no page sends) changes nothing.

    CSRF is off here, as it would otherwise refuse these posts before any form reads them.
    """
    response = client.post(url, json=body)
    assert response.status_code < 500
    assert seeded.names("T") == ["keep.txt"]
