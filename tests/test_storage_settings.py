"""`storage.backend` and `storage.s3.*` (settings.py), their `DEER_FLOW_STORAGE_*` variables,
and the refusal to start on a backend the app does not serve yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.agent.runtime import app_database
from deerflow_web.agent.runtime import resolve_thread_paths
from deerflow_web.errors import ConfigError
from deerflow_web.settings import S3Settings
from deerflow_web.settings import StorageSettings
from deerflow_web.settings import load_settings
from deerflow_web.storage.objects import make_object_store
from deerflow_web.storage.objects.disk import DiskObjectStore
from deerflow_web.storage.objects.s3 import S3ObjectStore

S3_CONFIG = """\
storage:
  backend: s3
  s3:
    endpoint_url: http://127.0.0.1:8333
    bucket: deerflow-files
    region: eu-central-1
    prefix: /install-a/
    presigned_downloads: yes
"""


def settings_from(tmp_path: Path, text: str, environ: dict[str, str] | None = None):
    (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    return load_settings(environ=environ or {}, cwd=tmp_path).storage


def test_the_local_disk_is_the_default(tmp_path: Path) -> None:
    assert load_settings(environ={}, cwd=tmp_path).storage == StorageSettings("local")
    assert isinstance(make_object_store(StorageSettings(), tmp_path), DiskObjectStore)


def test_s3_settings_from_the_file(tmp_path: Path) -> None:
    storage = settings_from(tmp_path, S3_CONFIG)
    assert storage == StorageSettings(
        "s3",
        S3Settings(
            endpoint_url="http://127.0.0.1:8333",
            bucket="deerflow-files",
            region="eu-central-1",
            prefix="install-a",
            presigned_downloads=True,
        ),
    )


def test_the_environment_wins_over_the_file(tmp_path: Path) -> None:
    environ = {
        "DEER_FLOW_STORAGE_S3_BUCKET": "other-bucket",
        "DEER_FLOW_STORAGE_S3_PREFIX": "b",
        "DEER_FLOW_STORAGE_S3_PRESIGNED_DOWNLOADS": "false",
        "DEER_FLOW_STORAGE_S3_ENDPOINT_URL": "http://minio:9000",
        "DEER_FLOW_STORAGE_S3_REGION": "us-west-2",
    }
    storage = settings_from(tmp_path, S3_CONFIG, environ)
    assert storage.s3 == S3Settings("http://minio:9000", "other-bucket", "us-west-2", "b", False)


def test_the_environment_alone_chooses_s3(tmp_path: Path) -> None:
    environ = {"DEER_FLOW_STORAGE_BACKEND": "S3", "DEER_FLOW_STORAGE_S3_BUCKET": "files"}
    storage = load_settings(environ=environ, cwd=tmp_path).storage
    assert storage.backend == "s3" and storage.s3.bucket == "files"
    assert storage.s3.endpoint_url is None and storage.s3.presigned_downloads is False


def test_the_s3_store_is_built_from_the_settings(tmp_path: Path) -> None:
    store = make_object_store(settings_from(tmp_path, S3_CONFIG), tmp_path)
    assert isinstance(store, S3ObjectStore)
    assert store.bucket == "deerflow-files" and store.prefix == "install-a/"
    assert store.client.meta.endpoint_url == "http://127.0.0.1:8333"
    assert store.client.meta.region_name == "eu-central-1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("storage:\n  backend: nfs\n", "storage.backend must be one of: local, s3"),
        ("storage:\n  backend: s3\n", "needs storage.s3.bucket"),
        ("storage:\n  backend: s3\n  s3:\n    bucket: ''\n", "needs storage.s3.bucket"),
        (
            "storage:\n  backend: s3\n  s3:\n    bucket: b\n    prefix: a/../b\n",
            "storage.s3.prefix 'a/../b' must be folder names",
        ),
    ],
)
def test_unusable_storage_settings_stop_start_up(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        storage = settings_from(tmp_path, text)
        make_object_store(storage, tmp_path)


def test_the_example_config_keeps_the_local_disk() -> None:
    example = Path(__file__).resolve().parents[1] / "config.example.yaml"
    storage = load_settings(config_path=example, environ={}).storage
    assert storage == StorageSettings("local", S3Settings(presigned_downloads=False))


def test_the_agent_side_keeps_its_folders_as_the_app_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEER_FLOW_HOME", str(tmp_path / "data"))
    local = resolve_thread_paths()
    assert local.base_dir == (tmp_path / "data").resolve()
    assert local.copies is None  # the data dir is the store itself
    monkeypatch.setenv("DEER_FLOW_STORAGE_BACKEND", "s3")
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_BUCKET", "files")
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    on_s3 = resolve_thread_paths()
    # A working copy of the bucket, kept by the records as the app's is.
    assert on_s3.copies is not None
    assert isinstance(on_s3.copies.store, S3ObjectStore)
    assert on_s3.copies.store.bucket == "files"


def test_the_stale_upload_age_is_a_day_unless_set(tmp_path: Path) -> None:
    assert settings_from(tmp_path, S3_CONFIG).s3.stale_upload_hours == 24.0
    configured = S3_CONFIG + "    stale_upload_hours: 6\n"
    assert settings_from(tmp_path, configured).s3.stale_upload_hours == 6.0
    environ = {"DEER_FLOW_STORAGE_S3_STALE_UPLOAD_HOURS": "0.5"}
    assert settings_from(tmp_path, configured, environ).s3.stale_upload_hours == 0.5


@pytest.mark.parametrize("bad", ["0", "-3", "soon", "true"])
def test_a_stale_upload_age_that_is_not_positive_keeps_the_default(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    configured = S3_CONFIG + f"    stale_upload_hours: {bad}\n"
    assert settings_from(tmp_path, configured).s3.stale_upload_hours == 24.0
    assert "storage.s3.stale_upload_hours" in caplog.text
    environ = {"DEER_FLOW_STORAGE_S3_STALE_UPLOAD_HOURS": bad}
    assert settings_from(tmp_path, S3_CONFIG, environ).s3.stale_upload_hours == 24.0


def test_the_working_copy_is_unbounded_unless_a_size_is_set(tmp_path: Path) -> None:
    assert settings_from(tmp_path, S3_CONFIG).s3.working_copy_max_bytes == 0
    configured = S3_CONFIG + "    working_copy_max_bytes: 10737418240\n"
    assert settings_from(tmp_path, configured).s3.working_copy_max_bytes == 10 * 1024**3
    environ = {"DEER_FLOW_STORAGE_S3_WORKING_COPY_MAX_BYTES": "1048576"}
    assert settings_from(tmp_path, configured, environ).s3.working_copy_max_bytes == 1024**2


@pytest.mark.parametrize("bad", ["-3", "lots", "true"])
def test_a_working_copy_size_that_is_not_positive_leaves_it_unbounded(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    configured = S3_CONFIG + f"    working_copy_max_bytes: {bad}\n"
    assert settings_from(tmp_path, configured).s3.working_copy_max_bytes == 0
    assert "storage.s3.working_copy_max_bytes" in caplog.text


def test_three_parts_are_in_flight_unless_set(tmp_path: Path) -> None:
    storage = settings_from(tmp_path, S3_CONFIG)
    assert storage.s3.parts_in_flight == 3
    assert make_object_store(storage, tmp_path).parts_in_flight == 3
    configured = S3_CONFIG + "    parts_in_flight: 1\n"
    assert settings_from(tmp_path, configured).s3.parts_in_flight == 1
    environ = {"DEER_FLOW_STORAGE_S3_PARTS_IN_FLIGHT": "6"}
    storage = settings_from(tmp_path, configured, environ)
    assert storage.s3.parts_in_flight == 6
    assert make_object_store(storage, tmp_path).parts_in_flight == 6  # the store is given it


@pytest.mark.parametrize("bad", ["0", "-2", "many", "true", "'2.5'"])
def test_parts_in_flight_below_one_or_not_a_count_keep_the_default(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    configured = S3_CONFIG + f"    parts_in_flight: {bad}\n"
    assert settings_from(tmp_path, configured).s3.parts_in_flight == 3
    assert "storage.s3.parts_in_flight" in caplog.text
    caplog.clear()
    environ = {"DEER_FLOW_STORAGE_S3_PARTS_IN_FLIGHT": bad.strip("'")}
    assert settings_from(tmp_path, S3_CONFIG, environ).s3.parts_in_flight == 3
    assert "storage.s3.parts_in_flight" in caplog.text


def test_the_agent_side_reads_the_records_of_the_apps_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    monkeypatch.setenv("DEER_FLOW_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("DEER_FLOW_STORAGE_BACKEND", "s3")
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_BUCKET", "files")
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    first, second = resolve_thread_paths(), resolve_thread_paths()
    assert first.copies is not None and first.copies.records is not None
    assert second.copies is not None and second.copies.records is not None
    engine = first.copies.records.engine
    try:
        # DATABASE_URL, not the data dir's own SQLite file; one engine for the process.
        assert engine.url.render_as_string(hide_password=False) == database_url
        assert second.copies.records.engine is engine
        assert app_database(tmp_path / "data", database_url) is engine
    finally:
        engine.dispose()
