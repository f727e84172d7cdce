"""What an instance on the S3 backend needs from the tests: its environment, and a slow
road to the bucket.

`s3_environment` is the set of variables a deployment sets for `storage.backend: s3`
(backend, endpoint, bucket, region, prefix, the AWS credentials), for in-process apps
(`monkeypatch.setenv`) and for real processes (`LiveServer(env=...)`, `LiveWorker`).

`ThrottledProxy` is a TCP proxy on loopback that passes what a client sends at a set
rate: an instance pointed at it pushes a file to the bucket slowly enough for a test to
kill it in the middle of a multipart upload, at a moment the test can see (the upload is
listed in the bucket), rather than racing a push that takes a fraction of a second.

For the system tests that run instances as real processes (tests/system/test_s3_*.py):
the fixtures `s3_server` (module-scoped: each module that imports it runs a SeaweedFS of
its own, which its tests may stop), `bucket` (the test's prefix), `cluster` (what the
instances of one test share, and how to start one) and `two` (instances A and B,
started), and the clients `listing` and `download` both modules call.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from deerflow_web.storage.objects.s3 import S3ObjectStore
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import provision_server_user
from tests.support.live_server import LiveServer
from tests.support.seaweedfs import ACCESS_KEY
from tests.support.seaweedfs import SECRET_KEY
from tests.support.seaweedfs import SeaweedFS
from tests.support.seaweedfs import weed_missing

AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
BUCKET = "deerflow-processes"  # the real-process tests' bucket, one prefix per test


def s3_environment(endpoint_url: str, bucket: str, prefix: str = "") -> dict[str, str]:
    """The variables that put an instance's files in `bucket` under `prefix`."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "DEER_FLOW_STORAGE_BACKEND": "s3",
        "DEER_FLOW_STORAGE_S3_ENDPOINT_URL": endpoint_url,
        "DEER_FLOW_STORAGE_S3_BUCKET": bucket,
        "DEER_FLOW_STORAGE_S3_REGION": "us-east-1",
        "DEER_FLOW_STORAGE_S3_PREFIX": prefix.strip("/"),
    }


class ThrottledProxy:
    """Forwards loopback connections to `target_port`; what clients send goes on at
    `rate` bytes per second, the answers at full speed."""

    def __init__(self, target_port: int, rate: int) -> None:
        self.target_port = target_port
        self.rate = rate
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="throttled-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            threading.Thread(
                target=self._pump, args=(client, upstream, self.rate), daemon=True
            ).start()
            threading.Thread(target=self._pump, args=(upstream, client, 0), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, rate: int) -> None:
        """Copy until either side closes; `rate` > 0: at most that many bytes a second."""
        chunk = max(rate // 20, 1024) if rate else 65536
        started = time.monotonic()
        sent = 0
        try:
            while data := source.recv(chunk):
                sink.sendall(data)
                sent += len(data)
                if rate:
                    ahead = sent / rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()


# --- instances as real processes -------------------------------------------------------


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """The importing module's own S3 server (module scope: one per module that imports
    the fixture), which its tests may stop: the session's server is shared by other tests
    of the process."""
    if (reason := weed_missing()) is not None:
        pytest.skip(reason)
    server = SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs-processes"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def bucket(s3_server: SeaweedFS) -> S3ObjectStore:
    """This test's prefix of the bucket, as the instances see it."""
    return s3_server.store(BUCKET, prefix=f"t-{secrets.token_hex(6)}")


@dataclass
class Cluster:
    """What the instances of one test share, and how to start one."""

    s3: SeaweedFS
    bucket: S3ObjectStore
    database_url: str
    config: Path
    tmp_path: Path

    def environment(self, endpoint_url: str | None = None) -> dict[str, str]:
        return s3_environment(
            endpoint_url or self.s3.endpoint_url, BUCKET, self.bucket.prefix.rstrip("/")
        )

    def data_dir(self, name: str) -> Path:
        folder = self.tmp_path / f"data-{name}"
        folder.mkdir(exist_ok=True)
        return folder

    def server(self, name: str, *, endpoint_url: str | None = None) -> LiveServer:
        return LiveServer(
            self.data_dir(name),
            config=self.config,
            database_url=self.database_url,
            env=self.environment(endpoint_url),
            log=self.tmp_path / f"instance-{name}.log",
        )


def write_config(path: Path, **sections: Any) -> Path:
    """A config file for the instances: conversions answer quickly, plus `sections`."""
    path.write_text(yaml.safe_dump({"uploads": {"conversion_wait_seconds": 0.2}, **sections}))
    return path


@pytest.fixture
def cluster(
    s3_server: SeaweedFS, bucket: S3ObjectStore, postgres_url: str, tmp_path: Path
) -> Cluster:
    provision_server_user(tmp_path, database_url=postgres_url)
    config = write_config(tmp_path / "config.yaml")
    return Cluster(s3_server, bucket, postgres_url, config, tmp_path)


@pytest.fixture
def two(cluster: Cluster) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Instances A and B, each with its own empty data dir."""
    a, b = cluster.server("a"), cluster.server("b")
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.kill()
        b.kill()


def listing(server: LiveServer, thread_id: str) -> dict[str, dict]:
    """The thread's files as `server` lists them, by name."""
    response = requests.get(
        f"{server.url}/api/threads/{thread_id}/uploads/list", headers=AUTH, timeout=30
    )
    assert response.status_code == 200, response.text
    return {f["filename"]: f for f in response.json()["files"]}


def download(server: LiveServer, thread_id: str, name: str) -> requests.Response:
    """One upload of the thread as `server` serves it."""
    return requests.get(
        f"{server.url}/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}",
        headers=AUTH,
        timeout=60,
    )
