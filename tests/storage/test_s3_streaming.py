"""Parts on their way while the writer goes on (`S3Writer`'s window), uploads streamed to an
incoming key (`WorkingCopies.open_incoming`), and the sweep of incoming objects a crash
left: against a real SeaweedFS, with the parts' requests held or failed on purpose."""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError
from sqlalchemy import Engine

from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.services.uploads.stale_uploads import StaleUploadSweeper
from deerflow_web.services.uploads.stale_uploads import remove_stale_incoming
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.keys import incoming_key
from deerflow_web.storage.objects.s3 import MIN_PART_SIZE
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.storage.objects.working_copy import WorkingCopies
from tests.helpers import wait_until
from tests.support.seaweedfs import SeaweedFS

# No request, no user: the mode is never read.
pytestmark = pytest.mark.same_in_both_modes

BUCKET = "deerflow-streaming"
KEY = "users/u1/threads/t1/user-data/uploads/big.bin"
SCOPE = "users/u1/threads/t1"


@pytest.fixture
def store(seaweedfs: SeaweedFS) -> S3ObjectStore:
    """A client of its own (its requests are wrapped below), 5 MiB parts, two in flight."""
    return seaweedfs.store(
        BUCKET, prefix=f"t-{secrets.token_hex(6)}", part_size=MIN_PART_SIZE, parts_in_flight=2
    )


class HeldParts:
    """Wraps the store's UploadPart: counts the calls in progress at once, holds each
    until `release` (when `held`), and fails the part numbers in `failing`."""

    def __init__(
        self, store: S3ObjectStore, *, held: bool, failing: frozenset[int] = frozenset()
    ) -> None:
        self._send = store.client.upload_part
        self.gate = threading.Event()
        if not held:
            self.gate.set()
        self.failing = failing
        self.started: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        store.client.upload_part = self  # type: ignore[method-assign]

    def __call__(self, **arguments: Any) -> Any:
        number = arguments["PartNumber"]
        with self._lock:
            self.started.append(number)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            if number in self.failing:
                raise EndpointConnectionError(endpoint_url="http://bucket.invalid")
            self.gate.wait(60)
            return self._send(**arguments)
        finally:
            with self._lock:
                self.running -= 1

    def release(self) -> None:
        self.gate.set()


def read_all(store: S3ObjectStore, key: str) -> bytes:
    with store.open_read(key) as stream:
        return b"".join(stream)


def test_parts_go_while_the_caller_writes_and_no_more_than_the_window_at_once(
    store: S3ObjectStore,
) -> None:
    held = HeldParts(store, held=True)
    body = os.urandom(7 * MIN_PART_SIZE + 12345)
    writer = store.open_writer(KEY)
    writer.write(body[: 2 * MIN_PART_SIZE])  # two full parts: the window, and no wait
    wait_until(lambda: held.started == [1, 2])
    assert writer.parts_in_flight == 2
    held.release()
    for offset in range(2 * MIN_PART_SIZE, len(body), 1024 * 1024):
        writer.write(body[offset : offset + 1024 * 1024])
    info = writer.commit()
    assert sorted(held.started) == list(range(1, 9))
    assert held.most_at_once == 2  # the window, never more
    assert info.size == len(body)
    assert info.sha256 == hashlib.sha256(body).hexdigest()
    assert read_all(store, KEY) == body
    assert store.list_stale_uploads() == []


def test_a_part_failing_while_others_are_on_their_way_fails_the_next_write_and_aborts(
    store: S3ObjectStore,
) -> None:
    held = HeldParts(store, held=True, failing=frozenset({2}))
    writer = store.open_writer(KEY)
    writer.write(os.urandom(2 * MIN_PART_SIZE))
    wait_until(lambda: sorted(held.started) == [1, 2] and writer.parts_in_flight == 1)
    held.release()  # part 1 arrives; part 2 has failed
    with pytest.raises(ObjectStoreUnavailable):
        writer.write(b"more")
    assert store.list_stale_uploads() == []  # aborted once part 1 had ended
    assert not store.exists(KEY)
    with pytest.raises(RuntimeError):
        writer.write(b"after the abort")


def test_a_part_failing_while_others_are_on_their_way_fails_the_commit_and_aborts(
    store: S3ObjectStore,
) -> None:
    held = HeldParts(store, held=False, failing=frozenset({3}))
    writer = store.open_writer(KEY)
    writer.write(os.urandom(3 * MIN_PART_SIZE + 10))
    with pytest.raises(ObjectStoreUnavailable):
        writer.commit()
    assert 3 in held.started
    assert store.list_stale_uploads() == []
    assert not store.exists(KEY)


def test_an_abort_waits_for_the_parts_on_their_way(store: S3ObjectStore) -> None:
    """A part landing after AbortMultipartUpload would store bytes no upload owns."""
    held = HeldParts(store, held=True)
    writer = store.open_writer(KEY)
    writer.write(os.urandom(2 * MIN_PART_SIZE))
    wait_until(lambda: len(held.started) == 2)
    aborting = threading.Thread(target=writer.abort)
    aborting.start()
    held.release()
    aborting.join(60)
    assert not aborting.is_alive()
    assert store.list_stale_uploads() == []
    assert list(store.list_keys()) == []


def test_a_writer_without_the_whole_hash_stores_the_same_bytes(store: S3ObjectStore) -> None:
    body = os.urandom(2 * MIN_PART_SIZE + 1)
    with store.open_writer(KEY, whole_sha256=False) as writer:
        writer.write(body)
        info = writer.commit()
    assert info.sha256 is None  # the caller hashes; S3 checked every part
    assert read_all(store, KEY) == body


# -- an upload's bytes on their way to the bucket ----------------------------------------


def test_an_incoming_copy_above_one_part_becomes_the_blob(
    store: S3ObjectStore, tmp_path: Path
) -> None:
    body = os.urandom(2 * MIN_PART_SIZE + 77)
    sha256 = hashlib.sha256(body).hexdigest()
    copies = WorkingCopies(store, tmp_path)
    incoming = copies.open_incoming(SCOPE)
    assert incoming is not None
    for offset in range(0, len(body), 1024 * 1024):
        incoming.write(body[offset : offset + 1024 * 1024])
    staged = tmp_path / "staged"
    staged.write_bytes(body)
    copies.store_staged(SCOPE, staged, sha256, incoming)
    assert [info.key for info in store.list_keys()] == [blob_key(SCOPE, sha256)]
    assert read_all(store, blob_key(SCOPE, sha256)) == body
    incoming.discard()  # adopted: nothing left to take back
    assert store.exists(blob_key(SCOPE, sha256))


def test_an_incoming_copy_below_one_part_sends_nothing_until_the_push(
    store: S3ObjectStore, tmp_path: Path
) -> None:
    body = os.urandom(MIN_PART_SIZE - 1)
    sha256 = hashlib.sha256(body).hexdigest()
    copies = WorkingCopies(store, tmp_path)
    incoming = copies.open_incoming(SCOPE)
    assert incoming is not None
    incoming.write(body)
    assert store.list_stale_uploads() == []  # no upload started
    staged = tmp_path / "staged"
    staged.write_bytes(body)
    copies.store_staged(SCOPE, staged, sha256, incoming)  # one PUT of the staged file
    assert [info.key for info in store.list_keys()] == [blob_key(SCOPE, sha256)]


@pytest.mark.parametrize("finished", [False, True])
def test_a_discarded_incoming_copy_leaves_nothing(store: S3ObjectStore, finished: bool) -> None:
    copies = WorkingCopies(store, "unused")
    incoming = copies.open_incoming(SCOPE)
    assert incoming is not None
    incoming.write(os.urandom(MIN_PART_SIZE + 5))
    if finished:
        assert incoming.finish() == incoming.key
        assert store.exists(incoming.key)
    incoming.discard()
    incoming.discard()
    assert store.list_stale_uploads() == []
    assert list(store.list_keys()) == []


def test_the_data_dir_streams_nothing_ahead(tmp_path: Path) -> None:
    from deerflow_web.storage.objects.disk import DiskObjectStore

    assert WorkingCopies(DiskObjectStore(tmp_path), tmp_path).open_incoming(SCOPE) is None


# -- the sweep of incoming objects nothing names -----------------------------------------


@pytest.fixture
def engine(base_dir: Path, database_url: str) -> Iterator[Engine]:
    engine = open_database(base_dir, database_url)
    try:
        yield engine
    finally:
        engine.dispose()


def put(store: S3ObjectStore, key: str, body: bytes = b"bytes") -> None:
    with store.open_writer(key) as writer:
        writer.write(body)
        writer.commit()


def sweeper(store: S3ObjectStore, engine: Engine, clock: Callable[[], float]) -> StaleUploadSweeper:
    return StaleUploadSweeper(store, JobLeases(engine), 3600.0, clock=clock)


def test_the_sweep_deletes_incoming_objects_older_than_the_age_and_nothing_else(
    store: S3ObjectStore, engine: Engine
) -> None:
    left = [incoming_key(SCOPE, "crashed"), incoming_key("threads/t9", "another")]
    kept = [blob_key(SCOPE, "a" * 64), f"{SCOPE}/user-data/uploads/incoming", "incoming"]
    for key in left + kept:
        put(store, key)
    assert sweeper(store, engine, time.time).sweep() == 0  # none is an hour old
    assert sorted(info.key for info in store.list_keys()) == sorted(left + kept)

    later = sweeper(store, engine, lambda: time.time() + 7200)
    assert later.sweep() == 2
    assert sorted(info.key for info in store.list_keys()) == sorted(kept)
    assert remove_stale_incoming(store, time.time() + 7200) == 0
