"""Quotas on the web (issue 27): 413 for each kind of write through the API, usage in
`/auth/me` and in every page's header, and the admins' quota settings (API and page)."""

from __future__ import annotations

from io import BytesIO
from typing import Any

import pytest
from flask import Flask

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import needs_auth
from tests.helpers import uploads_dir
from tests.support.tus import TusActions
from tests.support.tus import encode_metadata

ADMIN = "/api/v1/admin"
OWNER = USER_ID or ""  # the single-user mode's one owner is ""


@pytest.fixture
def small(make_app: Any) -> Flask:
    """An app whose users may store 1000 bytes each."""
    return make_app(quotas={"default_bytes": 1000})


def folder_names(base_dir, thread_id: str = "t1") -> list[str]:
    folder = uploads_dir(base_dir, thread_id)
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# ---- 413 for every kind of write --------------------------------------------------------


def test_a_multipart_upload_over_the_quota_is_413_and_keeps_nothing(small, base_dir) -> None:
    uploads = UploadActions(small.test_client())
    assert uploads.upload("t1", (b"x" * 600, "a.txt")).status_code == 200
    response = uploads.upload("t1", (b"y" * 300, "b.txt"), (b"z" * 200, "c.txt"))
    assert response.status_code == 413
    assert response.get_json() == {
        "detail": "Storage quota exceeded: 600 B of 1000 B used, this upload needs 500 B"
    }
    assert uploads.names("t1") == ["a.txt"]
    assert folder_names(base_dir) == ["a.txt"]


def test_a_body_that_clearly_cannot_fit_is_refused_unread(
    small, base_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused from Content-Length, before the files reach the upload service (no staging
    file, no folder), with the same sentence."""

    def never(*_: object, **__: object) -> None:
        raise AssertionError("the files were read")

    monkeypatch.setattr(small.extensions[EXTENSION_KEY].intake, "accept", never)
    client = small.test_client()
    body = (
        b"--b\r\n"
        b'Content-Disposition: form-data; name="files"; filename="big.bin"\r\n\r\n'
        + b"x" * 2_000_000
        + b"\r\n--b--\r\n"
    )
    response = client.post(
        "/api/threads/fresh/uploads", data=body, content_type="multipart/form-data; boundary=b"
    )
    assert response.status_code == 413
    assert response.get_json()["detail"].startswith(
        "Storage quota exceeded: 0 B of 1000 B used, this upload needs"
    )
    assert not uploads_dir(base_dir, "fresh").exists()


def test_the_page_upload_over_the_quota_says_so(small, base_dir) -> None:
    client = small.test_client()
    response = client.post(
        "/threads/t1/upload",
        data={"files": [(BytesIO(b"x" * 2000), "a.txt")]},
        follow_redirects=True,
    )
    assert "Storage quota exceeded" in response.get_data(as_text=True)
    assert folder_names(base_dir) == []


def test_a_tus_creation_over_the_quota_is_413(small, base_dir) -> None:
    tus = TusActions(small.test_client())
    response = tus.create("t1", 1001, encode_metadata(filename="big.bin"))
    assert response.status_code == 413
    assert response.headers["Tus-Resumable"] == "1.0.0"
    assert "this upload needs 1001 B" in response.get_json()["detail"]
    assert folder_names(base_dir) == []
    url = tus.start("t1", 1000)  # exactly the quota: reserved
    assert url
    uploads = UploadActions(small.test_client())
    assert uploads.upload("t2", (b"x", "one.txt")).status_code == 413  # all reserved


def test_an_artifact_edit_over_the_quota_is_413(small, base_dir) -> None:
    import hashlib

    uploads = UploadActions(small.test_client())
    uploads.upload("t1", (b"x" * 990, "a.txt"))
    outputs = uploads_dir(base_dir, "t1").parent / "outputs"
    outputs.mkdir(exist_ok=True)
    (outputs / "n.md").write_text("abc", encoding="utf-8")
    response = small.test_client().put(
        "/api/threads/t1/artifacts/mnt/user-data/outputs/n.md",
        json={"content": "a" * 100, "expected_sha256": hashlib.sha256(b"abc").hexdigest()},
    )
    assert response.status_code == 413
    assert "Storage quota exceeded" in response.get_json()["detail"]
    assert (outputs / "n.md").read_text(encoding="utf-8") == "abc"


# ---- usage shown ------------------------------------------------------------------------


def test_auth_me_reports_the_usage(small) -> None:
    client = small.test_client()
    assert client.get("/api/v1/auth/me").get_json()["usage"] == {"bytes": 0, "quota_bytes": 1000}
    UploadActions(client).upload("t1", (b"x" * 300, "a.txt"))
    UploadActions(client).upload("t2", (b"x" * 200, "b.txt"))
    assert client.get("/api/v1/auth/me").get_json()["usage"] == {
        "bytes": 500,
        "quota_bytes": 1000,
    }


def test_usage_is_unlimited_when_the_quota_is_off(make_app: Any) -> None:
    client = make_app(quotas={"default_bytes": None}).test_client()
    assert client.get("/api/v1/auth/me").get_json()["usage"] == {"bytes": 0, "quota_bytes": None}
    UploadActions(client).upload("t1", (b"x" * 3000, "a.txt"))
    assert client.get("/api/v1/auth/me").get_json()["usage"]["bytes"] == 3000


def test_the_default_quota_is_ten_gib(client) -> None:
    usage = client.get("/api/v1/auth/me").get_json()["usage"]
    assert usage["quota_bytes"] == 10 * 1024**3


def test_every_page_header_shows_the_usage(small) -> None:
    client = small.test_client()
    UploadActions(client).upload("t1", (b"x" * 512, "a.txt"))
    for path in ("/", "/threads/t1"):
        page = client.get(path).get_data(as_text=True)
        assert 'id="storage-usage"' in page, path
        assert "512 B of 1000 B" in page, path


@needs_auth
def test_the_account_page_says_the_usage_which_phones_do_not_show_in_the_header(small) -> None:
    client = small.test_client()
    UploadActions(client).upload("t1", (b"x" * 512, "a.txt"))
    page = client.get("/account").get_data(as_text=True)
    assert 'Storage: <span class="account-usage">512 B of 1000 B</span>' in page


def test_the_header_reads_in_chinese(small) -> None:
    client = small.test_client()
    client.get("/language/zh")
    page = client.get("/").get_data(as_text=True)
    assert "已用 0 B / 共 1000 B" in page


# ---- admins set quotas ------------------------------------------------------------------


def _accounts(app: Flask):
    return app.extensions[EXTENSION_KEY].accounts


@needs_auth
def test_an_admin_sets_and_clears_a_quota_by_api(small) -> None:
    bob = _accounts(small).create_user("bob@example.com", "bob's password")
    admin = small.test_client()
    assert admin.get(f"{ADMIN}/users/{bob.id}/quota").get_json() == {
        "user_id": bob.id,
        "quota_bytes": 1000,
        "default": True,
        "usage": {"bytes": 0, "quota_bytes": 1000},
    }
    response = admin.put(f"{ADMIN}/users/{bob.id}/quota", json={"quota_bytes": 5000.0})
    assert response.status_code == 200  # 5000.0 is a whole number, as JSON Schema says
    assert response.get_json()["quota_bytes"] == 5000 and not response.get_json()["default"]
    bob_client = small.test_client(user_id=bob.id)
    assert UploadActions(bob_client).upload("t1", (b"x" * 3000, "a.txt")).status_code == 200
    assert bob_client.get("/api/v1/auth/me").get_json()["usage"] == {
        "bytes": 3000,
        "quota_bytes": 5000,
    }
    unlimited = admin.put(f"{ADMIN}/users/{bob.id}/quota", json={"quota_bytes": 0})
    assert unlimited.get_json()["quota_bytes"] is None
    cleared = admin.delete(f"{ADMIN}/users/{bob.id}/quota")
    assert cleared.get_json()["default"] is True and cleared.get_json()["quota_bytes"] == 1000
    # Over the default again: the next upload is refused, the stored file stays.
    assert UploadActions(bob_client).upload("t1", (b"y", "b.txt")).status_code == 413
    assert UploadActions(bob_client).names("t1") == ["a.txt"]


@needs_auth
@pytest.mark.parametrize(
    ("value", "says"),
    (
        (-1, "cannot be negative"),
        (2**60, "too large"),
        ("abc", "whole number"),
        ("1000", "whole number"),
        (1.5, "whole number"),
        (True, "whole number"),
        ([1], "whole number"),
    ),
)
def test_a_bad_quota_is_400_and_changes_nothing(small, value: object, says: str) -> None:
    bob = _accounts(small).create_user("bob@example.com", "bob's password")
    admin = small.test_client()
    response = admin.put(f"{ADMIN}/users/{bob.id}/quota", json={"quota_bytes": value})
    assert response.status_code == 400
    assert says in response.get_json()["detail"]
    assert admin.get(f"{ADMIN}/users/{bob.id}/quota").get_json()["default"] is True


@needs_auth
def test_a_quota_without_its_field_or_for_nobody_is_refused(small) -> None:
    bob = _accounts(small).create_user("bob@example.com", "bob's password")
    admin = small.test_client()
    assert admin.put(f"{ADMIN}/users/{bob.id}/quota", json={}).status_code == 400
    assert admin.put(f"{ADMIN}/users/nobody/quota", json={"quota_bytes": 5}).status_code == 404
    assert admin.get(f"{ADMIN}/users/nobody/quota").status_code == 404


@needs_auth
def test_only_admins_see_or_set_quotas(small) -> None:
    bob = _accounts(small).create_user("bob@example.com", "bob's password")
    client = small.test_client(user_id=bob.id)
    for method in ("get", "put", "delete"):
        response = getattr(client, method)(f"{ADMIN}/users/{bob.id}/quota", json={"quota_bytes": 0})
        assert response.status_code == 403, method
    assert client.get("/api/v1/auth/me").get_json()["usage"]["quota_bytes"] == 1000
    page = client.post(f"/admin/users/{bob.id}/quota", data={"quota_mib": "0"})
    assert page.status_code == 403


@needs_auth
def test_an_admin_sets_a_quota_on_the_page(small) -> None:
    bob = _accounts(small).create_user("bob@example.com", "bob's password")
    admin = small.test_client()
    page = admin.get("/admin").get_data(as_text=True)
    assert "0 B of 1000 B" in page and f'action="/admin/users/{bob.id}/quota"' in page
    response = admin.post(
        f"/admin/users/{bob.id}/quota", data={"quota_mib": "2"}, follow_redirects=True
    )
    assert "Saved the storage quota of bob@example.com." in response.get_data(as_text=True)
    assert admin.get(f"{ADMIN}/users/{bob.id}/quota").get_json()["quota_bytes"] == 2 * 1024**2
    admin.post(f"/admin/users/{bob.id}/quota", data={"quota_mib": ""})
    assert admin.get(f"{ADMIN}/users/{bob.id}/quota").get_json()["default"] is True


@needs_auth
@pytest.mark.parametrize("value", ("-5", "lots", "1.5", "99999999999"))
def test_a_bad_quota_on_the_page_is_400(small, value: str) -> None:
    bob = _accounts(small).create_user("bob@example.com", "bob's password")
    admin = small.test_client()
    response = admin.post(f"/admin/users/{bob.id}/quota", data={"quota_mib": value})
    assert response.status_code == 400
    assert admin.get(f"{ADMIN}/users/{bob.id}/quota").get_json()["default"] is True


@needs_auth
def test_the_quota_form_needs_its_csrf_token(make_app: Any) -> None:
    app = make_app(quotas={"default_bytes": 1000}, WTF_CSRF_ENABLED=True)
    bob = _accounts(app).create_user("bob@example.com", "bob's password")
    admin = app.test_client()
    response = admin.post(f"/admin/users/{bob.id}/quota", data={"quota_mib": "0"})
    assert response.status_code == 400
    assert admin.get(f"{ADMIN}/users/{bob.id}/quota").get_json()["default"] is True
