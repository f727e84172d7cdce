"""A working copy within `storage.s3.working_copy_max_bytes` (storage/objects/eviction.py):
an instance on a real SeaweedFS bucket whose data dir is over the bound lets go of the
threads used longest ago, keeps those in use and what the bucket does not hold, and serves
every evicted file again, fetched and checked, the next time it is read."""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.storage.objects.eviction import ROUND_LOCK
from deerflow_web.storage.objects.eviction import USED_MARKER
from deerflow_web.storage.objects.eviction import Eviction
from deerflow_web.storage.objects.eviction import WorkingCopyBudget
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import UploadActions
from tests.helpers import thread_dir
from tests.helpers import uploads_dir
from tests.helpers import user_data_dir
from tests.support.s3_deployment import s3_environment
from tests.support.seaweedfs import SeaweedFS

BUCKET = "deerflow-budget"
KiB = 1024


@pytest.fixture
def on_s3(monkeypatch: pytest.MonkeyPatch, seaweedfs: SeaweedFS, database_url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    prefix = f"t-{secrets.token_hex(6)}"
    seaweedfs.store(BUCKET, prefix=prefix)  # makes the bucket
    for name, value in s3_environment(seaweedfs.endpoint_url, BUCKET, prefix).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def instance(on_s3: None, make_app: Any, base_dir: Path) -> Any:
    return make_app()


@pytest.fixture
def client(instance: Any) -> Any:
    """The S3 instance's client (signed in when accounts are on)."""
    return instance.test_client()


def budget_of(app: Any, base_dir: Path, max_bytes: int, **options: Any) -> WorkingCopyBudget:
    services = app.extensions[EXTENSION_KEY]
    return WorkingCopyBudget(base_dir, services.uploads.records, max_bytes, **options)


def evict(app: Any, base_dir: Path, max_bytes: int) -> Eviction:
    """One round by this process (none other is at it), sparing threads read in the
    last minute."""
    done = budget_of(app, base_dir, max_bytes, idle_seconds=60).evict()
    assert done is not None
    return done


def used_ago(base_dir: Path, thread_id: str, seconds: float) -> None:
    """The thread was last read `seconds` ago."""
    marker = thread_dir(base_dir, thread_id) / USED_MARKER
    marker.touch()
    then = time.time() - seconds
    os.utime(marker, (then, then))


def fill(client: Any, thread_id: str, *names: str, size: int = 100 * KiB) -> dict[str, bytes]:
    uploads = UploadActions(client)
    bodies = {name: secrets.token_bytes(size) for name in names}
    response = uploads.upload(thread_id, *[(body, name) for name, body in bodies.items()])
    assert response.status_code == 200, response.get_json()
    return bodies


def download(client: Any, thread_id: str, name: str) -> bytes:
    response = client.get(f"/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}")
    assert response.status_code == 200
    data = response.get_data()
    response.close()
    return data


def test_the_threads_used_longest_ago_leave_first_and_come_back_on_reading(
    instance: Any, client: Any, base_dir: Path
) -> None:
    old = fill(client, "old", "a.bin", "b.bin")
    middle = fill(client, "middle", "c.bin")
    recent = fill(client, "recent", "d.bin")
    used_ago(base_dir, "old", 3600)
    used_ago(base_dir, "middle", 1800)
    used_ago(base_dir, "recent", 900)

    # 400 KiB held, 150 KiB allowed: down to 80% (120 KiB) takes the two oldest threads.
    done = evict(instance, base_dir, 150 * KiB)

    assert (done.threads, done.freed_bytes, done.held_bytes) == (2, 300 * KiB, 100 * KiB)
    assert list(uploads_dir(base_dir, "old").iterdir()) == []
    assert list(uploads_dir(base_dir, "middle").iterdir()) == []
    assert (uploads_dir(base_dir, "recent") / "d.bin").read_bytes() == recent["d.bin"]
    # Still listed (the records say what a thread holds), and served byte for byte.
    assert UploadActions(client).names("old") == ["a.bin", "b.bin"]
    assert download(client, "old", "b.bin") == old["b.bin"]  # streamed from the bucket
    assert (uploads_dir(base_dir, "old") / "b.bin").read_bytes() == old["b.bin"]  # and kept
    # What reads the file here (a preview, the agent) fetches it again.
    assert client.get("/threads/old/files/uploads/a.bin").status_code == 200
    assert (uploads_dir(base_dir, "old") / "a.bin").read_bytes() == old["a.bin"]
    assert download(client, "middle", "c.bin") == middle["c.bin"]


def test_within_the_bound_nothing_leaves(instance: Any, client: Any, base_dir: Path) -> None:
    fill(client, "t1", "a.bin")
    used_ago(base_dir, "t1", 3600)
    done = evict(instance, base_dir, 100 * KiB)
    assert (done.threads, done.freed_bytes, done.held_bytes) == (0, 0, 100 * KiB)
    assert (uploads_dir(base_dir, "t1") / "a.bin").exists()


def test_a_thread_in_use_stays_even_over_the_bound(
    instance: Any, client: Any, base_dir: Path
) -> None:
    fill(client, "busy", "a.bin")
    fill(client, "idle", "b.bin")
    used_ago(base_dir, "idle", 3600)  # "busy" was just written: in use

    done = evict(instance, base_dir, 10 * KiB)

    assert (done.threads, done.held_bytes) == (1, 100 * KiB)
    assert (uploads_dir(base_dir, "busy") / "a.bin").exists()
    assert not (uploads_dir(base_dir, "idle") / "b.bin").exists()


def test_what_the_bucket_does_not_hold_stays(instance: Any, client: Any, base_dir: Path) -> None:
    fill(client, "t1", "a.bin")
    outputs = user_data_dir(base_dir, "t1") / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "report.md").write_text("the agent's own work\n")
    staging = uploads_dir(base_dir, "t1") / ".upload-abc.part"
    staging.write_bytes(b"on its way in")
    used_ago(base_dir, "t1", 3600)

    done = evict(instance, base_dir, 1)

    assert done.freed_bytes == 100 * KiB
    assert (outputs / "report.md").read_text() == "the agent's own work\n"
    assert staging.read_bytes() == b"on its way in"


def test_the_trash_and_versions_of_uploads_leave_and_come_back(
    instance: Any, client: Any, base_dir: Path
) -> None:
    first = fill(client, "t1", "notes.bin")["notes.bin"]
    second = fill(client, "t1", "notes.bin")["notes.bin"]  # the first kept as a version
    gone = fill(client, "t1", "old.bin")["old.bin"]
    assert client.delete("/api/threads/t1/uploads/old.bin").status_code == 200
    history = thread_dir(base_dir, "t1") / "history"
    held = [p for p in history.rglob("*") if p.is_file()]
    assert len(held) == 2  # one version, one trashed file
    used_ago(base_dir, "t1", 3600)

    done = evict(instance, base_dir, 1)

    assert done.freed_bytes == 300 * KiB
    assert [p for p in history.rglob("*") if p.is_file()] == []
    versions = client.get("/api/threads/t1/uploads/notes.bin/versions").get_json()
    (version,) = versions["versions"]
    restored = client.post(
        f"/api/threads/t1/uploads/notes.bin/versions/{version['version_id']}/restore"
    )
    assert restored.status_code == 200, restored.get_json()
    assert download(client, "t1", "notes.bin") == first
    trash = client.get("/api/threads/t1/trash").get_json()
    (entry,) = trash["files"]
    back = client.post(f"/api/threads/t1/trash/{entry['trash_id']}/restore")
    assert back.status_code == 200, back.get_json()
    assert download(client, "t1", "old.bin") == gone
    assert second != first


def test_one_process_of_a_data_dir_evicts_at_a_time(
    instance: Any, client: Any, base_dir: Path
) -> None:
    fill(client, "t1", "a.bin")
    used_ago(base_dir, "t1", 3600)
    budget = budget_of(instance, base_dir, 1, idle_seconds=60)
    held = os.open(base_dir / ROUND_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process of this instance is at it
        assert budget.evict() is None
        assert (uploads_dir(base_dir, "t1") / "a.bin").exists()
    finally:
        os.close(held)
    done = budget.evict()
    assert done is not None and done.threads == 1


def test_an_instance_given_a_bound_keeps_its_data_dir_within_it(
    monkeypatch: pytest.MonkeyPatch, on_s3: None, make_app: Any, base_dir: Path
) -> None:
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_WORKING_COPY_MAX_BYTES", str(150 * KiB))
    app = make_app()
    job = app.extensions[EXTENSION_KEY].working_copy_budget
    assert job is not None and job.is_running  # in every process that reads the copy
    client = app.test_client()
    fill(client, "old", "a.bin", "b.bin")
    fill(client, "recent", "c.bin")
    used_ago(base_dir, "old", 3600)

    job.run_once()  # a round, as the schedule runs it every minute

    assert list(uploads_dir(base_dir, "old").iterdir()) == []
    assert (uploads_dir(base_dir, "recent") / "c.bin").exists()
    job.stop()


def test_without_a_bound_or_a_bucket_no_eviction_runs(
    monkeypatch: pytest.MonkeyPatch, make_app: Any
) -> None:
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_WORKING_COPY_MAX_BYTES", str(150 * KiB))
    local = make_app()  # the local disk is the files themselves, not a copy
    assert local.extensions[EXTENSION_KEY].working_copy_budget is None


def test_an_instance_on_s3_without_a_bound_runs_none(on_s3: None, make_app: Any) -> None:
    assert make_app().extensions[EXTENSION_KEY].working_copy_budget is None
