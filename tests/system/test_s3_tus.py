"""A real tus client against two real instances on the S3 backend, as behind a load
balancer that sends each request anywhere: gunicorn servers with data dirs of their own,
sharing only PostgreSQL and a SeaweedFS bucket. The client goes on from whichever
instance it reaches, chunk by chunk, and the file both list is the one it sent."""

from __future__ import annotations

import hashlib
import io
import os
from urllib.parse import urlparse

import pytest
import requests
from tusclient import client as tus_client

from deerflow_web.storage.objects.s3 import S3ObjectStore
from tests.support.live_server import LiveServer
from tests.support.s3_deployment import AUTH
from tests.support.s3_deployment import bucket  # noqa: F401 - fixtures
from tests.support.s3_deployment import cluster  # noqa: F401
from tests.support.s3_deployment import download
from tests.support.s3_deployment import listing
from tests.support.s3_deployment import s3_server  # noqa: F401
from tests.support.s3_deployment import two  # noqa: F401
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.same_in_both_modes

MIB = 1024 * 1024


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
