"""A real tus client against two real instances on the S3 backend, as behind a load
balancer that sends each request anywhere: gunicorn servers with data dirs of their own,
sharing only PostgreSQL and a SeaweedFS bucket. The client goes on from whichever
instance it reaches, chunk by chunk, and the file both list is the one it sent. An
instance SIGKILLed in the middle of a PATCH blocks the upload only as long as its lease
(`uploads.resumable_lease_seconds`), then the other carries it on."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
from tusclient import client as tus_client

from deerflow_web.storage.objects.s3 import S3ObjectStore
from tests.helpers import auth_header_line
from tests.helpers import wait_until
from tests.support.live_server import LiveServer
from tests.support.s3_deployment import AUTH
from tests.support.s3_deployment import Cluster
from tests.support.s3_deployment import bucket  # noqa: F401 - fixtures
from tests.support.s3_deployment import cluster  # noqa: F401
from tests.support.s3_deployment import download
from tests.support.s3_deployment import listing
from tests.support.s3_deployment import s3_server  # noqa: F401
from tests.support.s3_deployment import two  # noqa: F401
from tests.support.s3_deployment import write_config
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.same_in_both_modes

MIB = 1024 * 1024
TUS = {"Tus-Resumable": "1.0.0", **AUTH}
LEASE_SECONDS = 3  # uploads.resumable_lease_seconds of the kill test's instances
TRICKLE_RATE = MIB  # bytes a second of the killed PATCH's body, until the kill


class KeptOpen(io.BytesIO):
    """A source tuspy may close as often as it likes."""

    def close(self) -> None:
        pass


def test_tuspy_alternating_between_two_instances_chunk_by_chunk(
    two: tuple[LiveServer, LiveServer],  # noqa: F811
    bucket: S3ObjectStore,  # noqa: F811
    s3_server: SeaweedFS,  # noqa: F811
) -> None:
    a, b = two
    source = os.urandom(21 * MIB + 12345)
    uploader = tus_client.TusClient(f"{a.url}/api/threads/T/uploads/tus", headers=AUTH).uploader(
        file_stream=KeptOpen(source),
        chunk_size=3 * MIB,
        metadata={"filename": "recording.bin"},
        upload_checksum=True,
    )
    uploader.set_url(uploader.create_url())
    path = urlparse(uploader.url).path
    turns = 0
    while uploader.offset < len(source):
        instance = (a, b)[turns % 2]
        uploader.set_url(f"{instance.url}{path}")
        uploader.offset = uploader.get_offset()  # where the other instance left it
        uploader.upload_chunk()
        turns += 1
    assert turns == 8

    digest = hashlib.sha256(source).hexdigest()
    for instance in (a, b):
        listed = listing(instance, "T")
        assert [(n, f["size"], f["sha256"]) for n, f in listed.items()] == [
            ("recording.bin", len(source), digest)
        ]
        served = download(instance, "T", "recording.bin")
        assert served.status_code == 200
        assert hashlib.sha256(served.content).hexdigest() == digest
    keys = [info.key for info in bucket.list_keys()]
    assert len(keys) == 1  # no part, tail or incoming object: the blob alone
    assert keys[0].endswith(f"/blobs/{digest}")
    assert bucket.list_stale_uploads() == []
    gone = requests.head(f"{b.url}{path}", headers={"Tus-Resumable": "1.0.0", **AUTH}, timeout=10)
    assert gone.status_code == 200  # committed: the upload says it is complete
    assert gone.headers["Upload-Offset"] == str(len(source))


# --- a writer killed mid-PATCH -----------------------------------------------------------


def tus_patch(upload_url: str, offset: int, data: bytes) -> requests.Response:
    headers = {
        **TUS,
        "Upload-Offset": str(offset),
        "Content-Type": "application/offset+octet-stream",
    }
    return requests.patch(upload_url, data=data, headers=headers, timeout=60)


def open_patch(server: LiveServer, path: str, offset: int, length: int) -> socket.socket:
    """A PATCH of `length` bytes on a raw socket: its headers only, the body to follow."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(
        (
            f"PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Tus-Resumable: 1.0.0\r\nUpload-Offset: {offset}\r\n"
            "Content-Type: application/offset+octet-stream\r\n"
            f"Content-Length: {length}\r\n{auth_header_line()}\r\n"
        ).encode()
    )
    return sock


def trickle(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    """Send `data` at TRICKLE_RATE until `stop` (or the server is gone): a live writer
    whose bytes keep arriving, so it keeps renewing its lease until it is killed."""
    piece = TRICKLE_RATE // 16
    for start in range(0, len(data), piece):
        if stop.wait(1 / 16):
            return
        try:
            sock.sendall(data[start : start + piece])
        except OSError:
            return


def test_a_writer_killed_mid_patch_blocks_the_upload_for_the_configured_lease_only(
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A's gunicorn is SIGKILLed in the middle of a PATCH that holds the upload's lease, a
    multipart upload in the bucket begun by it: B is refused while the lease lasts, then,
    `uploads.resumable_lease_seconds` later, carries the upload on from the offset HEAD
    reports (what A stored before that PATCH) and finishes it, the file byte-equal."""
    cluster.config = write_config(
        tmp_path / "short-lease.yaml",
        uploads={"conversion_wait_seconds": 0.2, "resumable_lease_seconds": LEASE_SECONDS},
    )
    a, b = cluster.server("a"), cluster.server("b")
    stop = threading.Event()
    sender: threading.Thread | None = None
    sock: socket.socket | None = None
    try:
        a.start()
        b.start()
        source = os.urandom(23 * MIB + 12345)
        created = requests.post(
            f"{a.url}/api/threads/K/uploads/tus",
            headers={
                **TUS,
                "Upload-Length": str(len(source)),
                "Upload-Metadata": "filename " + base64.b64encode(b"killed.bin").decode(),
            },
            timeout=30,
        )
        assert created.status_code == 201, created.text
        path = urlparse(created.headers["Location"]).path
        first = 3 * MIB  # below one part: A stores it as the tail
        assert tus_patch(f"{a.url}{path}", 0, source[:first]).status_code == 204

        # The next PATCH on A: 6 MiB at once (with the tail, one part for the bucket), the
        # rest a trickle that keeps A's lease renewed.
        sock = open_patch(a, path, first, len(source) - first)
        sock.sendall(source[first : first + 6 * MIB])
        sender = threading.Thread(
            target=trickle, args=(sock, source[first + 6 * MIB :], stop), daemon=True
        )
        sender.start()
        wait_until(lambda: cluster.bucket.list_stale_uploads(), timeout=30)  # part 1 on its way
        # An empty PATCH at the offset asks for the lease and sends nothing.
        assert tus_patch(f"{b.url}{path}", first, b"").status_code == 409  # A is writing

        a.kill()
        stop.set()
        killed = time.monotonic()
        assert tus_patch(f"{b.url}{path}", first, b"").status_code == 409  # its lease holds
        wait_until(
            lambda: tus_patch(f"{b.url}{path}", first, b"").status_code == 204,
            timeout=LEASE_SECONDS + 20,
            interval=0.2,
        )
        assert time.monotonic() - killed < LEASE_SECONDS + 5  # not the default two minutes

        # What the killed PATCH sent was never stored: B goes on from A's first chunk.
        head = requests.head(f"{b.url}{path}", headers=TUS, timeout=10)
        assert head.status_code == 200
        offset = int(head.headers["Upload-Offset"])
        assert offset == first
        done = tus_patch(f"{b.url}{path}", offset, source[offset:])
        assert done.status_code == 204, done.text
        assert done.headers["Upload-Offset"] == str(len(source))

        digest = hashlib.sha256(source).hexdigest()
        listed = listing(b, "K")
        assert [(n, f["size"], f["sha256"]) for n, f in listed.items()] == [
            ("killed.bin", len(source), digest)
        ]
        served = download(b, "K", "killed.bin")
        assert served.status_code == 200
        assert served.content == source
        keys = [info.key for info in cluster.bucket.list_keys()]
        assert len(keys) == 1  # no part, tail or incoming object: the blob alone
        assert keys[0].endswith(f"/blobs/{digest}")
        assert cluster.bucket.list_stale_uploads() == []  # the orphaned part went with it
    finally:
        stop.set()
        if sender is not None:
            sender.join(timeout=10)
        if sock is not None:
            sock.close()
        a.kill()
        b.kill()
