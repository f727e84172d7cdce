"""Share links through the test client: made by the owner, opened by anyone holding them,
ended by time or by revocation, rate limited, and served by the artifact route's rules."""

from __future__ import annotations

import hashlib
import re

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from deerflow_web.services.files import share_links as share_module
from deerflow_web.storage.database import share_links as share_table
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import UploadActions
from tests.helpers import thread_ref

THREAD = "share-thread"


def anonymous(app: Flask) -> FlaskClient:
    return app.test_client(user_id=None)


def fetched(client: FlaskClient, url: str):  # noqa: ANN201 - a test response
    """GET, read whole and closed (a file response holds its file open until then)."""
    response = client.get(url)
    response.get_data()
    response.close()
    return response


def make_link(client: FlaskClient, *names: str, hours: str = "24", password: str = "") -> str:
    response = client.post(
        f"/threads/{THREAD}/share",
        data={"filenames": list(names), "hours": hours, "password": password},
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Cache-Control"] == "private, no-store"
    match = re.search(r'id="share-url"[^>]*value="([^"]+)"', response.get_data(as_text=True))
    assert match is not None
    return match.group(1).removeprefix("http://localhost")


@pytest.fixture
def seeded(uploads: UploadActions) -> UploadActions:
    uploads.upload(THREAD, (b"hello", "a.txt"), ("图".encode() * 10, "报告.txt"))
    uploads.upload(THREAD, (b"<script>alert(1)</script>", "page.html"))
    return uploads


def test_a_link_opens_without_an_account(app: Flask, client: FlaskClient, seeded) -> None:
    path = make_link(client, "a.txt", "报告.txt")
    visitor = anonymous(app)
    page = visitor.get(path)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "a.txt" in html and "报告.txt" in html
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert page.headers["Cache-Control"] == "private, no-store"
    first = fetched(visitor, f"{path}/0")
    assert first.get_data() == b"hello"
    assert "sandbox" in first.headers["Content-Security-Policy"]
    second = fetched(visitor, f"{path}/1?download=1")
    assert second.get_data() == "图".encode() * 10
    assert second.headers["Content-Disposition"].startswith("attachment;")
    assert visitor.get(f"{path}/2").status_code == 404  # not part of the link


def test_active_types_are_only_ever_downloads(app: Flask, client: FlaskClient, seeded) -> None:
    path = make_link(client, "page.html")
    response = fetched(anonymous(app), f"{path}/0")
    assert response.headers["Content-Disposition"].startswith("attachment;")
    assert "sandbox" in response.headers["Content-Security-Policy"]


def test_only_the_hash_of_the_secret_is_stored(app: Flask, client: FlaskClient, seeded) -> None:
    path = make_link(client, "a.txt")
    token = path.removeprefix("/s/")
    engine = app.extensions[EXTENSION_KEY].engine
    with engine.connect() as db:
        stored = db.execute(select(share_table.c.token_hash)).scalars().all()
    assert stored == [hashlib.sha256(token.encode()).hexdigest()]


def test_a_password_is_asked_first(app: Flask, client: FlaskClient, seeded) -> None:
    path = make_link(client, "a.txt", password="open sesame")
    visitor = anonymous(app)
    page = visitor.get(path)
    assert 'type="password"' in page.get_data(as_text=True)
    assert "a.txt" not in page.get_data(as_text=True)
    assert visitor.get(f"{path}/0").status_code == 302  # back to the password
    wrong = visitor.post(path, data={"password": "nope"})
    assert wrong.status_code == 403
    assert visitor.get(f"{path}/0").status_code == 302
    right = visitor.post(path, data={"password": "open sesame"})
    assert right.status_code == 302
    assert fetched(visitor, f"{path}/0").get_data() == b"hello"
    assert anonymous(app).get(f"{path}/0").status_code == 302  # the cookie, not the link


def test_expired_revoked_and_unknown_links_answer_alike(
    app: Flask, client: FlaskClient, seeded
) -> None:
    expired = make_link(client, "a.txt", hours="1")
    revoked = make_link(client, "a.txt")
    services = app.extensions[EXTENSION_KEY]
    (link,) = [
        link
        for link in services.share_links.list_for_thread(thread_ref(THREAD))
        if link.expires_at - link.created_at > 3600
    ]
    assert client.post(f"/threads/{THREAD}/share/{link.id}/revoke").status_code == 302
    real_clock = services.share_links._clock
    services.share_links._clock = lambda: real_clock() + 3601
    visitor = anonymous(app)
    answers = [visitor.get(p) for p in (expired, revoked, "/s/no-such-link")]
    assert {a.status_code for a in answers} == {404}
    messages = {
        re.search(r'class="error-message">([^<]*)<', a.get_data(as_text=True))[1] for a in answers
    }
    assert len(messages) == 1 and "share link does not work" in messages.pop()
    assert visitor.get(f"{expired}/0").status_code == 404


def test_the_thread_page_lists_links_and_can_revoke(client: FlaskClient, seeded) -> None:
    make_link(client, "a.txt")
    page = client.get(f"/threads/{THREAD}").get_data(as_text=True)
    assert 'class="share-row"' in page
    link_id = re.search(r'data-link-id="([0-9a-f]+)"', page).group(1)
    client.post(f"/threads/{THREAD}/share/{link_id}/revoke")
    page = client.get(f"/threads/{THREAD}").get_data(as_text=True)
    assert "revoked" in page
    missing = client.post(f"/threads/{THREAD}/share/ffff/revoke", follow_redirects=True)
    assert "does not exist" in missing.get_data(as_text=True)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"filenames": ["a.txt"], "hours": "0"}, "from 1 hour"),
        ({"filenames": ["a.txt"], "hours": "721"}, "from 1 hour"),
        ({"filenames": ["a.txt"], "hours": "soon"}, "from 1 hour"),
        ({"filenames": [], "hours": "24"}, "at least one file"),
        ({"filenames": ["missing.txt"], "hours": "24"}, "does not exist"),
        ({"path": ["uploads/../../etc/passwd"], "hours": "24"}, ""),
    ],
)
def test_bad_requests_make_no_link(
    app: Flask, client: FlaskClient, seeded, form: dict, message: str
) -> None:
    response = client.post(f"/threads/{THREAD}/share", data=form, follow_redirects=True)
    assert message.lower() in response.get_data(as_text=True).lower()
    services = app.extensions[EXTENSION_KEY]
    assert services.share_links.list_for_thread(thread_ref(THREAD)) == []


def test_opens_are_rate_limited_per_address(
    app: Flask, client: FlaskClient, seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(share_module, "OPEN_LIMIT", 3)
    path = make_link(client, "a.txt")
    visitor = anonymous(app)
    assert [visitor.get(path).status_code for _ in range(3)] == [200, 200, 200]
    refused = visitor.get(path)
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) > 0
    other = app.test_client(user_id=None)
    other.environ_base["REMOTE_ADDR"] = "127.0.0.2"
    assert other.get(path).status_code == 200


def test_wrong_passwords_are_limited(
    app: Flask, client: FlaskClient, seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(share_module, "PASSWORD_LIMIT", 2)
    path = make_link(client, "a.txt", password="right one")
    visitor = anonymous(app)
    assert visitor.post(path, data={"password": "x"}).status_code == 403
    assert visitor.post(path, data={"password": "y"}).status_code == 403
    assert visitor.post(path, data={"password": "right one"}).status_code == 429


def test_a_selection_downloads_as_one_zip(app: Flask, client: FlaskClient, seeded) -> None:
    import io
    import zipfile

    path = make_link(client, "a.txt", "报告.txt")
    data = anonymous(app).get(f"{path}/all.zip").get_data()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.read("报告.txt") == "图".encode() * 10
        assert archive.read("a.txt") == b"hello"


def test_a_deleted_thread_takes_its_links_along(app: Flask, client: FlaskClient, seeded) -> None:
    path = make_link(client, "a.txt")
    client.post(f"/threads/{THREAD}/delete-thread", data={"confirmed": "yes"})
    assert anonymous(app).get(path).status_code == 404


def test_the_preview_page_shares_one_file_even_from_outputs(
    app: Flask, client: FlaskClient, seeded, base_dir
) -> None:
    from tests.helpers import thread_dir

    outputs = thread_dir(base_dir, THREAD) / "user-data" / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / "summary.md").write_bytes(b"# Summary")
    page = client.get(f"/threads/{THREAD}/files/outputs/summary.md").get_data(as_text=True)
    assert 'name="path" value="outputs/summary.md"' in page
    response = client.post(
        f"/threads/{THREAD}/share", data={"path": "outputs/summary.md", "hours": "1"}
    )
    url = re.search(r'id="share-url"[^>]*value="([^"]+)"', response.get_data(as_text=True))[1]
    path = url.removeprefix("http://localhost")
    assert fetched(anonymous(app), f"{path}/0").get_data() == b"# Summary"
