"""Errors a person meets are sentences in their language: error pages, and the API's
`detail` when one of our pages' scripts asks (X-DeerFlow-Page); other clients keep English."""

from __future__ import annotations

from flask.testing import FlaskClient

from tests.helpers import UploadActions

THREAD = "words"
ZH = {"Accept-Language": "zh-CN,zh;q=0.9"}


def test_the_api_speaks_to_our_pages_in_their_language(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload(THREAD, (b"a", "a.txt"))
    url = f"/api/threads/{THREAD}/uploads/missing.txt/convert"
    plain = client.post(url, headers=ZH)
    page = client.post(url, headers={**ZH, "X-DeerFlow-Page": "1"})
    assert plain.status_code == page.status_code
    assert plain.get_json()["detail"].isascii()  # DeerFlow's clients: the API's own words
    detail = page.get_json()["detail"]
    assert not detail.isascii() and "missing.txt" in detail


def test_error_pages_are_in_the_readers_language(client: FlaskClient) -> None:
    english = client.get("/threads/no-such-thread/files/uploads/x.txt").get_data(as_text=True)
    chinese = client.get("/threads/no-such-thread/files/uploads/x.txt", headers=ZH)
    assert "That thread does not exist, or it is not yours." in english
    assert "该会话不存在，或不属于你。" in chinese.get_data(as_text=True)
    unknown = client.get("/no/such/page", headers=ZH).get_data(as_text=True)
    assert "此页面或文件不存在。" in unknown
