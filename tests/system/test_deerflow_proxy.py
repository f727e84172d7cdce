"""Behind a proxy configured as DeerFlow's own nginx (`docker/nginx/nginx.conf`), with no setting.

That proxy passes the browser's `Host` through with its port (`$http_host`), sends
`X-Forwarded-For` and `-Proto` but no `X-Forwarded-Host` or `-Port`, and streams uploads
(`proxy_request_buffering off`). The app, bound on another port, must still recognise a
browser's same-origin request (issue 25, item 3), and still refuse other origins and
other hosts. The requests are the ones DeerFlow's client sends: a cookie jar, `Origin`,
and `X-CSRF-Token` copied from the `csrf_token` cookie.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.helpers import AUTH_ON
from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import attach_on_failure
from tests.helpers import provision_server_user
from tests.helpers import uploads_dir
from tests.helpers import user_data_dir
from tests.support.live_server import LiveServer
from tests.support.live_server import free_port
from tests.support.nginx import NGINX
from tests.support.nginx import run_nginx


def deerflow_site(port: int, upstream: int) -> str:
    """The forwarding rules of DeerFlow's nginx for the gateway, on this machine's ports."""
    forward = f"""
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $http_host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $forwarded_proto;"""
    return f"""
    map $http_x_forwarded_proto $forwarded_proto {{
        default $scheme;
        "~*^https" https;
    }}
    server {{
        listen 127.0.0.1:{port};
        server_name _;
        proxy_buffering off;
        proxy_cache off;
        location ~ ^/api/threads/[^/]+/uploads {{{forward}
            client_max_body_size 100M;
            proxy_request_buffering off;
        }}
        location ~ ^/api/threads {{{forward}
        }}
        location /api/ {{{forward}
        }}
    }}
"""


@dataclass
class Browser:
    """DeerFlow's client in a browser at the proxy's origin: cookies, Origin, CSRF header."""

    url: str
    origin: str
    http: requests.Session

    def send(
        self, method: str, path: str, origin: str | None = None, **kwargs
    ) -> requests.Response:
        headers = {"Origin": origin or self.origin, **kwargs.pop("headers", {})}
        csrf = self.http.cookies.get("csrf_token")
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf
        return self.http.request(method, self.url + path, headers=headers, timeout=60, **kwargs)


@dataclass
class Proxied:
    """The app's server behind DeerFlow's nginx, and the logs both write."""

    url: str
    base_dir: Path
    logs: dict[str, Path]


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    """One server behind one nginx for the module: each test signs in afresh and uses
    threads of its own."""
    if NGINX is None:
        pytest.skip("nginx is not installed (`make test` installs it)")
    root = tmp_path_factory.mktemp("proxied")
    base_dir = root / "data"
    base_dir.mkdir()
    provision_server_user(base_dir)
    log = root / "server.log"
    server = LiveServer(base_dir, log=log)  # no config file: the defaults are enough
    port = free_port()
    while port == server.port:  # both were free, neither is bound yet
        port = free_port()
    prefix = root / "nginx"
    prefix.mkdir()
    logs = {"server log": log}
    logs |= {f"nginx {name}": prefix / name for name in ("stderr.log", "error.log", "access.log")}
    site = prefix / "deerflow.conf"
    site.write_text(deerflow_site(port, server.port))
    with server, run_nginx(prefix, site, port):
        yield Proxied(f"http://127.0.0.1:{port}", base_dir, logs)


@pytest.fixture
def base_dir(proxied: Proxied) -> Path:
    """The proxied server's data dir."""
    return proxied.base_dir


@pytest.fixture
def browser(request: pytest.FixtureRequest, proxied: Proxied) -> Iterator[Browser]:
    """A fresh client through nginx, signed in when accounts are on; a failing test shows
    both processes' logs."""
    for title, path in proxied.logs.items():
        attach_on_failure(request, title, path)
    with requests.Session() as http:
        browser = Browser(proxied.url, proxied.url, http)
        if AUTH_ON:
            login = browser.send(
                "POST",
                "/api/v1/auth/login/local",
                data={"username": TEST_EMAIL, "password": TEST_PASSWORD},
            )
            assert login.status_code == 200, login.text
            assert http.cookies.get("csrf_token")
        yield browser


def test_deerflow_ui_changes_files_through_deerflows_nginx(
    browser: Browser, base_dir: Path
) -> None:
    upload = browser.send(
        "POST", "/api/threads/P/uploads", files={"files": ("notes.txt", b"hello")}
    )
    assert upload.status_code == 200, upload.text
    renamed = browser.send(
        "POST", "/api/threads/P/uploads/notes.txt/rename", json={"new_name": "kept.txt"}
    )
    assert renamed.status_code == 200, renamed.text
    assert (uploads_dir(base_dir, "P") / "kept.txt").read_bytes() == b"hello"
    second = browser.send("POST", "/api/threads/P/uploads", files={"files": ("gone.txt", b"x")})
    assert second.status_code == 200, second.text
    deleted = browser.send("DELETE", "/api/threads/P/uploads/gone.txt")
    assert deleted.status_code == 200, deleted.text
    assert sorted(p.name for p in uploads_dir(base_dir, "P").iterdir()) == ["kept.txt"]
    outputs = user_data_dir(base_dir, "P") / "outputs"
    outputs.mkdir()
    (outputs / "answer.md").write_bytes(b"draft")
    edited = browser.send(  # DeerFlow's artifact editor
        "PUT",
        "/api/threads/P/artifacts/mnt/user-data/outputs/answer.md",
        json={"content": "final", "expected_sha256": hashlib.sha256(b"draft").hexdigest()},
    )
    assert edited.status_code == 200, edited.text
    assert (outputs / "answer.md").read_bytes() == b"final"


def test_deerflow_ui_keeps_its_thread_records_through_deerflows_nginx(
    browser: Browser, base_dir: Path
) -> None:
    me = browser.send("GET", "/api/v1/auth/me")  # every page of DeerFlow's UI asks first
    assert me.status_code == 200, me.text
    assert me.json()["email"] == (TEST_EMAIL if AUTH_ON else "default@test.local")
    created = browser.send("POST", "/api/threads", json={"metadata": {"agent": "research"}})
    assert created.status_code == 200, created.text
    thread = created.json()
    assert thread["status"] == "idle" and thread["metadata"] == {"agent": "research"}
    thread_id = thread["thread_id"]
    found = browser.send(
        "POST", "/api/threads/search", json={"metadata": {"agent": "research"}, "limit": 10}
    )
    assert found.status_code == 200, found.text
    assert [t["thread_id"] for t in found.json()] == [thread_id]
    patched = browser.send(
        "PATCH", f"/api/threads/{thread_id}", json={"metadata": {"stage": "draft"}}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["metadata"] == {"agent": "research", "stage": "draft"}
    upload = browser.send(
        "POST", f"/api/threads/{thread_id}/uploads", files={"files": ("a.txt", b"a")}
    )
    assert upload.status_code == 200, upload.text
    deleted = browser.send("DELETE", f"/api/threads/{thread_id}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["success"] is True
    assert not uploads_dir(base_dir, thread_id).exists()
    assert browser.send("GET", f"/api/threads/{thread_id}").status_code == 404


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "https://127.0.0.1:{port}",  # another scheme is another origin
        "http://127.0.0.1:1",  # another port of the same host
        "http://localhost:{port}",  # another allowed name is not the one addressed
        "null",
    ],
)
def test_other_origins_are_still_refused_through_it(
    browser: Browser, base_dir: Path, origin: str
) -> None:
    origin = origin.format(port=browser.url.rsplit(":", 1)[1])
    thread = f"Q-{uuid.uuid4().hex[:12]}"  # each origin's own: the server is the module's
    uploads = f"/api/threads/{thread}/uploads"
    seeded = browser.send("POST", uploads, files={"files": ("a.txt", b"a")})
    assert seeded.status_code == 200, seeded.text
    attempts = [
        browser.send("POST", uploads, origin, files={"files": ("b.txt", b"b")}),
        browser.send("POST", f"{uploads}/a.txt/rename", origin, json={"new_name": "c"}),
        browser.send("DELETE", f"{uploads}/a.txt", origin),
    ]
    for answer in attempts:
        assert answer.status_code == 403, answer.text
        assert "Cross-site" in answer.json()["detail"]
    assert [p.name for p in uploads_dir(base_dir, thread).iterdir()] == ["a.txt"]


def test_a_rebinding_host_is_still_refused_through_it(browser: Browser, base_dir: Path) -> None:
    """A page on a rebinding name addresses that name: its Origin matches its Host, and the
    Host is not served."""
    port = browser.url.rsplit(":", 1)[1]
    answer = browser.send(
        "POST",
        "/api/threads/R/uploads",
        f"http://rebind.evil.example:{port}",
        headers={"Host": f"rebind.evil.example:{port}"},
        files={"files": ("a.txt", b"a")},
    )
    assert answer.status_code == 400, answer.text
    assert "Unknown host" in answer.json()["detail"]
    assert not uploads_dir(base_dir, "R").exists()
