"""`flask --app app users ...` (SPEC 7.2): create, token, adopt-threads."""

from __future__ import annotations

import subprocess
import sys
from io import BytesIO
from pathlib import Path

from flask import Flask

from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import needs_auth
from tests.helpers import thread_ref

pytestmark = needs_auth

ROOT = Path(__file__).resolve().parents[3]


def run(app: Flask, *args: str, password: str = ""):
    return app.test_cli_runner().invoke(args=["users", *args], input=password)


def test_create_reads_the_password_from_standard_input(app: Flask) -> None:
    result = run(app, "create", "ops@example.com", "--admin", password="ops password\n")
    assert result.exit_code == 0, result.output
    account = app.extensions[EXTENSION_KEY].accounts.find_by_email("ops@example.com")
    assert account is not None and account.is_admin
    assert app.extensions[EXTENSION_KEY].accounts.authenticate(
        "ops@example.com", "ops password", "cli"
    )


def test_create_applies_the_same_rules(app: Flask) -> None:
    weak = run(app, "create", "weak@example.com", password="password\n")
    assert weak.exit_code != 0 and "too common" in weak.output
    bad = run(app, "create", "not-an-email", password="fine password\n")
    assert bad.exit_code != 0 and "Invalid email" in bad.output
    assert app.extensions[EXTENSION_KEY].accounts.find_by_email("weak@example.com") is None


def test_token_prints_a_working_token(app: Flask) -> None:
    run(app, "create", "bot@example.com", password="bot password\n")
    result = run(app, "token", "bot@example.com", "--name", "ci")
    assert result.exit_code == 0
    secret = result.output.strip()
    response = app.test_client(user_id=None).get(
        "/api/v1/auth/me", headers={"Authorization": f"Bearer {secret}"}
    )
    assert response.get_json()["email"] == "bot@example.com"
    missing = run(app, "token", "nobody@example.com", "--name", "ci")
    assert missing.exit_code != 0 and "No account" in missing.output


def test_adopt_threads_moves_flat_threads_with_their_records(app: Flask, base_dir: Path) -> None:
    services = app.extensions[EXTENSION_KEY]
    services.uploads.save_uploads(
        ThreadRef.single_user("old"), [IncomingFile("notes.txt", BytesIO(b"kept"))]
    )
    services.uploads.save_uploads(
        ThreadRef.single_user("taken"), [IncomingFile("x.txt", BytesIO(b"x"))]
    )
    services.threads.update(ThreadRef.single_user("old"), title="Old notes", set_title=True)
    other = services.accounts.create_user("other@example.com", "other password")
    services.threads.create(other.id, "old")  # another user's "old": no obstacle, ids are per user
    run(app, "create", "me@example.com", password="my password\n")
    me = services.accounts.find_by_email("me@example.com")
    services.threads.create(me.id, "taken")  # one of mine already has that id: kept apart
    result = run(app, "adopt-threads", "me@example.com")
    assert result.exit_code == 0, result.output
    assert "adopted old" in result.output and "skipped taken" in result.output
    assert not (base_dir / "threads" / "old").exists()
    assert (base_dir / "threads" / "taken").exists()
    [record] = services.uploads.list_uploads(thread_ref("old", me.id))
    assert record.filename == "notes.txt" and record.source.value == "upload"  # moved, not re-found
    assert services.threads.get(thread_ref("old", me.id)).title == "Old notes"
    assert services.threads.find(ThreadRef.single_user("old")) is None
    assert services.threads.get(thread_ref("old", other.id)).title is None
    client = app.test_client(user_id=me.id)
    listing = client.get("/api/threads/old/uploads/list").get_json()
    assert [f["filename"] for f in listing["files"]] == ["notes.txt"]


def test_the_real_flask_command(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DEER_FLOW_HOME": str(tmp_path / "data"),
    }
    created = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", "users", "create", "cli@example.com"],
        input="cli password\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert created.returncode == 0, created.stderr
    assert "Created user cli@example.com" in created.stdout
