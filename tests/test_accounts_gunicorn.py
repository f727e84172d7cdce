"""Lockouts and sessions hold across real server processes (SPEC 7.5, 9).

Two gunicorn servers with two workers each share one data dir, as two instances behind a
load balancer would: failures counted by one are seen by the other, and a session opened
on one is valid on the other and ends on both.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from conftest import TEST_EMAIL
from conftest import TEST_PASSWORD
from conftest import needs_auth
from conftest import provision_server_user

pytestmark = needs_auth

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(
    port: int, method: str, path: str, body: str = "", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str, list[str]]:
    """One request on a new connection (gunicorn hands each to whichever worker accepts)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read().decode()
        cookies = response.headers.get_all("Set-Cookie") or []
        return response.status, dict(response.headers), data, cookies
    finally:
        connection.close()


def start(base_dir: Path, port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--worker-class",
            "gthread",
            "--workers",
            "2",
            "--threads",
            "2",
            "--bind",
            f"127.0.0.1:{port}",
            "--no-control-socket",
            "app:app",
        ],
        cwd=ROOT,
        env={**os.environ, "DEER_FLOW_HOME": str(base_dir)},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/api/v1/auth/setup-status")[0] == 200:
                return process
        except OSError:
            time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    raise AssertionError("server did not start")


def login(port: int, password: str) -> tuple[int, dict[str, str], list[str]]:
    status, headers, _body, cookies = request(
        port,
        "POST",
        "/api/v1/auth/login/local",
        urlencode({"username": TEST_EMAIL, "password": password}),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    return status, headers, cookies


@pytest.fixture
def servers(base_dir: Path):
    provision_server_user(base_dir)
    ports = [free_port(), free_port()]
    processes = [start(base_dir, port) for port in ports]
    yield ports
    for process in processes:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_lockout_and_sessions_are_shared_by_every_process(servers: list[int]) -> None:
    first, second = servers
    status, _headers, cookies = login(second, TEST_PASSWORD)
    assert status == 200
    session = next(c.split(";", 1)[0] for c in cookies if c.startswith("session="))
    status, _headers, body, _cookies = request(
        first, "GET", "/api/v1/auth/me", headers={"Cookie": session}
    )
    assert status == 200 and json.loads(body)["email"] == TEST_EMAIL  # opened on the other one

    for port in (first, first, second, first, second):  # five failures, spread over processes
        assert login(port, "wrong password")[0] == 401
    for port in (first, second):
        status, headers, _cookies = login(port, TEST_PASSWORD)
        assert status == 429
        assert 1 <= int(headers["Retry-After"]) <= 300

    csrf = {"Cookie": session}
    status, _headers, _body, _cookies = request(first, "POST", "/api/v1/auth/logout", headers=csrf)
    assert status == 200
    for port in (first, second):
        assert request(port, "GET", "/api/v1/auth/me", headers={"Cookie": session})[0] == 401
