"""A resumable upload whose last PATCH meets a database outage still finishes.

Real parts: a gunicorn server over a real PostgreSQL, a tuspy client with retries, and a
TCP relay between them that stops PostgreSQL (`pg_ctl stop -m immediate`, as a crash
would) while the last PATCH's body is still streaming, then lets the rest through. The
server answers 503; PostgreSQL comes back a moment later; tuspy's retry (HEAD, then a
PATCH at the offset it learns) must end with the file committed whole. The offset the
server reports is full only once the commit holds, so a client never takes an upload
that was never stored for a finished one.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import pytest
import requests
from tusclient import client as tus_client

from deerflow_web.storage.paths import is_staging_name
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import uploads_dir
from tests.support.live_server import LiveServer
from tests.support.live_server import start_server
from tests.support.postgres import PostgresServer

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
TUS = {"Tus-Resumable": "1.0.0"}
MIB = 1024 * 1024
SIZE = 24 * MIB
CHUNK = 8 * MIB
OUTAGE_SECONDS = 2.0
UPLOADS = int(os.environ.get("TUS_OUTAGE_UPLOADS", "4"))


class FaultRelay:
    """A TCP relay to `port` that runs `fault` once, as soon as `after` bytes of requests
    have passed: holding the bytes back until it has run (`hold`: the fault meets a
    request mid-body), or beside them."""

    def __init__(self, port: int, after: int, fault: Callable[[], None], *, hold: bool) -> None:
        self._target = port
        self._after = after
        self._fault = fault
        self._hold = hold
        self.unavailable = 0  # answers of 503 seen going back
        self._sent = 0
        self._lock = threading.Lock()
        self.fired = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        with client, upstream:
            answers = threading.Thread(target=self._pipe, args=(upstream, client, False))
            answers.start()
            self._pipe(client, upstream, True)
            answers.join()

    def _pipe(self, source: socket.socket, sink: socket.socket, request: bool) -> None:
        try:
            while data := source.recv(65536):
                if request:
                    with self._lock:
                        self._sent += len(data)
                        fire = self._sent >= self._after and not self.fired.is_set()
                        if fire:
                            self.fired.set()
                    if fire and self._hold:
                        self._fault()
                    elif fire:
                        threading.Thread(target=self._fault, daemon=True).start()
                elif data.startswith(b"HTTP/1.1 503"):
                    self.unavailable += 1
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def server(base_dir: Path, own_postgres_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    # A server of this module's own, stopped and started again by the test, with commits
    # as durable as a production server's: what the app was told is stored survives. Two
    # workers: one still loading the app when the first outage begins waits for the
    # database and serves once it is back (web/startup.py).
    started = start_server(
        base_dir, database_url=own_postgres_url, workers=2, log=tmp_path / "server.log"
    )
    try:
        yield started
    finally:
        started.kill()


def listing(server: LiveServer, thread: str) -> dict[str, str]:
    response = requests.get(
        f"{server.url}/api/threads/{thread}/uploads/list", headers=AUTH, timeout=30
    )
    assert response.status_code == 200, response.text
    return {f["filename"]: f["sha256"] for f in response.json()["files"]}


def tuspy_client(endpoint: str, data: bytes) -> None:
    """tuspy with retries: after an error it asks HEAD for the offset and PATCHes on from
    there (a zero-byte PATCH when the offset is the length)."""
    uploader = tus_client.TusClient(endpoint, headers=AUTH).uploader(
        file_stream=io.BytesIO(data),
        chunk_size=CHUNK,
        metadata={"filename": "big.bin"},
        retries=60,
        retry_delay=0.5,
    )
    uploader.upload()


def head_only_client(endpoint: str, data: bytes) -> None:
    """How tus-js-client resumes after an error: HEAD, and an upload whose offset is its
    length is finished, with no further request."""
    name = base64.b64encode(b"big.bin").decode()
    created = requests.post(
        endpoint,
        headers={
            **AUTH,
            **TUS,
            "Upload-Length": str(len(data)),
            "Upload-Metadata": f"filename {name}",
        },
        timeout=30,
    )
    assert created.status_code == 201, created.text
    url = urljoin(endpoint, created.headers["Location"])
    offset = 0
    while offset < len(data):
        patched = requests.patch(
            url,
            data=data[offset : offset + CHUNK],
            headers={
                **AUTH,
                **TUS,
                "Upload-Offset": str(offset),
                "Content-Type": "application/offset+octet-stream",
            },
            timeout=60,
        )
        if patched.status_code == 204:
            offset = int(patched.headers["Upload-Offset"])
            continue
        assert patched.status_code == 503, patched.text
        deadline = time.monotonic() + 60
        while True:
            time.sleep(0.5)
            head = requests.head(url, headers={**AUTH, **TUS}, timeout=30)
            if head.status_code == 200:
                offset = int(head.headers["Upload-Offset"])
                break
            assert head.status_code == 503 and time.monotonic() < deadline, head.status_code


# When the outage strikes: inside the last PATCH's body (the bytes held back until the
# server is down), or as its last byte arrives, a little later each time, so that it meets
# the offset's update, the hashing or the commit itself.
MOMENTS = [("mid-body", 0.0), ("at the end", 0.0), ("at the end", 0.03), ("at the end", 0.08)]


@pytest.mark.parametrize("client", [tuspy_client, head_only_client], ids=["tuspy", "head-only"])
def test_last_patch_meets_a_postgresql_outage_and_the_retry_finishes(
    server: LiveServer,
    own_postgres: PostgresServer,
    base_dir: Path,
    client: Callable[[str, bytes], None],
) -> None:
    lost = met = 0
    for n in range(UPLOADS):
        thread, data = f"outage-{n}", os.urandom(SIZE)
        moment, delay = MOMENTS[n % len(MOMENTS)]
        restarted = threading.Event()

        def outage(delay: float = delay, restarted: threading.Event = restarted) -> None:
            time.sleep(delay)
            own_postgres.stop_server("immediate")
            time.sleep(OUTAGE_SECONDS)
            own_postgres.start_server()
            restarted.set()

        if moment == "mid-body":
            relay = FaultRelay(server.port, SIZE - 2 * MIB, outage, hold=True)
        else:
            relay = FaultRelay(server.port, SIZE, outage, hold=False)
        try:
            client(f"http://127.0.0.1:{relay.port}/api/threads/{thread}/uploads/tus", data)
        finally:
            relay.close()
        assert relay.fired.is_set(), "the outage never happened"
        assert restarted.wait(60), "PostgreSQL did not come back"
        met += relay.unavailable > 0
        if listing(server, thread).get("big.bin") != hashlib.sha256(data).hexdigest():
            lost += 1
            continue
        folder = uploads_dir(base_dir, thread)
        assert [name for name in os.listdir(folder) if is_staging_name(name)] == []
        assert (folder / "big.bin").read_bytes() == data
    print(f"{UPLOADS} uploads of {SIZE} bytes, {met} answered 503 at least once, {lost} lost")
    assert lost == 0
