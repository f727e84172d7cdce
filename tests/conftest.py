"""Shared fixtures: an app over a fresh data dir, its client, and an upload helper."""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any
from typing import TypeVar

import pytest
import yaml
from flask import Flask
from flask import request_finished
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from deerflow_web.web import create_app
from tests.openapi_check import check_response

T = TypeVar("T")


@pytest.fixture(autouse=True, scope="session")
def _responses_fit_the_api_description() -> Iterator[None]:
    """Every API response any test receives must fit the OpenAPI document its app serves."""
    with request_finished.connected_to(check_response):
        yield


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the developer's config, data dir or home."""
    for name in ("DEER_FLOW_HOME", "DEER_FLOW_CONFIG_PATH", "DEER_FLOW_PROJECT_ROOT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    """The data root of the app under test."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def make_app(base_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """Build an app, optionally with an `uploads:` config section written to a YAML file."""

    def factory(uploads: dict[str, Any] | None = None, **overrides: Any) -> Flask:
        config: dict[str, Any] = {
            "TESTING": True,
            "BASE_DIR": str(base_dir),
            "WTF_CSRF_ENABLED": False,
        }
        if uploads is not None:
            path = tmp_path / "config.yaml"
            path.write_text(yaml.safe_dump({"uploads": uploads}), encoding="utf-8")
            config["CONFIG_PATH"] = str(path)
        config.update(overrides)
        return create_app(config)

    yield factory


@pytest.fixture
def app(make_app: Any) -> Flask:
    """An app whose thread storage lives in a fresh temp dir."""
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A test client of `app`."""
    return app.test_client()


class UploadActions:
    """The API calls tests make most, by name."""

    def __init__(self, client: FlaskClient) -> None:
        self._client = client

    def upload(self, thread_id: str, *files: tuple[bytes, str], **form: str) -> TestResponse:
        data: dict[str, Any] = dict(form)
        data["files"] = [(BytesIO(body), name) for body, name in files]
        return self._client.post(f"/api/threads/{thread_id}/uploads", data=data)

    def list(self, thread_id: str) -> dict[str, Any]:
        response = self._client.get(f"/api/threads/{thread_id}/uploads/list")
        assert response.status_code == 200, response.get_json()
        return response.get_json()

    def names(self, thread_id: str) -> list[str]:
        return [f["filename"] for f in self.list(thread_id)["files"]]

    def delete(self, thread_id: str, filename: str) -> TestResponse:
        return self._client.delete(f"/api/threads/{thread_id}/uploads/{filename}")


@pytest.fixture
def uploads(client: FlaskClient) -> UploadActions:
    """Upload, list and delete through the JSON API."""
    return UploadActions(client)


def uploads_dir(base_dir: Path, thread_id: str) -> Path:
    """The flat-layout uploads folder of a thread."""
    return base_dir / "threads" / thread_id / "user-data" / "uploads"


def wait_until(condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy, and return that; fail after
    `timeout` seconds. For waiting on another process or thread, never to order events."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"still false after {timeout} s: {condition}")
        time.sleep(interval)
