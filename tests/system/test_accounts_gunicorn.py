"""Session cookies and lifetimes through a real gunicorn process (`make run`'s worker).

What the test client cannot show: the `Set-Cookie` lines a browser really receives, and a
session that really ends with time on the server's own clock, with every request seen by
a separately started process.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
import yaml

from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import needs_auth
from tests.support.live_server import LiveServer
from tests.support.live_server import start_server

pytestmark = needs_auth


def request(
    server: LiveServer, method: str, path: str, *, body: str = "", headers: dict | None = None
) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    sent = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
    if body:
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    connection.request(method, path, body=body.encode(), headers=sent)
    response = connection.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    connection.close()
    return response


def set_cookies(response: http.client.HTTPResponse) -> dict[str, str]:
    lines = [value for name, value in response.getheaders() if name.lower() == "set-cookie"]
    return {line.split("=", 1)[0]: line for line in lines}


def sign_in(server: LiveServer, headers: dict | None = None, **form: str):
    body = urlencode({"username": TEST_EMAIL, "password": TEST_PASSWORD, **form})
    response = request(server, "POST", "/api/v1/auth/login/local", body=body, headers=headers)
    assert response.status == 200, response.status
    return response


def me(server: LiveServer, cookie: str) -> http.client.HTTPResponse:
    """`/me` with the `access_token` cookie only, as DeerFlow's page guard asks."""
    return request(server, "GET", "/api/v1/auth/me", headers={"Cookie": f"access_token={cookie}"})


def cookie_value(line: str) -> str:
    return line.split(";", 1)[0].split("=", 1)[1]


def write_config(tmp_path: Path, **sections: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(sections), encoding="utf-8")
    return path


def test_cookie_attributes_from_a_real_server(base_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, server={"trusted_proxies": 1})
    with start_server(base_dir, config) as server:
        remembered = set_cookies(sign_in(server))
        access = remembered["access_token"]
        for attribute in ("HttpOnly", "SameSite=Lax", "Max-Age=604800", "Path=/"):
            assert attribute in access, access
        assert "Secure" not in access and "Domain" not in access
        flag = remembered["deerflow_session_persistent"]
        assert cookie_value(flag) == "1" and "Max-Age=604800" in flag and "HttpOnly" in flag
        csrf = remembered["csrf_token"]
        assert "SameSite=Strict" in csrf and "Max-Age=604800" in csrf and "HttpOnly" not in csrf
        assert me(server, cookie_value(access)).status == 200

        browser = set_cookies(sign_in(server, remember_me="false"))
        assert "Max-Age" not in browser["access_token"]
        assert "Expires" not in browser["access_token"]
        assert cookie_value(browser["deerflow_session_persistent"]) == "0"

        https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
        secure = set_cookies(sign_in(server, headers=https))
        for name in ("access_token", "deerflow_session_persistent", "csrf_token"):
            assert "Secure" in secure[name], secure[name]
        page = set_cookies(request(server, "GET", "/login", headers=https))
        assert "Secure" in page["__Host-session"] and "Path=/" in page["__Host-session"]
        assert "session" not in page


def test_idle_timeout_and_absolute_lifetime_on_a_real_server(
    base_dir: Path, tmp_path: Path
) -> None:
    """A browser session ends after its idle time (polling it does not keep it alive: the
    last request is written once a minute), a remembered one at its absolute end."""
    idle, lifetime = 3.6, 8.64  # 0.001 hours and 0.0001 days
    config = write_config(
        tmp_path, auth={"session_idle_hours": 0.001, "session_lifetime_days": 0.0001}
    )
    with start_server(base_dir, config) as server:
        started = time.monotonic()
        browser = cookie_value(set_cookies(sign_in(server, remember_me="false"))["access_token"])
        remembered_line = set_cookies(sign_in(server))["access_token"]
        assert "Max-Age=9" in remembered_line  # round(8.64)
        remembered = cookie_value(remembered_line)
        assert me(server, browser).status == 200 and me(server, remembered).status == 200

        def until_refused(cookie: str) -> float:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                answer = me(server, cookie)
                if answer.status == 401:
                    assert json.loads(answer.body)["detail"]["code"] == "token_expired"
                    return time.monotonic() - started
                assert answer.status == 200
                time.sleep(0.2)
            pytest.fail("the session never ended")

        browser_ended = until_refused(browser)
        assert browser_ended >= idle
        if browser_ended < lifetime - 1:  # a loaded machine may have been slower
            assert me(server, remembered).status == 200  # no idle timeout for this one
        remembered_ended = until_refused(remembered)
        assert remembered_ended >= lifetime
        answer = request(
            server, "GET", "/api/v1/auth/me", headers={"Cookie": f"access_token={remembered}"}
        )
        assert answer.status == 401  # gone for good: the row was deleted
        assert json.loads(answer.body)["detail"]["code"] == "token_invalid"
