"""Resumable uploads against a real gunicorn process: a kill mid-chunk, two writers at once,
and the `tuspy` client stopping and resuming (SPEC 8)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import time
from pathlib import Path

import pytest
import requests
import yaml
from tusclient import client as tus_client
from tusclient.storage.filestorage import FileStorage

from deerflow_web.storage.paths import is_staging_name
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import auth_header_line
from tests.helpers import uploads_dir
from tests.support.live_server import start_server

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


MIB = 1024 * 1024


@pytest.fixture
def server(base_dir: Path, tmp_path: Path):
    """A gunicorn server allowing 128 MiB files; `kill()` and `start()` it again on its port."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"uploads": {"max_file_size": 128 * MIB}}))
    with start_server(base_dir, config) as running:
        yield running


# Requests to a server with accounts on carry the test user's token.
AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
TUS = {"Tus-Resumable": "1.0.0", **AUTH}


class KeptOpen(io.BytesIO):
    """A source tuspy may `with`-close as often as it likes (it does, per fingerprint);
    a `file_path` source instead leaves its file handles to the garbage collector."""

    def close(self) -> None:
        pass


def create(url: str, thread_id: str, length: int, name: str = "big.bin") -> str:
    metadata = "filename " + base64.b64encode(name.encode()).decode()
    response = requests.post(
        f"{url}/api/threads/{thread_id}/uploads/tus",
        headers={**TUS, "Upload-Length": str(length), "Upload-Metadata": metadata},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return url + response.headers["Location"]


def head_offset(upload_url: str) -> int:
    response = requests.head(upload_url, headers=TUS, timeout=10)
    assert response.status_code == 200
    return int(response.headers["Upload-Offset"])


def patch(upload_url: str, offset: int, data: bytes, **headers: str) -> requests.Response:
    sent = {
        **TUS,
        "Upload-Offset": str(offset),
        "Content-Type": "application/offset+octet-stream",
        **headers,
    }
    return requests.patch(upload_url, data=data, headers=sent, timeout=60)


def open_patch(upload_url: str, offset: int, length: int, first: bytes, **headers: str):
    """Start a PATCH on a raw socket: headers and the first bytes only."""
    path = upload_url.split("//", 1)[1].split("/", 1)[1]
    host, port = upload_url.split("//", 1)[1].split("/", 1)[0].split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        (
            f"PATCH /{path} HTTP/1.1\r\nHost: {host}:{port}\r\nTus-Resumable: 1.0.0\r\n"
            f"Upload-Offset: {offset}\r\nContent-Type: application/offset+octet-stream\r\n"
            f"Content-Length: {length}\r\n{auth_header_line()}{extra}\r\n"
        ).encode()
        + first
    )
    return sock


def staging_file(base_dir: Path, thread_id: str) -> Path:
    folder = uploads_dir(base_dir, thread_id)
    (name,) = [n for n in os.listdir(folder) if is_staging_name(n)]
    return folder / name


def wait_for_size(path: Path, at_least: int) -> None:
    deadline = time.monotonic() + 20
    while path.stat().st_size < at_least:
        assert time.monotonic() < deadline, "the server never wrote the bytes"
        time.sleep(0.05)


def test_server_killed_mid_patch_resumes_from_the_bytes_on_disk(server, base_dir: Path) -> None:
    data = os.urandom(12 * MIB)
    upload_url = create(server.url, "T", len(data))
    assert patch(upload_url, 0, data[: 2 * MIB]).status_code == 204
    sock = open_patch(upload_url, 2 * MIB, len(data) - 2 * MIB, data[2 * MIB : 7 * MIB + 1234])
    staging = staging_file(base_dir, "T")
    wait_for_size(staging, 6 * MIB)
    server.kill()
    sock.close()
    on_disk = staging.stat().st_size
    assert 6 * MIB <= on_disk <= 7 * MIB + 1234

    server.start()  # the start-up sweep keeps a live upload's staging file
    offset = head_offset(upload_url)
    assert offset == on_disk
    assert staging.read_bytes() == data[:offset]
    assert patch(upload_url, offset, data[offset:]).status_code == 204
    stored = uploads_dir(base_dir, "T") / "big.bin"
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    listing = requests.get(
        f"{server.url}/api/threads/T/uploads/list", headers=AUTH, timeout=10
    ).json()
    assert [(f["filename"], f["sha256"]) for f in listing["files"]] == [
        ("big.bin", hashlib.sha256(data).hexdigest())
    ]


def test_server_killed_mid_checksummed_patch_forgets_the_unverified_bytes(
    server, base_dir: Path
) -> None:
    data = os.urandom(8 * MIB)
    upload_url = create(server.url, "T", len(data))
    assert patch(upload_url, 0, data[:MIB]).status_code == 204
    rest = data[MIB:]
    checksum = "sha256 " + base64.b64encode(hashlib.sha256(rest).digest()).decode()
    sock = open_patch(
        upload_url, MIB, len(rest), rest[: 4 * MIB + 10], **{"Upload-Checksum": checksum}
    )
    staging = staging_file(base_dir, "T")
    wait_for_size(staging, 4 * MIB)
    server.kill()
    sock.close()

    server.start()
    assert head_offset(upload_url) == MIB
    assert staging.stat().st_size == MIB
    assert patch(upload_url, MIB, rest, **{"Upload-Checksum": checksum}).status_code == 204
    assert (uploads_dir(base_dir, "T") / "big.bin").read_bytes() == data


def test_two_patches_at_once_one_wins_the_other_is_409(server, base_dir: Path) -> None:
    data = os.urandom(4 * MIB)
    upload_url = create(server.url, "T", len(data))
    sock = open_patch(upload_url, 0, len(data), data[: 2 * MIB])
    wait_for_size(staging_file(base_dir, "T"), MIB)

    intruder = os.urandom(len(data))
    second = patch(upload_url, 0, intruder)
    assert second.status_code == 409
    assert second.headers["Tus-Resumable"] == "1.0.0"
    assert "detail" in second.json()
    assert head_offset(upload_url) == 0  # the running chunk is not confirmed yet

    sock.sendall(data[2 * MIB :])
    response = sock.recv(65536)
    sock.close()
    assert response.startswith(b"HTTP/1.1 204")
    assert b"Upload-Offset: 4194304" in response
    stored = uploads_dir(base_dir, "T") / "big.bin"
    assert stored.read_bytes() == data
    assert patch(upload_url, 0, intruder).status_code == 409  # finished: nothing to write
    assert stored.read_bytes() == data


def test_tuspy_stops_after_20_chunks_and_a_new_client_resumes(
    server, base_dir: Path, tmp_path: Path
) -> None:
    source = os.urandom(64 * MIB)
    storage_path = tmp_path / "tus-urls.json"
    endpoint = f"{server.url}/api/threads/T/uploads/tus"

    first = tus_client.TusClient(endpoint, headers=AUTH).uploader(
        file_stream=KeptOpen(source),
        chunk_size=MIB,
        metadata={"filename": "recording.bin"},
        store_url=True,
        url_storage=FileStorage(str(storage_path)),
    )
    first.upload(stop_at=20 * MIB)
    assert first.offset == 20 * MIB
    first.url_storage.close()

    second = tus_client.TusClient(endpoint, headers=AUTH).uploader(
        file_stream=KeptOpen(source),
        chunk_size=MIB,
        metadata={"filename": "recording.bin"},
        store_url=True,
        url_storage=FileStorage(str(storage_path)),
        upload_checksum=True,  # the rest goes with a checksum per chunk
    )
    assert second.url == first.url  # found in the stored URLs
    assert second.offset == 20 * MIB  # asked the server where to go on
    second.upload()
    second.url_storage.close()

    stored = uploads_dir(base_dir, "T") / "recording.bin"
    digest = hashlib.sha256(source).hexdigest()
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
    listing = requests.get(
        f"{server.url}/api/threads/T/uploads/list", headers=AUTH, timeout=10
    ).json()
    assert [(f["filename"], f["size"], f["sha256"]) for f in listing["files"]] == [
        ("recording.bin", 64 * MIB, digest)
    ]
