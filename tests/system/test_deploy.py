"""The deployment files of `deploy/`, tried for real: nginx in front of two instances.

`deploy/nginx.conf` is used as shipped, with only its addresses, ports and certificate
paths pointed at this machine; a real nginx (the Makefile's `test` target installs it)
ends TLS on a free port in front of two `make run`-style instances on one data dir.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from deerflow_web.storage.paths import is_staging_name
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import auth_header_line
from tests.helpers import needs_auth
from tests.helpers import provision_server_user
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.live_server import ROOT
from tests.support.live_server import LiveServer
from tests.support.live_server import free_port
from tests.support.nginx import NGINX
from tests.support.nginx import run_nginx

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


PUBLIC_HOST = "files.example.com"
AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
MIB = 1024 * 1024


def site_config(upstreams: list[int], https_port: int, http_port: int, cert: Path) -> str:
    """deploy/nginx.conf with this machine's ports and certificate; nothing else changed."""
    text = (ROOT / "deploy" / "nginx.conf").read_text(encoding="utf-8")
    replacements = [
        (r"server 10\.0\.0\.11:2026", f"server 127.0.0.1:{upstreams[0]}"),
        (r"server 10\.0\.0\.12:2026", f"server 127.0.0.1:{upstreams[1]}"),
        (r"listen 80;", f"listen 127.0.0.1:{http_port};"),
        (r"listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
        (r"/etc/ssl/certs/files\.example\.com\.pem", str(cert.with_suffix(".pem"))),
        (r"/etc/ssl/private/files\.example\.com\.key", str(cert.with_suffix(".key"))),
    ]
    for pattern, value in replacements:
        text, count = re.subn(pattern, value, text)
        assert count == 1, f"deploy/nginx.conf no longer has exactly one {pattern!r}"
    return text


@dataclass
class Proxy:
    url: str
    port: int
    instances: tuple[LiveServer, LiveServer]
    certificate: Path  # the proxy's own, trusted by these clients

    @property
    def host(self) -> str:
        return f"{PUBLIC_HOST}:{self.port}"

    def request(
        self, method: str, path: str, *, token: bool = True, **kwargs: object
    ) -> requests.Response:
        """A request to the public name; with `token`, as the test user's API client."""
        headers = {"Host": self.host, **(AUTH if token else {})}
        headers.update(kwargs.pop("headers", {}))  # type: ignore[call-overload]
        return requests.request(
            method,
            self.url + path,
            headers=headers,
            verify=str(self.certificate),
            timeout=60,
            **kwargs,
        )


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data dir both instances serve; the tests that share it each use a thread of
    their own, and check only that one."""
    path = tmp_path_factory.mktemp("deploy") / "data"
    path.mkdir()
    return path


@pytest.fixture
def base_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The instances' data dir for a test that takes `proxy`; else a fresh one."""
    if "proxy" in request.fixturenames:
        return request.getfixturevalue("shared_dir")
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def running_proxy(shared_dir: Path) -> Iterator[Proxy]:
    """nginx with deploy/nginx.conf in front of two instances, started once for the
    module's tests (a certificate, two gunicorn servers and nginx each time cost more
    than most of the tests themselves)."""
    if NGINX is None:
        pytest.skip("nginx is not installed (`make test` installs it)")
    config = shared_dir.parent / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"server": {"trusted_proxies": 1, "allowed_hosts": [PUBLIC_HOST, "127.0.0.1"]}}
        )
    )
    provision_server_user(shared_dir)
    # gunicorn itself believes X-Forwarded-Proto from loopback; nginx on another machine
    # would not be believed: the scheme must come from server.trusted_proxies alone.
    untrusted = {"FORWARDED_ALLOW_IPS": "192.0.2.1"}
    instances = tuple(LiveServer(shared_dir, config=config, env=untrusted) for _ in range(2))
    prefix = shared_dir.parent / "nginx"
    prefix.mkdir()
    cert = prefix / "cert"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", f"/CN={PUBLIC_HOST}", "-keyout", str(cert.with_suffix(".key"))]
        + ["-addext", f"subjectAltName=DNS:{PUBLIC_HOST},IP:127.0.0.1"]
        + ["-out", str(cert.with_suffix(".pem"))],
        check=True,
        capture_output=True,
    )
    https_port, http_port = free_port(), free_port()
    site = prefix / "deerflow-web.conf"
    site.write_text(site_config([s.port for s in instances], https_port, http_port, cert))
    try:
        for instance in instances:
            instance.start()
        with run_nginx(prefix, site, https_port):
            yield Proxy(
                f"https://127.0.0.1:{https_port}",
                https_port,
                instances,  # type: ignore[arg-type]
                cert.with_suffix(".pem"),
            )
    finally:
        for instance in instances:
            instance.kill()


@pytest.fixture
def proxy(running_proxy: Proxy) -> Proxy:
    """The proxy and both instances up: one an earlier test killed is started again (on
    its port, as a supervisor would)."""
    for instance in running_proxy.instances:
        if instance.process is None:
            instance.start()
    return running_proxy


def test_uploads_and_downloads_through_nginx_reach_both_instances(
    proxy: Proxy, base_dir: Path
) -> None:
    sent = {f"f{i}.bin": os.urandom(50_000 + i) for i in range(12)}
    for name, data in sent.items():
        answer = proxy.request("POST", "/api/threads/N/uploads", files={"files": (name, data)})
        assert answer.status_code == 200, answer.text
    listing = proxy.request("GET", "/api/threads/N/uploads/list").json()
    assert {f["filename"]: f["sha256"] for f in listing["files"]} == {
        name: hashlib.sha256(data).hexdigest() for name, data in sent.items()
    }
    big = os.urandom(20 * MIB)
    assert proxy.request("POST", "/api/threads/N/uploads", files={"files": ("big.bin", big)}).ok
    path = "/api/threads/N/artifacts/mnt/user-data/uploads/big.bin"
    download = proxy.request("GET", path)
    assert download.status_code == 200 and download.content == big
    ranged = proxy.request("GET", path, headers={"Range": "bytes=1000-1999"})
    assert ranged.status_code == 206 and ranged.content == big[1000:2000]

    # One instance gone: nginx sends every request to the other, uploads included.
    proxy.instances[0].kill()
    for index in range(6):
        answer = proxy.request(
            "POST", "/api/threads/N/uploads", files={"files": (f"later{index}.txt", b"x")}
        )
        assert answer.status_code == 200, answer.text
    names = {
        f["filename"] for f in proxy.request("GET", "/api/threads/N/uploads/list").json()["files"]
    }
    assert {f"later{i}.txt" for i in range(6)} <= names


def test_an_upload_streams_through_nginx(proxy: Proxy, base_dir: Path) -> None:
    """The instance writes the first MiBs while the client has not sent the rest: nginx
    does not hold the body back (`proxy_request_buffering off`)."""
    size = 24 * MIB
    data = os.urandom(size)
    head = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="stream.bin"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    tail = b"\r\n--XYZ--\r\n"
    context = ssl.create_default_context(cafile=proxy.certificate)
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=60)
    with context.wrap_socket(raw, server_hostname=PUBLIC_HOST) as sock:
        sock.sendall(
            f"POST /api/threads/S/uploads HTTP/1.1\r\nHost: {proxy.host}\r\n{auth_header_line()}"
            "Content-Type: multipart/form-data; boundary=XYZ\r\n"
            f"Content-Length: {len(head) + size + len(tail)}\r\n\r\n".encode()
            + head
            + data[: 4 * MIB]
        )
        folder = uploads_dir(base_dir, "S")

        def written() -> int:
            names = [n for n in os.listdir(folder) if is_staging_name(n)] if folder.exists() else []
            return sum((folder / n).stat().st_size for n in names)

        assert wait_until(lambda: written() >= 2 * MIB, timeout=20)  # the rest is not sent yet
        sock.sendall(data[4 * MIB :] + tail)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert (folder / "stream.bin").read_bytes() == data


def test_the_app_sees_the_clients_scheme_host_and_port(proxy: Proxy) -> None:
    """With `server.trusted_proxies: 1` a browser's same-origin request through the proxy is
    accepted only under the public origin (https, the public name and port)."""
    files = {"files": ("o.txt", b"origin")}
    same = proxy.request(
        "POST", "/api/threads/O/uploads", files=files, headers={"Origin": f"https://{proxy.host}"}
    )
    assert same.status_code == 200, same.text
    for wrong in (f"http://{proxy.host}", f"https://{PUBLIC_HOST}:{proxy.instances[1].port}"):
        answer = proxy.request(
            "POST", "/api/threads/O/uploads", files=files, headers={"Origin": wrong}
        )
        assert answer.status_code == 403, wrong
        assert "Cross-site" in answer.json()["detail"]


@needs_auth
def test_sessions_through_nginx_get_secure_cookies(proxy: Proxy) -> None:
    answer = proxy.request(
        "POST",
        "/api/v1/auth/login/local",
        data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
        token=False,
    )
    assert answer.status_code == 200, answer.text
    cookies = answer.headers["Set-Cookie"]
    session = next(
        c for c in answer.raw.headers.getlist("Set-Cookie") if c.startswith("access_token=")
    )
    assert "Secure" in session, cookies
    me = proxy.request(
        "GET", "/api/v1/auth/me", token=False, headers={"Cookie": session.split(";")[0]}
    )
    assert me.status_code == 200 and me.json()["email"] == TEST_EMAIL


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("name", ["deerflow-web.service", "deerflow-worker.service"])
def test_the_systemd_unit_verifies(tmp_path: Path, name: str) -> None:
    """`systemd-analyze verify` on each unit of deploy/, its paths pointed here."""
    unit = (ROOT / "deploy" / name).read_text(encoding="utf-8")
    assert unit.count("/opt/deerflow-web") >= 3
    local = tmp_path / name
    local.write_text(unit.replace("/opt/deerflow-web", str(ROOT)), encoding="utf-8")
    result = subprocess.run(
        ["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert name not in result.stderr, result.stderr  # no warning about it
