"""`/readyz` on the S3 backend checks the bucket (one HeadBucket): an instance that cannot
reach it is not ready and says why; `/healthz` stays 200. On the local disk: `off`."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from typing import Any

import pytest

from tests.support.live_server import free_port
from tests.support.s3_deployment import s3_environment
from tests.support.seaweedfs import SeaweedFS

BUCKET = "deerflow-readyz"


def on_s3(monkeypatch: pytest.MonkeyPatch, endpoint_url: str, bucket: str) -> None:
    for key, value in s3_environment(endpoint_url, bucket, f"t-{secrets.token_hex(6)}").items():
        monkeypatch.setenv(key, value)


def test_on_the_local_disk_the_bucket_is_off(make_app: Any) -> None:
    answer = make_app().test_client().get("/readyz")
    assert answer.status_code == 200
    assert answer.get_json()["bucket"] == "off"


def test_a_bucket_that_answers_is_ready(
    make_app: Any, monkeypatch: pytest.MonkeyPatch, seaweedfs: SeaweedFS
) -> None:
    seaweedfs.store(BUCKET)
    on_s3(monkeypatch, seaweedfs.endpoint_url, BUCKET)
    answer = make_app().test_client().get("/readyz")
    assert answer.status_code == 200, answer.get_json()
    assert (answer.get_json()["status"], answer.get_json()["bucket"]) == ("ok", "ok")


@pytest.mark.parametrize("where", ["no server", "no such bucket"])
def test_a_bucket_out_of_reach_is_not_ready_and_says_why(
    make_app: Any, monkeypatch: pytest.MonkeyPatch, seaweedfs: SeaweedFS, where: str
) -> None:
    if where == "no server":
        on_s3(monkeypatch, f"http://127.0.0.1:{free_port()}", BUCKET)
    else:
        on_s3(monkeypatch, seaweedfs.endpoint_url, f"never-made-{secrets.token_hex(4)}")
    client = make_app().test_client()
    answer = client.get("/readyz")
    assert answer.status_code == 503
    body = answer.get_json()
    assert (body["status"], body["bucket"]) == ("unavailable", "failed")
    assert (body["database"], body["storage"]) == ("ok", "ok")
    assert body["detail"].startswith("bucket: the object store cannot be reached")
    assert answer.headers["Cache-Control"] == "no-store"
    assert client.get("/healthz").status_code == 200


def test_a_bucket_that_never_answers_is_asked_once(
    make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes the connection and says nothing (a hung gateway): the probe
    gives up after one try of a short timeout instead of the store's three long ones."""
    silent = socket.create_server(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(silent.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        on_s3(monkeypatch, f"http://127.0.0.1:{silent.getsockname()[1]}", BUCKET)
        client = make_app().test_client()
        answer = client.get("/readyz")
        assert answer.status_code == 503
        assert answer.get_json()["bucket"] == "failed"
        assert len(accepted) == 1
    finally:
        silent.close()
        for connection in accepted:
            connection.close()
