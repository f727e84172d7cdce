"""The bucket's sweep of unfinished multipart uploads as the app wires it: in
`flask --app app files sweep` and in the background jobs, only on the S3 backend."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.support.live_server import free_port
from tests.support.s3_deployment import s3_environment
from tests.support.seaweedfs import SeaweedFS

BUCKET = "deerflow-stale-cli"


@pytest.fixture
def bucket(seaweedfs: SeaweedFS) -> S3ObjectStore:
    return seaweedfs.store(BUCKET, prefix=f"t-{secrets.token_hex(6)}")


@pytest.fixture
def on_s3(monkeypatch: pytest.MonkeyPatch, seaweedfs: SeaweedFS, bucket: S3ObjectStore) -> None:
    for key, value in s3_environment(
        seaweedfs.endpoint_url, BUCKET, bucket.prefix.rstrip("/")
    ).items():
        monkeypatch.setenv(key, value)


def unfinished_upload(store: S3ObjectStore, key: str) -> str:
    full = store.prefix + key
    return store.client.create_multipart_upload(Bucket=store.bucket, Key=full)["UploadId"]


def sweep(app: Any) -> Any:
    return app.test_cli_runner().invoke(args=["files", "sweep"])


def test_files_sweep_aborts_the_unfinished_uploads_older_than_the_age(
    on_s3: None, bucket: S3ObjectStore, make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload_id = unfinished_upload(bucket, "scope/blobs/cut")
    kept = sweep(make_app())
    assert kept.exit_code == 0, kept.output
    assert "0 unfinished upload(s) older than 24 h aborted in the bucket" in kept.output
    assert [u.upload_id for u in bucket.list_stale_uploads()] == [upload_id]

    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_STALE_UPLOAD_HOURS", "0.000001")
    swept = sweep(make_app())
    assert swept.exit_code == 0, swept.output
    assert "1 unfinished upload(s) older than 1e-06 h aborted in the bucket" in swept.output
    assert bucket.list_stale_uploads() == []


def test_with_retention_on_files_sweep_sweeps_the_bucket_and_the_threads(
    on_s3: None, bucket: S3ObjectStore, make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_STALE_UPLOAD_HOURS", "0.000001")
    unfinished_upload(bucket, "scope/blobs/cut")
    result = sweep(make_app(retention={"thread_days": 7}))
    assert result.exit_code == 0, result.output
    assert "1 unfinished upload(s) older than" in result.output
    assert "retention sweep: 0 thread(s) moved to the trash" in result.output
    assert bucket.list_stale_uploads() == []


def test_files_sweep_with_the_bucket_out_of_reach_says_so(
    on_s3: None, make_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    result = sweep(make_app())
    assert result.exit_code != 0
    assert "File storage is unavailable right now" in result.output
    assert "Traceback" not in result.output


def test_on_s3_the_background_jobs_run_the_sweep(on_s3: None, make_app: Any) -> None:
    services = make_app().extensions[EXTENSION_KEY]
    assert services.stale_uploads is not None
    assert services.jobs.stale_uploads is services.stale_uploads
    assert services.stale_uploads.store is services.uploads.paths.copies.store
    assert services.stale_uploads.older_than_seconds == 24 * 3600
    assert "stale upload sweeps every 60 min (older than 24 h)" in services.jobs.describe()
    assert services.stale_uploads.is_running  # jobs.run_in_web: started here


def test_with_jobs_off_the_web_instance_leaves_the_sweep_to_workers(
    on_s3: None, make_app: Any
) -> None:
    services = make_app(jobs={"run_in_web": False}).extensions[EXTENSION_KEY]
    assert services.stale_uploads is not None
    assert not services.stale_uploads.is_running


def test_on_the_local_disk_there_is_no_bucket_to_sweep(make_app: Any) -> None:
    services = make_app().extensions[EXTENSION_KEY]
    assert services.stale_uploads is None and services.jobs.stale_uploads is None
    assert "stale upload" not in services.jobs.describe()
    result = sweep(make_app())
    assert result.exit_code != 0
    assert "Retention is off: set retention.thread_days" in result.output
