"""`flask --app app storage migrate --to s3`: a local install's files moved into a real
SeaweedFS bucket, checked, and the install switched, on SQLite and PostgreSQL.

The install is built through the API on the local backend (two threads, of two users when
accounts are on; a replaced file, whose earlier bytes are a version; a deleted file, in the
trash); the command copies each file the database names to its blob. An app on the S3
backend with a new, empty data dir and the same database then serves them, and an app
still set to `local` refuses to start.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.agent.runtime import resolve_thread_paths
from deerflow_web.errors import ConfigError
from deerflow_web.storage.install_storage import read_install_storage
from deerflow_web.storage.objects import sweep_stale_uploads
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import AUTH_ON
from tests.helpers import TEST_PASSWORD
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import thread_dir
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.seaweedfs import ACCESS_KEY
from tests.support.seaweedfs import SECRET_KEY
from tests.support.seaweedfs import SeaweedFS
from tests.support.tus import TusActions

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "deerflow-migrate"
OTHER_USER = "other-user" if AUTH_ON else None
# Larger bodies go by tus: the test client spools a larger multipart body to a temporary
# file that it never closes.
MULTIPART_IN_MEMORY = 400_000
TUS_CHUNK = 4 * 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scope_of(thread_id: str, user_id: str | None = USER_ID) -> str:
    base = Path("/x")
    return thread_dir(base, thread_id, user_id).relative_to(base).as_posix()


@pytest.fixture
def bucket(seaweedfs: SeaweedFS) -> S3ObjectStore:
    """This test's own prefix of the shared bucket."""
    return seaweedfs.store(BUCKET, prefix=f"m-{secrets.token_hex(6)}")


@pytest.fixture
def s3_env(
    monkeypatch: pytest.MonkeyPatch, seaweedfs: SeaweedFS, bucket: S3ObjectStore, database_url: str
) -> dict[str, str]:
    """The bucket named by the settings (`storage.s3.*`), the backend still `local`."""
    env = {
        "DATABASE_URL": database_url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "DEER_FLOW_STORAGE_S3_ENDPOINT_URL": seaweedfs.endpoint_url,
        "DEER_FLOW_STORAGE_S3_BUCKET": BUCKET,
        "DEER_FLOW_STORAGE_S3_REGION": "us-east-1",
        "DEER_FLOW_STORAGE_S3_PREFIX": bucket.prefix.rstrip("/"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DEER_FLOW_STORAGE_BACKEND", raising=False)
    return env


class Install:
    """A local install built through the API, and what it should hold in the bucket."""

    def __init__(self, app: Flask, base_dir: Path) -> None:
        self.app = app
        self.base_dir = base_dir
        self.client = app.test_client()
        self.other: FlaskClient = self.client
        if AUTH_ON:
            accounts = app.extensions[EXTENSION_KEY].accounts
            accounts.create_user("other@example.com", TEST_PASSWORD, user_id=OTHER_USER)
            self.other = app.test_client(user_id=OTHER_USER)
        self.blobs: dict[str, bytes] = {}  # blob key -> bytes
        self.photo = self.large = b""

    def upload(self, client: FlaskClient, thread_id: str, body: bytes, name: str, **form: str):
        if len(body) > MULTIPART_IN_MEMORY:
            tus = TusActions(client)
            url = tus.start(thread_id, len(body), name)
            for offset in range(0, len(body), TUS_CHUNK):
                sent = tus.patch(url, offset, body[offset : offset + TUS_CHUNK])
                assert sent.status_code == 204, sent.get_json()
        else:
            answer = UploadActions(client).upload(thread_id, (body, name), **form)
            assert answer.status_code == 200, answer.get_json()
        user = USER_ID if client is self.client else OTHER_USER
        self.blobs[blob_key(scope_of(thread_id, user), sha(body))] = body


def cli(app: Flask, *args: str) -> Result:
    return app.test_cli_runner().invoke(args=["storage", "migrate", "--to", "s3", *args])


@pytest.fixture
def install(s3_env: dict[str, str], make_app: Any, base_dir: Path) -> Install:
    """Uploads in two threads (of two users with accounts on), a version, a trash entry."""
    made = Install(make_app(), base_dir)
    made.upload(made.client, "t1", b"first notes", "notes.txt")
    made.upload(made.client, "t1", b"second notes, longer", "notes.txt", on_conflict="replace")
    made.photo = secrets.token_bytes(300_000)
    made.upload(made.client, "t1", made.photo, "photo.bin")
    made.upload(made.client, "t1", b"soon gone", "gone.txt")
    assert made.client.delete("/api/threads/t1/uploads/gone.txt").status_code == 200
    made.upload(made.other, "t2", b"the other thread", "other.txt")
    made.large = secrets.token_bytes(6 * 1024 * 1024)  # more than one part
    made.upload(made.other, "t2", made.large, "large.bin")
    return made


def stored_sha256(store: S3ObjectStore, key: str) -> str:
    digest = hashlib.sha256()
    with store.open_read(key) as stream:
        for chunk in stream:
            digest.update(chunk)
    return digest.hexdigest()


def s3_app(make_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Flask:
    """An instance on the S3 backend with a new, empty data dir and the same database."""
    monkeypatch.setenv("DEER_FLOW_STORAGE_BACKEND", "s3")
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    return make_app(BASE_DIR=str(empty))


def download(client: FlaskClient, thread_id: str, name: str) -> Any:
    response = client.get(f"/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}")
    response.get_data()
    response.close()
    return response


def test_every_file_moves_and_an_s3_instance_serves_them(
    install: Install,
    bucket: S3ObjectStore,
    make_app: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = cli(install.app)
    assert result.exit_code == 0, result.output
    assert "0 failure(s)" in result.output
    assert "storage.backend: s3  (or DEER_FLOW_STORAGE_BACKEND=s3)" in result.output
    assert f"storage.s3.bucket: {BUCKET}" in result.output
    for key, body in install.blobs.items():  # the current bytes, the version, the trash
        assert bucket.head(key).size == len(body)
        assert stored_sha256(bucket, key) == sha(body)
    engine = install.app.extensions[EXTENSION_KEY].engine
    moved = read_install_storage(engine)
    assert moved is not None and (moved.backend, moved.bucket) == ("s3", BUCKET)

    on_s3 = s3_app(make_app, tmp_path, monkeypatch)
    client = on_s3.test_client()
    other = on_s3.test_client(user_id=OTHER_USER) if AUTH_ON else client
    assert sorted(UploadActions(client).names("t1")) == ["notes.txt", "photo.bin"]
    assert sorted(UploadActions(other).names("t2")) == ["large.bin", "other.txt"]
    assert download(client, "t1", "notes.txt").data == b"second notes, longer"
    assert download(client, "t1", "photo.bin").data == install.photo
    assert download(other, "t2", "large.bin").data == install.large
    listed_versions = client.get("/api/threads/t1/uploads/notes.txt/versions").get_json()
    assert [v["sha256"] for v in listed_versions["versions"]] == [sha(b"first notes")]
    assert [e["filename"] for e in client.get("/api/threads/t1/trash").get_json()["files"]] == [
        "gone.txt"
    ]


def test_an_s3_instance_restores_the_moved_version_and_trash_entry(
    install: Install, make_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli(install.app).exit_code == 0
    client = s3_app(make_app, tmp_path, monkeypatch).test_client()
    [kept] = client.get("/api/threads/t1/uploads/notes.txt/versions").get_json()["versions"]
    version_url = f"/api/threads/t1/uploads/notes.txt/versions/{kept['version_id']}"
    restored = client.post(f"{version_url}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert download(client, "t1", "notes.txt").data == b"first notes"
    [entry] = client.get("/api/threads/t1/trash").get_json()["files"]
    back = client.post(f"/api/threads/t1/trash/{entry['trash_id']}/restore")
    assert back.status_code == 200, back.get_json()
    assert download(client, "t1", "gone.txt").data == b"soon gone"


def test_a_second_run_copies_nothing(install: Install) -> None:
    first = cli(install.app, "--no-switch")
    assert first.exit_code == 0, first.output
    assert f"{len(install.blobs)} copied" in first.output
    assert "not switched (--no-switch)" in first.output
    assert read_install_storage(install.app.extensions[EXTENSION_KEY].engine) is None
    second = cli(install.app)
    assert second.exit_code == 0, second.output
    assert "0 copied" in second.output and f"{len(install.blobs)} skipped" in second.output
    assert "Nothing to copy: the bucket holds every file already." in second.output
    assert "the install is now marked as moved" in second.output


def test_a_damaged_or_missing_file_is_reported_and_blocks_the_switch(
    install: Install, bucket: S3ObjectStore, make_app: Any, base_dir: Path
) -> None:
    damaged = uploads_dir(base_dir, "t1") / "notes.txt"
    damaged.write_bytes(b"SECOND NOTES, LONGER")  # same size, other bytes
    trash = thread_dir(base_dir, "t1") / "history" / "trash"
    [entry] = list(trash.iterdir())
    (entry / "gone.txt").unlink()
    result = cli(install.app)
    assert result.exit_code != 0
    scope = scope_of("t1")
    assert (
        f"not copied: {scope}/user-data/uploads/notes.txt: expected sha256 "
        f"{sha(b'second notes, longer')}, found {sha(b'SECOND NOTES, LONGER')}"
    ) in result.output
    assert (
        f"not copied: {scope}/history/trash/{entry.name}/gone.txt: expected sha256 "
        f"{sha(b'soon gone')}, found missing"
    ) in result.output
    assert "2 failure(s)" in result.output
    assert "the install was not switched" in result.output
    assert not bucket.exists(blob_key(scope, sha(b"second notes, longer")))
    assert not bucket.exists(blob_key(scope, sha(b"SECOND NOTES, LONGER")))
    assert bucket.exists(blob_key(scope, sha(b"first notes")))  # the rest went
    assert read_install_storage(install.app.extensions[EXTENSION_KEY].engine) is None
    make_app()  # not switched: a local instance still starts


def test_bytes_a_damaged_file_lacks_come_from_another_file_of_the_thread(
    s3_env: dict[str, str], make_app: Any, base_dir: Path, bucket: S3ObjectStore
) -> None:
    made = Install(make_app(), base_dir)
    made.upload(made.client, "t1", b"the same bytes", "a.txt")
    made.upload(made.client, "t1", b"the same bytes", "b.txt")
    (uploads_dir(base_dir, "t1") / "a.txt").write_bytes(b"THE SAME BYTES")
    result = cli(made.app)
    assert result.exit_code == 0, result.output  # b.txt gave the blob both records name
    assert "2 file(s): 1 copied, 1 skipped" in result.output and "0 failure(s)" in result.output
    assert stored_sha256(bucket, blob_key(scope_of("t1"), sha(b"the same bytes"))) == sha(
        b"the same bytes"
    )


def test_a_bucket_that_does_not_exist_is_named(
    s3_env: dict[str, str], make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_BUCKET", "no-such-bucket-here")
    result = cli(make_app())
    assert result.exit_code != 0
    assert "The bucket no-such-bucket-here does not exist at http://127.0.0.1:" in result.output
    assert read_install_storage(app.extensions[EXTENSION_KEY].engine) is None


def test_without_a_bucket_the_command_says_what_to_set(
    make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEER_FLOW_STORAGE_S3_BUCKET", raising=False)
    result = cli(make_app())
    assert result.exit_code != 0
    assert "storage.s3.bucket (or DEER_FLOW_STORAGE_S3_BUCKET) must name the bucket" in (
        result.output
    )


def test_after_the_switch_a_local_instance_refuses_to_start(
    install: Install, make_app: Any, monkeypatch: pytest.MonkeyPatch, base_dir: Path
) -> None:
    assert cli(install.app).exit_code == 0
    with pytest.raises(ConfigError) as refused:
        make_app()
    message = str(refused.value)
    assert "moved to the S3 bucket " + BUCKET in message
    assert "Set storage.backend: s3  (or DEER_FLOW_STORAGE_BACKEND=s3)" in message
    # The agent side, set up from the same settings, refuses as the app does.
    monkeypatch.setenv("DEER_FLOW_HOME", str(base_dir))
    with pytest.raises(ConfigError, match="DEER_FLOW_STORAGE_BACKEND=s3"):
        resolve_thread_paths()
    monkeypatch.setenv("DEER_FLOW_STORAGE_BACKEND", "s3")
    copies = resolve_thread_paths().copies  # set as told: it starts
    assert copies is not None and copies.records is not None
    copies.records.engine.dispose()  # the agent side's own engine, made for this call


def run_command(env: dict[str, str], base_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "app", "storage", "migrate", "--to", "s3", *args],
        cwd=ROOT,
        env={**os.environ, **env, "DEER_FLOW_HOME": str(base_dir)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_run_is_finished_by_the_next_one_copying_nothing_twice(
    s3_env: dict[str, str], make_app: Any, base_dir: Path, bucket: S3ObjectStore
) -> None:
    made = Install(make_app(), base_dir)
    for name in ("a.txt", "b.txt"):
        made.upload(made.client, "t1", f"small {name}".encode(), name)
    made.upload(made.client, "t1", secrets.token_bytes(40 * 1024 * 1024), "c-large.bin")
    for name in ("d.txt", "e.txt"):
        made.upload(made.client, "t1", f"small {name}".encode(), name)

    run = run_command(s3_env, base_dir, "--every", "1")
    assert run.stdout is not None
    try:
        for line in run.stdout:
            if line.startswith("2 file(s)"):  # a and b are in; the large one is next
                # Killed once its multipart upload has begun: parts sent, none visible.
                wait_until(lambda: bucket.list_stale_uploads(), timeout=120, interval=0.02)
                run.send_signal(signal.SIGKILL)
                break
    finally:
        run.kill()
        run.communicate()
    assert run.returncode == -signal.SIGKILL

    # Never a partial object: each blob is whole or absent.
    present = set()
    for key, body in made.blobs.items():
        if bucket.exists(key):
            assert stored_sha256(bucket, key) == sha(body)
            present.add(key)
    assert len(present) == 2  # a and b; the large one cut off, d and e never started
    assert len(bucket.list_stale_uploads()) == 1  # what the copy cut off left

    rerun = run_command(s3_env, base_dir)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, out + err
    left = len(made.blobs) - len(present)
    assert f"{len(made.blobs)} file(s): {left} copied, {len(present)} skipped" in out
    for key, body in made.blobs.items():
        assert stored_sha256(bucket, key) == sha(body)
    # The rerun leaves a copy cut off seconds ago to the sweep (it may be a live upload of
    # an instance); past its age, or swept now, it goes.
    assert sweep_stale_uploads(bucket, older_than=0) == 1
    assert bucket.list_stale_uploads() == []

    # Switched: the same command, still set to `local`, now refuses with the fix.
    again = run_command(s3_env, base_dir)
    out, err = again.communicate(timeout=300)
    assert again.returncode != 0
    assert "storage.backend: s3  (or DEER_FLOW_STORAGE_BACKEND=s3)" in out + err
    on_s3 = run_command({**s3_env, "DEER_FLOW_STORAGE_BACKEND": "s3"}, base_dir)
    out, err = on_s3.communicate(timeout=300)
    assert on_s3.returncode == 0, out + err
    assert "0 copied" in out
