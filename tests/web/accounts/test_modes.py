"""The two modes of SPEC 7.1 and their settings: accounts on by default, single-user on request."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from deerflow_web.errors import ConfigError
from deerflow_web.settings import load_settings
from tests.helpers import needs_auth


def settings_with(tmp_path: Path, environ: dict[str, str], config: dict | None = None):
    path = None
    if config is not None:
        path = tmp_path / "settings.yaml"
        path.write_text(yaml.safe_dump(config))
    cwd = tmp_path / "cwd"  # holds no config.yaml
    cwd.mkdir(exist_ok=True)
    return load_settings(tmp_path / "data", config_path=path, environ=environ, cwd=cwd)


def test_accounts_are_on_by_default(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, {})
    assert settings.auth.enabled and not settings.auth.registration_enabled
    assert settings.auth.session_idle_hours == 12 and settings.auth.session_lifetime_days == 7
    assert settings.database_url is None and settings.trusted_proxies == 0


def test_session_timeouts_from_the_config_and_bad_ones_fall_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"auth": {"session_idle_hours": "0.5", "session_lifetime_days": 30}}
    auth = settings_with(tmp_path, {}, config).auth
    assert auth.session_idle_hours == 0.5 and auth.session_lifetime_days == 30
    bad = {"auth": {"session_idle_hours": -1, "session_lifetime_days": "forever"}}
    auth = settings_with(tmp_path, {}, bad).auth
    assert auth.session_idle_hours == 12 and auth.session_lifetime_days == 7
    assert "auth.session_idle_hours" in caplog.text and "auth.session_lifetime_days" in caplog.text


@pytest.mark.parametrize("value", ("1", "true", "YES"))
def test_the_environment_switch_turns_accounts_off(tmp_path: Path, value: str) -> None:
    assert not settings_with(tmp_path, {"DEER_FLOW_AUTH_DISABLED": value}).auth.enabled


def test_the_config_switch_turns_accounts_off(tmp_path: Path) -> None:
    assert not settings_with(tmp_path, {}, {"auth": {"enabled": False}}).auth.enabled
    assert settings_with(tmp_path, {"DEER_FLOW_AUTH_DISABLED": "0"}).auth.enabled


@pytest.mark.parametrize(
    ("name", "value"),
    (("DEER_FLOW_ENV", "production"), ("DEER_FLOW_ENV", "prod"), ("ENVIRONMENT", "Production")),
)
def test_single_user_mode_is_refused_in_production(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_with(tmp_path, {"DEER_FLOW_AUTH_DISABLED": "1", name: value})
    message = str(refused.value)
    assert name in message and "DEER_FLOW_AUTH_DISABLED" in message
    with pytest.raises(ConfigError):
        settings_with(tmp_path, {name: value}, {"auth": {"enabled": False}})
    assert settings_with(tmp_path, {name: value}).auth.enabled  # accounts on: fine


def test_database_and_proxy_settings(tmp_path: Path) -> None:
    config = {"database": {"url": "sqlite:///from-config.db"}, "server": {"trusted_proxies": 2}}
    settings = settings_with(tmp_path, {}, config)
    assert settings.database_url == "sqlite:///from-config.db" and settings.trusted_proxies == 2
    env = {"DATABASE_URL": "sqlite:///from-env.db"}
    assert settings_with(tmp_path, env, config).database_url == "sqlite:///from-env.db"
    listed = settings_with(tmp_path, {}, {"server": {"trusted_proxies": ["10.0.0.1"]}})
    assert listed.trusted_proxies == 1
    assert settings_with(tmp_path, {}, {"server": {"trusted_proxies": "many"}}).trusted_proxies == 0


def test_single_user_mode_is_the_first_release(make_app, base_dir: Path) -> None:
    """No login, no account routes, no CSRF cookie, the flat layout, no account rows."""
    app = make_app(auth={"enabled": False})
    client = app.test_client()
    response = client.post("/api/threads/t1/uploads", data={"files": [(BytesIO(b"x"), "a.txt")]})
    assert response.status_code == 200
    assert "csrf_token" not in " ".join(response.headers.getlist("Set-Cookie"))
    assert (base_dir / "threads" / "t1" / "user-data" / "uploads" / "a.txt").exists()
    assert not (base_dir / "users").exists()
    with app.extensions["deerflow_web"].engine.connect() as db:
        assert db.execute(text("SELECT COUNT(*) FROM users")).scalar_one() == 0
    assert client.get("/").status_code == 200
    with app.extensions["deerflow_web"].engine.connect() as db:
        # listed, the thread is a record of the single-user layout (user id ""), no account's
        rows = db.execute(text("SELECT user_id, thread_id FROM threads")).all()
        assert [tuple(row) for row in rows] == [("", "t1")]
    assert "Sign out" not in client.get("/").get_data(as_text=True)
    for path in ("/api/v1/auth/login/local", "/api/v1/auth/tokens", "/login", "/setup", "/account"):
        assert client.get(path).status_code == 404, path


def test_single_user_mode_answers_deerflows_me_and_setup_status(make_app) -> None:
    """DeerFlow's UI asks both on every page; DEER_FLOW_AUTH_DISABLED=1 answers them so."""
    app = make_app(auth={"enabled": False})
    client = app.test_client()
    client.set_cookie("access_token", "garbage")  # ignored, as DeerFlow does in this mode
    me = client.get("/api/v1/auth/me")
    assert me.status_code == 200 and me.headers["Cache-Control"] == "no-store"
    assert me.get_json() == {
        "id": "default",
        "email": "default@test.local",
        "system_role": "admin",
        "needs_setup": False,
        "oauth_provider": None,
        "usage": {"bytes": 0, "quota_bytes": 10 * 1024**3},  # the one owner's (issue 27)
    }
    status = client.get("/api/v1/auth/setup-status")
    assert status.get_json() == {"needs_setup": False, "registration_enabled": False}
    document = client.get("/openapi.json").get_json()
    assert {"/api/v1/auth/me", "/api/v1/auth/setup-status"} <= set(document["paths"])
    assert not any(path.startswith("/api/v1/admin") for path in document["paths"])
    assert "/api/v1/auth/login/local" not in document["paths"]
    assert client.post("/api/v1/auth/me").status_code == 405


@needs_auth
def test_database_url_from_the_environment(
    make_app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "elsewhere" / "accounts.db"
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{database}")
    app = make_app()
    assert database.exists()
    assert app.extensions["deerflow_web"].accounts.find_by_email("tester@example.com")
