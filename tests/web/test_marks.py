"""The exceptions to the app-wide gates are declared on the views themselves (web/marks.py).

The lists below are what SPEC 7.3 makes public, CSRF-exempt or open during a password
change; they are read back from the views' marks, so a mark that goes missing (or one put
on a view by mistake) fails here, and a route added later without a mark is gated.
"""

from __future__ import annotations

from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.web import marks
from deerflow_web.web import security
from deerflow_web.web.marks import endpoint_has
from tests.helpers import AUTH_ON
from tests.helpers import needs_auth

PUBLIC_WITH_ACCOUNTS = {
    "auth_api.setup_status",
    "auth_api.initialize",
    "auth_api.login_local",
    "auth_api.register",
    "auth_api.logout",
    "account_pages.login",
    "account_pages.setup",
}
PUBLIC_IN_BOTH_MODES = {
    "static",
    "pages.set_language",
    "api_docs.openapi_json",
    "api_docs.api_docs",
    # share links open without an account (web/files/share.py)
    "share.open_link",
    "share.unlock_link",
    "share.link_file",
    "share.link_zip",
}


def marked(app: Flask, mark: str) -> set[str]:
    return {endpoint for endpoint in app.view_functions if endpoint_has(app, endpoint, mark)}


def test_public_views_are_those_of_the_spec(app: Flask) -> None:
    expected = PUBLIC_IN_BOTH_MODES | (PUBLIC_WITH_ACCOUNTS if AUTH_ON else set())
    assert marked(app, marks.PUBLIC) == expected


def test_health_probes_are_marked_and_nothing_else(app: Flask) -> None:
    assert marked(app, marks.PROBE) == {"health.healthz", "health.readyz"}


@needs_auth
def test_csrf_exempt_views_are_deerflows_four_auth_routes(app: Flask) -> None:
    assert marked(app, marks.CSRF_EXEMPT) == {
        "auth_api.initialize",
        "auth_api.login_local",
        "auth_api.register",
        "auth_api.logout",
    }


@needs_auth
def test_views_open_during_a_password_change(app: Flask) -> None:
    assert marked(app, marks.BEFORE_PASSWORD_CHANGE) == {
        "account_pages.account",
        "account_pages.change_password",
        "account_pages.logout",
        "auth_api.me",
        "auth_api.change_password",
    }
    assert marked(app, marks.BEFORE_PASSWORD_CHANGE_BY_TOKEN) == {"auth_api.change_password"}


def test_unknown_endpoints_carry_no_mark(app: Flask) -> None:
    assert not endpoint_has(app, None, marks.PUBLIC)
    assert not endpoint_has(app, "no.such_view", marks.PUBLIC)
    assert not endpoint_has(app, "static", marks.CSRF_EXEMPT)


@needs_auth
def test_a_route_added_without_a_mark_needs_signing_in(make_app) -> None:
    app = make_app()
    app.add_url_rule("/added-later", "added_later", lambda: "secret")
    app.add_url_rule("/added-later-public", "added_public", marks.public(lambda: "open"))
    anonymous = app.test_client(user_id=None)
    refused = anonymous.get("/added-later")
    assert refused.status_code == 302 and "/login" in refused.headers["Location"]
    assert anonymous.get("/added-later-public").get_data(as_text=True) == "open"


def test_the_origin_check_runs_once_for_an_api_thread_route(
    client: FlaskClient, monkeypatch
) -> None:
    calls: list[str] = []
    original = security.refuse_cross_site

    def counting(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        calls.append("checked")
        original(*args, **kwargs)

    monkeypatch.setattr(security, "refuse_cross_site", counting)
    client.post("/api/threads/t-1/uploads", data={}, content_type="multipart/form-data")
    assert calls == ["checked"]
    calls.clear()
    client.delete("/api/threads/t-1/uploads/nothing.txt")
    assert calls == ["checked"]


def test_a_cross_site_api_request_is_refused_before_its_thread_is_looked_up(
    client: FlaskClient,
) -> None:
    response = client.delete(
        "/api/threads/no-such-thread/uploads/a.txt", headers={"Origin": "https://evil.example"}
    )
    assert response.status_code == 403
    assert "Cross-site request refused" in response.get_json()["detail"]
