"""The sweep of unfinished multipart uploads in the bucket (`StaleUploadSweeper`), against a
real SeaweedFS and both databases: the age rule, the lease, the schedule, an outage."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.services.uploads.stale_uploads import LEASE_NAME
from deerflow_web.services.uploads.stale_uploads import StaleUploadSweeper
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.objects.s3 import S3ObjectStore
from tests.helpers import wait_until
from tests.support.live_server import free_port
from tests.support.seaweedfs import ACCESS_KEY
from tests.support.seaweedfs import SECRET_KEY
from tests.support.seaweedfs import SeaweedFS

# No request, no user: the mode is never read.
pytestmark = pytest.mark.same_in_both_modes

BUCKET = "deerflow-stale-uploads"


@pytest.fixture
def store(seaweedfs: SeaweedFS) -> S3ObjectStore:
    return seaweedfs.store(BUCKET, prefix=f"t-{secrets.token_hex(6)}")


@pytest.fixture
def engine(base_dir: Path, database_url: str) -> Iterator[Engine]:
    engine = open_database(base_dir, database_url)
    try:
        yield engine
    finally:
        engine.dispose()


def unfinished_upload(store: S3ObjectStore, key: str) -> str:
    """A multipart upload started with one part sent and never completed, as a process
    killed mid-push leaves it; its UploadId."""
    full = store.prefix + key
    upload_id = store.client.create_multipart_upload(Bucket=store.bucket, Key=full)["UploadId"]
    store.client.upload_part(
        Bucket=store.bucket, Key=full, UploadId=upload_id, PartNumber=1, Body=b"x" * 1024
    )
    return upload_id


def test_a_sweep_aborts_the_uploads_older_than_the_age_and_nothing_else(
    store: S3ObjectStore, engine: Engine
) -> None:
    with store.open_writer("s/blobs/kept") as writer:
        writer.write(b"a committed object")
        writer.commit()
    upload_id = unfinished_upload(store, "s/blobs/cut")
    leases = JobLeases(engine)

    young = StaleUploadSweeper(store, leases, older_than_seconds=3600)
    assert young.sweep() == 0  # it may be a live instance's: kept
    assert [u.upload_id for u in store.list_stale_uploads()] == [upload_id]

    assert StaleUploadSweeper(store, leases, older_than_seconds=0.0).sweep() == 1
    assert store.list_stale_uploads() == []
    assert [info.key for info in store.list_keys()] == ["s/blobs/kept"]
    assert StaleUploadSweeper(store, leases, older_than_seconds=0.0).sweep() == 0


def test_one_instance_sweeps_at_a_time(store: S3ObjectStore, engine: Engine) -> None:
    unfinished_upload(store, "s/blobs/cut")
    leases = JobLeases(engine)
    now = time.time()
    assert leases.take(LEASE_NAME, "another-instance", now, now + 300)
    sweeper = StaleUploadSweeper(store, leases, older_than_seconds=0.0)
    assert sweeper.sweep() is None  # the other one is sweeping
    assert len(store.list_stale_uploads()) == 1
    leases.release(LEASE_NAME, "another-instance")
    assert sweeper.sweep() == 1
    # Released after the sweep: the next instance may take it at once.
    assert leases.take(LEASE_NAME, "another-instance", time.time(), time.time() + 300)


def test_instances_sweep_once_per_interval_between_them(
    store: S3ObjectStore, engine: Engine
) -> None:
    clock = [1_000_000.0]
    leases = JobLeases(engine)
    first, second = (
        StaleUploadSweeper(
            store, leases, 0.0, interval_seconds=3600, clock=lambda: clock[0], owner=name
        )
        for name in ("first", "second")
    )
    unfinished_upload(store, "s/blobs/one")
    assert first.sweep_if_due() == 1
    unfinished_upload(store, "s/blobs/two")
    clock[0] += 600
    assert second.sweep_if_due() is None  # the first swept 10 minutes ago
    assert first.sweep_if_due() is None
    assert len(store.list_stale_uploads()) == 1
    clock[0] += 3600
    assert second.sweep_if_due() == 1
    assert store.list_stale_uploads() == []


def test_a_bucket_out_of_reach_raises_and_leaves_the_lease_free(engine: Engine) -> None:
    nowhere = S3ObjectStore(
        BUCKET,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        connect_timeout=1.0,
        max_attempts=1,
    )
    leases = JobLeases(engine)
    sweeper = StaleUploadSweeper(nowhere, leases, older_than_seconds=0.0)
    with pytest.raises(ObjectStoreUnavailable):
        sweeper.sweep()
    now = time.time()
    assert leases.take(LEASE_NAME, "another-instance", now, now + 300)
    assert sweeper.sweep_if_due() is None  # taken now; no sweep was remembered either
    leases.release(LEASE_NAME, "another-instance")
    with pytest.raises(ObjectStoreUnavailable):
        sweeper.sweep_if_due()  # still due: the failed sweep did not count


def test_the_background_job_sweeps_until_stopped(store: S3ObjectStore, engine: Engine) -> None:
    unfinished_upload(store, "s/blobs/cut")
    sweeper = StaleUploadSweeper(store, JobLeases(engine), 0.0, interval_seconds=0.1)
    sweeper.start()
    try:
        wait_until(lambda: store.list_stale_uploads() == [], timeout=30)
    finally:
        sweeper.stop()
    assert not sweeper.is_running
    assert "stale upload sweeps every" in sweeper.describe()
