"""The app answers only for the hosts it serves; the API's origin check uses them (issue 9).

A page on a rebinding site sends its own name as `Host` and a matching `Origin`: every
request gets 400 and nothing changes.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from deerflow_web.settings import allowed_hosts_from
from deerflow_web.settings import load_settings
from deerflow_web.web.security import host_allowed
from deerflow_web.web.security import own_origins
from tests.helpers import UploadActions

EVIL = "rebind.evil.example"


@pytest.fixture
def seeded(uploads: UploadActions) -> UploadActions:
    assert uploads.upload("T", (b"keep", "keep.txt")).status_code == 200
    return uploads


def test_rebinding_host_is_refused_everywhere(client, seeded: UploadActions) -> None:
    headers = {"Host": EVIL}
    listing = client.get("/api/threads/T/uploads/list", headers=headers)
    assert listing.status_code == 400
    assert "Unknown host" in listing.get_json()["detail"]
    assert b"keep.txt" not in listing.data
    deleted = client.delete("/api/threads/T/uploads/keep.txt", headers=headers)
    assert deleted.status_code == 400 and "Unknown host" in deleted.get_json()["detail"]
    with client.get(
        "/api/threads/T/artifacts/mnt/user-data/uploads/keep.txt", headers=headers
    ) as artifact:
        assert artifact.status_code == 400 and artifact.data != b"keep"
    page = client.get("/threads/T", headers=headers)
    assert page.status_code == 400 and page.mimetype == "text/html"
    assert b"Unknown host" in page.data and b"keep.txt" not in page.data
    unknown_route = client.get("/no/such/page", headers=headers)
    assert unknown_route.status_code == 400
    assert seeded.names("T") == ["keep.txt"]


def test_matching_origin_with_a_rebinding_host_is_refused(client, seeded: UploadActions) -> None:
    headers = {"Host": f"{EVIL}:2026", "Origin": f"http://{EVIL}:2026"}
    assert client.delete("/api/threads/T/uploads/keep.txt", headers=headers).status_code == 400
    upload = client.post(
        "/api/threads/T/uploads",
        data={"files": [(io.BytesIO(b"x"), "new.txt")]},
        headers=headers,
    )
    assert upload.status_code == 400
    assert seeded.names("T") == ["keep.txt"]


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:2026", "127.0.0.1:2026", "[::1]:2026", "LOCALHOST"]
)
def test_default_hosts_are_served(client, host: str) -> None:
    response = client.get("/api/threads/T/uploads/list", headers={"Host": host})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "host",
    ["", "localhost.evil.example", "127.0.0.1.nip.io", "[::2]", "local host", "a@localhost"],
)
def test_other_hosts_are_not(client, host: str) -> None:
    response = client.get("/api/threads/T/uploads/list", headers={"Host": host})
    assert response.status_code == 400


def test_origin_is_compared_with_the_served_origins(make_app) -> None:
    client = make_app().test_client()
    base = "http://127.0.0.1:2026"

    def delete(origin: str) -> int:
        return client.delete(
            "/api/threads/T/uploads/a.txt", base_url=base, headers={"Origin": origin}
        ).status_code

    assert delete("http://127.0.0.1:2026") == 404  # same origin: passes to the route
    assert delete("http://localhost:2026") == 404  # another name of this server
    assert delete("http://[::1]:2026") == 404
    assert delete("http://127.0.0.1:3000") == 403  # another port is another origin
    assert delete("https://127.0.0.1:2026") == 403
    assert delete("null") == 403
    assert delete(f"http://{EVIL}:2026") == 403


def test_configured_hosts_and_origins_behind_a_proxy(make_app, tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    server = {
        "allowed_hosts": ["files.example.com", ".tenant.example"],
        "allowed_origins": ["https://files.example.com/"],
    }
    path.write_text(yaml.safe_dump({"server": server}), encoding="utf-8")
    client = make_app(CONFIG_PATH=str(path)).test_client()

    def upload(host: str, origin: str | None = None) -> int:
        headers = {"Host": host} | ({"Origin": origin} if origin else {})
        data = {"files": [(io.BytesIO(b"x"), "a.txt")]}
        return client.post("/api/threads/T/uploads", data=data, headers=headers).status_code

    # The proxy speaks plain HTTP to the app; the browser's origin is the public https one.
    assert upload("files.example.com", "https://files.example.com") == 200
    assert upload("files.example.com", "http://files.example.com") == 200  # as served here
    assert upload("files.example.com", "https://evil.example") == 403
    assert upload("a.tenant.example", None) == 200
    assert upload("tenant.example", None) == 200
    assert upload("localhost", None) == 400  # the list replaces the loopback defaults
    assert upload("xtenant.example", None) == 400


@pytest.mark.parametrize(
    ("server", "bind", "expected"),
    [
        ({}, "", ("localhost", "127.0.0.1", "[::1]")),
        ({}, "127.0.0.1", ("localhost", "127.0.0.1", "[::1]")),
        ({}, "10.0.0.5", ("localhost", "127.0.0.1", "[::1]", "10.0.0.5")),
        ({}, "0.0.0.0", ("localhost", "127.0.0.1", "[::1]")),  # a wildcard names no host
        ({}, "::", ("localhost", "127.0.0.1", "[::1]")),
        ({}, "fd00::1", ("localhost", "127.0.0.1", "[::1]", "[fd00::1]")),
        ({"allowed_hosts": "Files.Example.com"}, "", ("files.example.com",)),
        ({"allowed_hosts": ["a.example", "::1"]}, "box", ("a.example", "[::1]", "box")),
    ],
)
def test_allowed_hosts_setting(server: dict, bind: str, expected: tuple[str, ...]) -> None:
    assert allowed_hosts_from(server, {"DEER_FLOW_BIND_HOST": bind}) == expected


def test_make_run_passes_the_bound_host(tmp_path: Path) -> None:
    settings = load_settings(tmp_path, environ={"DEER_FLOW_BIND_HOST": "192.168.1.20"})
    assert "192.168.1.20" in settings.allowed_hosts
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text(encoding="utf-8")
    assert "DEER_FLOW_BIND_HOST=$(HOST)" in makefile


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("localhost", True),
        ("localhost.", True),
        ("[::1]:80", True),
        ("sub.tenant.example", True),
        ("tenant.example:8080", True),
        ("eviltenant.example", False),
        ("localhost:99999999", False),
        ("localhost:2026:1", False),
        (None, False),
    ],
)
def test_host_allowed(header: str | None, allowed: bool) -> None:
    hosts = ("localhost", "[::1]", ".tenant.example")
    assert host_allowed(header, hosts) is allowed


def test_own_origins() -> None:
    hosts = ("localhost", "[::1]", ".tenant.example")
    assert own_origins(hosts, "http", "80") == {"http://localhost", "http://[::1]"}
    assert own_origins(hosts, "https", "8443") == {
        "https://localhost:8443",
        "https://[::1]:8443",
    }


def test_origin_matching_an_allowed_host_as_addressed(make_app) -> None:
    """A proxy that passes the browser's `Host` (with its own port) through, and nothing
    else, as DeerFlow's nginx does: the request's own origin is accepted, and only it."""
    client = make_app().test_client()

    def delete(host: str, origin: str) -> int:
        return client.delete(
            "/api/threads/T/uploads/a.txt",
            base_url="http://127.0.0.1:2026",  # the app's own bound port
            headers={"Host": host, "Origin": origin},
        ).status_code

    assert delete("localhost:2027", "http://localhost:2027") == 404  # passes to the route
    assert delete("LOCALHOST:2027", "http://localhost:2027") == 404
    assert delete("localhost:80", "http://localhost") == 404  # default port, as browsers write
    assert delete("localhost", "http://localhost:80") == 404
    assert delete("localhost:2027", "http://localhost:2028") == 403
    assert delete("localhost:2027", "https://localhost:2027") == 403
    assert delete("localhost:2027", "http://127.0.0.1:2027") == 403
    assert delete("localhost:2027", "http://evil.example:2027") == 403
    assert delete(f"{EVIL}:2027", f"http://{EVIL}:2027") == 400
