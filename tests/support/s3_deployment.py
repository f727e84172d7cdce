"""What an instance on the S3 backend needs from the tests: its environment, and a slow
road to the bucket.

`s3_environment` is the set of variables a deployment sets for `storage.backend: s3`
(backend, endpoint, bucket, region, prefix, the AWS credentials), for in-process apps
(`monkeypatch.setenv`) and for real processes (`LiveServer(env=...)`, `LiveWorker`).

`ThrottledProxy` is a TCP proxy on loopback that passes what a client sends at a set
rate: an instance pointed at it pushes a file to the bucket slowly enough for a test to
kill it in the middle of a multipart upload, at a moment the test can see (the upload is
listed in the bucket), rather than racing a push that takes a fraction of a second.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from tests.support.seaweedfs import ACCESS_KEY
from tests.support.seaweedfs import SECRET_KEY


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
