"""Object-store errors through the app's one error table (web/errors.py).

No route reaches the object store yet, so a view of this test's own raises the error: an
S3 server out of reach must answer 503 with Retry-After, as the database does, in the
reader's language."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import InvalidObjectKey
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.web.errors import status_for

ZH = {"Accept-Language": "zh-CN,zh;q=0.9"}


@pytest.fixture
def failing_app(make_app: Any) -> Flask:
    app = make_app()

    def outage() -> str:
        raise ObjectStoreUnavailable("Could not connect to the endpoint URL", retry_after=7)

    app.add_url_rule("/object-store-outage", "object_store_outage", outage)
    return app


def test_an_unreachable_object_store_is_503_with_retry_after(failing_app: Flask) -> None:
    client = failing_app.test_client()
    response = client.get("/object-store-outage")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "7"
    page = response.get_data(as_text=True)
    assert "File storage cannot be reached right now." in page
    assert "endpoint" not in page  # the client library's reason stays in the log
    chinese = client.get("/object-store-outage", headers=ZH)
    assert chinese.status_code == 503 and chinese.headers["Retry-After"] == "7"
    assert "暂时无法连接文件存储。" in chinese.get_data(as_text=True)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ObjectStoreUnavailable(), 503),
        (ObjectNotFound("users/u/threads/t/user-data/uploads/a.txt"), 404),
        (InvalidObjectKey("../a"), 400),
    ],
)
def test_object_store_errors_map_to_statuses(error: DeerFlowError, status: int) -> None:
    assert status_for(error) == status
