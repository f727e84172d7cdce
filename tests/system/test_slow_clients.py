"""Slow and greedy clients against `make run`'s worker: the body rate, the deadline and the
body limit of the routes reached before signing in, the cap of connections per address.

Real gunicorn processes (tests/live_server.py) with short windows, so a cut comes within
seconds: a body must bring `RATE` bytes per second over `WINDOW` seconds once `GRACE` has
passed, a sign-in request must be complete within `PUBLIC_SECONDS`. With accounts off the
sign-in routes do not exist; the slow bodies then go to the upload route, which the rate
bounds alike.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deerflow_web.settings import ConnectionLimits
from deerflow_web.settings import load_settings
from tests.helpers import AUTH_ON
from tests.helpers import needs_auth
from tests.helpers import uploads_dir
from tests.support.live_server import RAW_HOST
from tests.support.live_server import LiveServer
from tests.support.live_server import raw_request
from tests.support.live_server import start_server

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


RATE = 20_000
WINDOW = 2.0
GRACE = 1.0
PUBLIC_SECONDS = 2.0
LOGIN = "/api/v1/auth/login/local"
SECOND_ADDRESS = "127.0.0.2"  # another loopback source address: another client


def write_config(path: Path, **server: object) -> Path:
    path.write_text(yaml.safe_dump({"server": server}), encoding="utf-8")
    return path


@contextlib.contextmanager
def paced_server(tmp_path: Path, name: str, **options: object) -> Iterator[LiveServer]:
    """One worker of `make run` with the short windows (and whatever else `options` set)."""
    server_keys = {
        "min_body_rate_bytes": RATE,
        "min_body_rate_window_seconds": WINDOW,
        "min_body_rate_grace_seconds": GRACE,
        "unauthenticated_request_seconds": PUBLIC_SECONDS,
        "max_connections_per_address": 0,
    }
    connections = options.pop("worker_connections", 1000)
    server_keys.update(options)
    base = tmp_path / name
    base.mkdir()
    config = write_config(tmp_path / f"{name}.yaml", **server_keys)
    server = start_server(
        base, config, worker_connections=connections, log=tmp_path / f"{name}.log"
    )
    try:
        yield server
    finally:
        server.kill()


def connect(port: int, source: str = "127.0.0.1", timeout: float = 30) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    )


def slow_head(length: int, forwarded_for: str | None = None) -> bytes:
    """The head of a request whose body then comes slowly: a sign-in with accounts on (read
    before anyone signs in), else an upload (the route every body-rate cut matters most)."""
    forwarded = f"X-Forwarded-For: {forwarded_for}\r\n" if forwarded_for else ""
    if AUTH_ON and forwarded_for is None:
        return (
            f"POST {LOGIN} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {length}\r\n\r\n"
        ).encode()
    return (
        f"POST /api/threads/T/uploads HTTP/1.1\r\n{RAW_HOST}{forwarded}"
        "Content-Type: multipart/form-data; boundary=XYZ\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        for chunk in iter(lambda: sock.recv(65536), b""):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def detail_of(response: bytes) -> str:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])["detail"]


class Trickle:
    """Sends one byte to each of its sockets every `every` seconds until stopped."""

    def __init__(self, sockets: list[socket.socket], every: float) -> None:
        self.sockets = sockets
        self.every = every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.send(b"u")

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join()


def test_connection_limits_settings(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config.yaml",
        min_body_rate_bytes=0,
        min_body_rate_window_seconds=5,
        unauthenticated_request_seconds=-1,
        max_connections_per_address="0",
    )
    limits = load_settings(tmp_path, config_path=config).connections
    assert limits.min_body_rate_bytes == 0  # off
    assert limits.min_body_rate_window_seconds == 5.0
    assert limits.unauthenticated_request_seconds == 10.0  # invalid: the default
    assert limits.max_connections_per_address == 0  # off
    assert load_settings(tmp_path).connections == ConnectionLimits()


def test_a_body_sent_a_byte_at_a_time_is_cut_with_408_long_before_the_idle_timeout(
    tmp_path: Path,
) -> None:
    with paced_server(tmp_path, "trickle") as server:
        sock = connect(server.port)
        with sock, Trickle([sock], every=1.0):  # never silent for the 60 s idle timeout
            started = time.monotonic()
            sock.sendall(slow_head(60_000) + b"u")
            response = read_all(sock)  # until the server closes the connection
            waited = time.monotonic() - started
        assert status_of(response) == 408, response[:300]
        assert b"Connection: close" in response
        assert "dropped" in detail_of(response)
        assert waited < 10, waited  # the sign-in deadline / the rate's window, not 60 s
        assert "cut POST" in server.log_tail(50)


def test_sixty_slow_bodies_do_not_keep_a_fifty_connection_worker_from_answering(
    tmp_path: Path,
) -> None:
    with paced_server(tmp_path, "sixty", worker_connections=50) as server:
        slow = [connect(server.port) for _ in range(60)]
        try:
            with Trickle(slow, every=3.0):
                for sock in slow:
                    sock.sendall(slow_head(60_000) + b"u")
                started = time.monotonic()
                health = raw_request(server.port, "GET", "/healthz", timeout=30)
                answered = time.monotonic() - started
                assert health.startswith(b"HTTP/1.1 200"), health[:200]
                assert answered < 15, answered
                for sock in slow:  # each was cut and closed; none waits for the idle timeout
                    response = read_all(sock)
                    assert status_of(response) in (408, 0), response[:200]
        finally:
            for sock in slow:
                sock.close()


def test_an_honest_slow_upload_passes_while_a_slower_one_beside_it_is_cut(
    tmp_path: Path,
) -> None:
    size = 2_000_000
    part = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="honest.bin"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    tail = b"\r\n--XYZ--\r\n"
    head = (
        f"POST /api/threads/T/uploads HTTP/1.1\r\n{RAW_HOST}"
        "Content-Type: multipart/form-data; boundary=XYZ\r\n"
        f"Content-Length: {len(part) + size + len(tail)}\r\n\r\n"
    ).encode()
    slower: dict[str, object] = {}

    def upload_slower(port: int) -> None:  # 5 KB/s: under the 20 KB/s this server asks
        with connect(port) as sock:
            sock.sendall(head + part)
            started = time.monotonic()
            with contextlib.suppress(OSError):
                for _ in range(100):
                    sock.sendall(b"s" * 500)
                    time.sleep(0.1)
            slower["response"] = read_all(sock)
            slower["seconds"] = time.monotonic() - started

    with paced_server(tmp_path, "honest") as server:
        beside = threading.Thread(target=upload_slower, args=(server.port,))
        beside.start()
        with connect(server.port) as sock:
            sock.sendall(head + part)
            for _ in range(size // 10_000):  # 10 KB every 100 ms: 100 KB/s
                sock.sendall(b"h" * 10_000)
                time.sleep(0.1)
            sock.sendall(tail)
            response = read_all(sock)
        beside.join()
        assert status_of(response) == 200, response[:300]
        stored = uploads_dir(server.base_dir, "T") / "honest.bin"
        assert stored.stat().st_size == size
        assert status_of(slower["response"]) == 408, slower["response"][:300]  # type: ignore[arg-type]
        assert "slower than 20000 bytes per second" in detail_of(slower["response"])  # type: ignore[arg-type]
        assert slower["seconds"] < GRACE + WINDOW + 5  # type: ignore[operator]
        leftovers = [p.name for p in stored.parent.iterdir() if p.name != "honest.bin"]
        assert leftovers == []  # the cut upload left nothing behind


@needs_auth
def test_a_sign_in_body_larger_than_the_small_limit_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    with paced_server(tmp_path, "large", unauthenticated_max_body_bytes=4096) as server:
        with connect(server.port, timeout=10) as sock:
            sock.sendall(slow_head(5000))  # and not a byte of the body
            response = read_all(sock)
        assert status_of(response) == 413, response[:300]
        assert "at most 4096 bytes" in detail_of(response)
        with connect(server.port, timeout=10) as sock:
            sock.sendall(
                f"POST {LOGIN} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Transfer-Encoding: chunked\r\n\r\n".encode()
            )
            assert status_of(read_all(sock)) == 411
        # A small one goes through to the app, which answers it as always.
        form = b"username=nobody%40example.com&password=wrong"
        answer = raw_request(
            server.port,
            "POST",
            LOGIN,
            "Content-Type: application/x-www-form-urlencoded\r\n",
            body=form,
        )
        assert status_of(answer) == 401, answer[:300]


def holders(port: int, count: int, forwarded_for: str | None = None) -> list[socket.socket]:
    """`count` connections whose upload bodies never come: each stays open in the worker."""
    held = []
    for _ in range(count):
        sock = connect(port)
        sock.sendall(slow_head(1000, forwarded_for) if forwarded_for else slow_head(1000))
        held.append(sock)
    return held


def health(port: int, source: str = "127.0.0.1", head: str = "") -> bytes:
    """/healthz from `source` on a connection of its own; `head`: extra header lines."""
    with connect(port, source, timeout=10) as sock:
        sock.sendall(
            f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Connection: close\r\n\r\n".encode()
        )
        return read_all(sock)


def eventually_served(port: int, source: str = "127.0.0.1", head: str = "") -> bytes:
    """`health()`, retried while the worker may still count a connection just closed."""
    deadline = time.monotonic() + 10
    while status_of(response := health(port, source, head)) == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    return response


def test_connections_beyond_the_per_address_cap_are_refused_others_are_served(
    tmp_path: Path,
) -> None:
    cap = 3
    with paced_server(
        tmp_path,
        "cap",
        max_connections_per_address=cap,
        min_body_rate_bytes=0,
        unauthenticated_request_seconds=60,
    ) as server:
        held = holders(server.port, cap)
        try:
            time.sleep(0.5)  # the worker has taken all three
            refused = health(server.port)
            assert status_of(refused) == 429, refused[:300]
            assert f"at most {cap}" in detail_of(refused)
            assert b"Retry-After: 5" in refused
            assert status_of(eventually_served(server.port, SECOND_ADDRESS)) == 200
            held.pop().close()  # one of the three goes: the address may connect again
            assert status_of(eventually_served(server.port)) == 200
        finally:
            for sock in held:
                sock.close()
        assert "refused connections from 127.0.0.1" in server.log_tail(50)


def test_behind_trusted_proxies_the_cap_counts_the_forwarded_client(tmp_path: Path) -> None:
    cap = 2
    with paced_server(
        tmp_path,
        "proxied",
        max_connections_per_address=cap,
        min_body_rate_bytes=0,
        trusted_proxies=1,
    ) as server:
        held = holders(server.port, cap, forwarded_for="198.51.100.7")
        try:
            time.sleep(0.5)
            # The proxy's own address holds more than the cap: it is not what is counted.
            refused = health(server.port, head="X-Forwarded-For: 198.51.100.7\r\n")
            assert status_of(refused) == 429, refused[:300]
            other = eventually_served(server.port, head="X-Forwarded-For: 198.51.100.8\r\n")
            assert status_of(other) == 200, other[:300]
        finally:
            for sock in held:
                sock.close()
        again = eventually_served(server.port, head="X-Forwarded-For: 198.51.100.7\r\n")
        assert status_of(again) == 200
