"""tus on the S3 backend across two instances: one database and one bucket (a real
SeaweedFS) shared, each instance with a data dir of its own. The bytes of every PATCH go
to the bucket as parts and a tail, so any instance takes the next request, and the one
that gets the last byte completes the file, whichever instances saw the others."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlalchemy import select

from deerflow_web.errors import StorageFailure
from deerflow_web.storage.database import resumable_parts
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.support.tus import CHUNK_TYPE
from tests.support.tus import TUS
from tests.support.tus import TusActions
from tests.support.tus import b64digest
from tests.support.tus import encode_metadata
from tests.web.api.test_s3_backend import Instance
from tests.web.api.test_s3_backend import bucket  # noqa: F401 - fixtures
from tests.web.api.test_s3_backend import on_s3  # noqa: F401
from tests.web.api.test_s3_backend import s3_server  # noqa: F401
from tests.web.api.test_s3_backend import scope_of

pytestmark = pytest.mark.same_in_both_modes

MiB = 1024 * 1024


def two_instances(
    make_app: Any, tmp_path: Path, uploads: dict[str, Any] | None = None
) -> tuple[Instance, Instance]:
    """Instances A and B, each with a data dir of its own, configured with `uploads`."""
    made = []
    for name in ("a", "b"):
        base_dir = tmp_path / name
        base_dir.mkdir()
        made.append(Instance(make_app(uploads, BASE_DIR=str(base_dir)), base_dir))
    return made[0], made[1]


@pytest.fixture
def instances(on_s3: None, make_app: Any, tmp_path: Path) -> Iterator[tuple[Instance, Instance]]:  # noqa: F811
    yield two_instances(make_app, tmp_path)


def tus(instance: Instance) -> TusActions:
    return TusActions(instance.client)


def services(instance: Instance) -> Any:
    return instance.app.extensions[EXTENSION_KEY]


def bucket_keys(store: S3ObjectStore, thread_id: str) -> list[str]:
    return sorted(info.key for info in store.list_keys(f"{scope_of(thread_id)}/"))


def only_the_blob(store: S3ObjectStore, thread_id: str, data: bytes) -> None:
    """What a finished upload leaves in the bucket: its blob, nothing on its way."""
    sha256 = hashlib.sha256(data).hexdigest()
    assert bucket_keys(store, thread_id) == [blob_key(scope_of(thread_id), sha256)]
    assert store.list_stale_uploads() == []


def patched(actions: TusActions, url: str, offset: int, data: bytes, **options: Any) -> int:
    response = actions.patch(url, offset, data, **options)
    assert response.status_code == 204, response.get_json()
    return int(response.headers["Upload-Offset"])


def sha256_header(data: bytes) -> str:
    return f"sha256 {b64digest('sha256', data)}"


def served_equal(instance: Instance, thread_id: str, name: str, data: bytes) -> None:
    served = instance.download(thread_id, name)
    assert served.status_code == 200
    assert served.data == data


def test_an_upload_moves_between_instances_chunk_by_chunk(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(15 * MiB)
    url = tus(a).start("t1", len(data), "film.bin")
    assert patched(tus(a), url, 0, data[:MiB]) == MiB  # below S3's smallest part: a tail
    assert tus(b).offset(url) == MiB  # B knows where A left it
    assert patched(tus(b), url, MiB, data[MiB : 14 * MiB]) == 14 * MiB  # a part, a tail
    assert tus(a).offset(url) == 14 * MiB
    assert b.uploads.names("t1") == []  # nothing listed before the last byte
    assert patched(tus(a), url, 14 * MiB, data[14 * MiB :]) == len(data)
    for instance in (a, b):
        assert instance.uploads.names("t1") == ["film.bin"]
        served_equal(instance, "t1", "film.bin", data)
    listed = a.client.get("/api/threads/t1/uploads/list").get_json()["files"]
    assert listed[0]["sha256"] == hashlib.sha256(data).hexdigest()
    assert listed[0]["size"] == len(data)
    only_the_blob(bucket, "t1", data)


def test_the_instance_that_saw_every_byte_commits_its_own_copy(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(13 * MiB + 5)
    url = tus(a).start("t1", len(data), "whole.bin")
    assert patched(tus(a), url, 0, data[: 13 * MiB]) == 13 * MiB
    assert patched(tus(a), url, 13 * MiB, data[13 * MiB :]) == len(data)
    assert a.local("t1", "whole.bin").read_bytes() == data
    served_equal(b, "t1", "whole.bin", data)
    only_the_blob(bucket, "t1", data)


def test_an_upload_smaller_than_one_part_is_its_tail(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(300_000)
    url = tus(a).start("t1", len(data), "small.bin")
    assert patched(tus(a), url, 0, data[:100_000]) == 100_000
    assert bucket.list_stale_uploads() == []  # no multipart upload below one part
    assert patched(tus(b), url, 100_000, data[100_000:]) == len(data)
    served_equal(a, "t1", "small.bin", data)
    served_equal(b, "t1", "small.bin", data)
    only_the_blob(bucket, "t1", data)


def test_an_empty_upload_is_committed_at_creation(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    response = tus(a).create("t1", 0, encode_metadata(filename="empty.txt"))
    assert response.status_code == 201
    assert b.uploads.names("t1") == ["empty.txt"]
    served_equal(b, "t1", "empty.txt", b"")
    only_the_blob(bucket, "t1", b"")


def test_a_checksum_mismatch_on_b_rolls_back_to_where_a_left_it(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(20 * MiB)
    url = tus(a).start("t1", len(data), "checked.bin")
    assert patched(tus(a), url, 0, data[: 9 * MiB]) == 9 * MiB  # part 1 and a tail
    wrong = bytearray(data[9 * MiB : 18 * MiB])
    wrong[-1] ^= 1  # part 2 goes out before the end shows the mismatch
    refused = tus(b).patch(
        url, 9 * MiB, bytes(wrong), checksum=sha256_header(data[9 * MiB : 18 * MiB])
    )
    assert refused.status_code == 460
    assert tus(a).offset(url) == tus(b).offset(url) == 9 * MiB
    good = data[9 * MiB : 18 * MiB]
    assert patched(tus(b), url, 9 * MiB, good, checksum=sha256_header(good)) == 18 * MiB
    assert patched(tus(a), url, 18 * MiB, data[18 * MiB :]) == len(data)
    served_equal(b, "t1", "checked.bin", data)  # part 2 is the retry's, not the refused one
    only_the_blob(bucket, "t1", data)


def test_a_retry_of_the_last_patch_on_b_is_answered_and_nothing_else_is_written(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    """The answer to A's last PATCH was lost: the client sends it again, to B."""
    a, b = instances
    data = os.urandom(200_000)
    url = tus(a).start("t1", len(data), "once.bin")
    assert patched(tus(a), url, 0, data) == len(data)
    assert patched(tus(b), url, len(data), b"") == len(data)  # answered as before
    assert tus(b).patch(url, len(data), b"more").status_code == 400  # past the length
    assert tus(b).patch(url, 0, data).status_code == 409  # not where the upload stands
    assert b.uploads.names("t1") == ["once.bin"]
    served_equal(b, "t1", "once.bin", data)
    only_the_blob(bucket, "t1", data)


def test_delete_on_b_aborts_what_a_started(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(9 * MiB)
    url = tus(a).start("t1", len(data) + MiB, "dropped.bin")
    assert patched(tus(a), url, 0, data) == len(data)
    assert len(bucket.list_stale_uploads()) == 1  # the multipart upload, a part in it
    assert len(bucket_keys(bucket, "t1")) == 1  # the tail
    assert tus(b).delete(url).status_code == 204
    assert bucket.list_stale_uploads() == []
    assert bucket_keys(bucket, "t1") == []
    assert tus(a).head(url).status_code == 404
    assert tus(a).patch(url, len(data), b"x").status_code == 404
    assert a.uploads.names("t1") == b.uploads.names("t1") == []


class HeldBody(io.BytesIO):
    """A request body that waits for `go` before its bytes flow."""

    def __init__(self, data: bytes, go: threading.Event, reading: threading.Event) -> None:
        super().__init__(data)
        self._go = go
        self._reading = reading

    def _hold(self) -> None:
        self._reading.set()
        assert self._go.wait(60)

    def read(self, size: int | None = -1) -> bytes:
        self._hold()
        return super().read(size)

    def readinto(self, buffer: Any) -> int:
        self._hold()
        return super().readinto(buffer)


def test_two_patches_at_once_on_two_instances_one_is_refused(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(10 * MiB)
    url = tus(a).start("t1", len(data), "raced.bin")
    chunks = {"a": data[: 9 * MiB], "b": bytes(reversed(data[: 9 * MiB]))}
    start = threading.Barrier(2)
    go = threading.Event()
    reading = threading.Event()
    statuses: dict[str, int] = {}

    def send(name: str, instance: Instance) -> None:
        body = HeldBody(chunks[name], go, reading)
        headers = {
            **TUS,
            "Upload-Offset": "0",
            "Content-Type": CHUNK_TYPE,
            "Content-Length": str(len(chunks[name])),
        }
        start.wait()
        response = instance.client.patch(url, input_stream=body, headers=headers)
        statuses[name] = response.status_code

    threads = [threading.Thread(target=send, args=pair) for pair in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    try:
        while not (statuses and reading.is_set()) and time.monotonic() < deadline:
            time.sleep(0.01)  # the loser answers while the winner waits for its bytes
        assert len(statuses) == 1
    finally:
        go.set()
    for thread in threads:
        thread.join(60)
    assert sorted(statuses.values()) == [204, 409]
    winner = next(name for name, status in statuses.items() if status == 204)
    assert tus(b).offset(url) == 9 * MiB
    assert patched(tus(b), url, 9 * MiB, data[9 * MiB :]) == len(data)
    expected = chunks[winner] + data[9 * MiB :]
    served_equal(a, "t1", "raced.bin", expected)  # the loser's bytes are nowhere
    only_the_blob(bucket, "t1", expected)


def test_a_lease_held_by_a_dead_writer_runs_out_after_the_configured_lease(
    on_s3: None,  # noqa: F811
    make_app: Any,
    tmp_path: Path,
) -> None:
    a, b = two_instances(make_app, tmp_path, {"resumable_lease_seconds": 2})
    resumable = services(a).resumable
    assert resumable.lease_seconds == services(b).resumable.lease_seconds == 2.0
    url = tus(a).start("t1", 10, "late.bin")
    upload = resumable.store.get(url.rsplit("/", 1)[-1])
    assert upload is not None
    # A's writer takes the lease as a PATCH does, then dies without releasing it.
    lapses_at = time.time() + resumable.lease_seconds
    assert resumable._lease(upload) is not None
    assert tus(b).patch(url, 0, b"01234").status_code == 409  # held
    assert tus(b).head(url).status_code == 200  # reading needs no lease
    assert time.time() < lapses_at  # the 409 came while the lease was live
    time.sleep(lapses_at - time.time() + 0.1)
    assert patched(tus(b), url, 0, b"0123456789") == 10
    served_equal(a, "t1", "late.bin", b"0123456789")


def test_the_stale_upload_sweep_spares_what_a_live_upload_fills(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(9 * MiB)
    url = tus(a).start("t1", len(data) + 1, "slow.bin")
    assert patched(tus(a), url, 0, data) == len(data)
    sweeper = services(b).stale_uploads
    sweeper.older_than_seconds = 0.0  # every multipart upload is old enough
    assert sweeper.sweep() == 0
    assert len(bucket.list_stale_uploads()) == 1
    assert patched(tus(b), url, len(data), b"!") == len(data) + 1
    served_equal(b, "t1", "slow.bin", data + b"!")
    only_the_blob(bucket, "t1", data + b"!")


def test_expiry_aborts_the_multipart_upload_and_deletes_the_tail(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(9 * MiB)
    url = tus(a).start("t1", len(data) + MiB, "expired.bin")
    assert patched(tus(a), url, 0, data) == len(data)
    resumable = services(b).resumable
    resumable._clock = lambda: time.time() + resumable.expiry_seconds + 60
    assert resumable.sweep_expired() == 1
    assert bucket.list_stale_uploads() == []
    assert bucket_keys(bucket, "t1") == []
    assert tus(a).head(url).status_code == 404
    left_on_a = list(a.local("t1", "").glob(".upload-tus-*"))  # A's copy of the bytes
    assert left_on_a
    assert not services(a).resumable.is_live_staging(left_on_a[0])  # A's sweep takes it


def test_a_name_refused_at_the_end_leaves_nothing_on_its_way(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(9 * MiB)
    url = tus(a).start("t1", len(data), "taken.bin", on_conflict="reject")
    assert patched(tus(a), url, 0, data[:MiB]) == MiB
    assert b.uploads.upload("t1", (b"first", "taken.bin")).status_code == 200
    refused = tus(b).patch(url, MiB, data[MiB:])
    assert refused.status_code == 409
    assert tus(a).head(url).status_code == 404
    assert bucket.list_stale_uploads() == []
    assert not [k for k in bucket_keys(bucket, "t1") if "/incoming/" in k]
    served_equal(a, "t1", "taken.bin", b"first")


def test_a_commit_that_failed_on_a_is_finished_by_a_head_on_b(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = instances
    data = os.urandom(9 * MiB)
    url = tus(a).start("t1", len(data), "retried.bin")

    def database_gone(*args: Any, **kwargs: Any) -> Any:
        raise StorageFailure("the database is out of reach")

    monkeypatch.setattr(services(a).resumable.intake, "accept_staged", database_gone)
    failed = tus(a).patch(url, 0, data)
    assert failed.status_code >= 500
    assert a.uploads.names("t1") == b.uploads.names("t1") == []
    assert tus(b).offset(url) == len(data)  # B commits it from the blob
    assert b.uploads.names("t1") == a.uploads.names("t1") == ["retried.bin"]
    served_equal(a, "t1", "retried.bin", data)
    served_equal(b, "t1", "retried.bin", data)
    only_the_blob(bucket, "t1", data)


class StealingBody(io.BytesIO):
    """A body whose first read happens after another writer took the lease over."""

    def __init__(self, data: bytes, steal: Any) -> None:
        super().__init__(data)
        self._steal = steal

    def read(self, size: int | None = -1) -> bytes:
        if self._steal is not None:
            self._steal, steal = None, self._steal
            steal()
        return super().read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def test_a_writer_whose_lease_was_taken_over_sends_nothing_more(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    data = os.urandom(9 * MiB)
    url = tus(a).start("t1", len(data), "overtaken.bin")
    upload_id = url.rsplit("/", 1)[-1]
    store = services(b).resumable.s3_store

    def steal() -> None:  # as when a writer stalls past its lease and another takes it
        later = time.time() + 10_000
        assert store.take_lease(upload_id, "the-next-writer", later, later + 120)

    headers = {**TUS, "Upload-Offset": "0", "Content-Type": CHUNK_TYPE}
    headers["Content-Length"] = str(len(data))
    response = a.client.patch(url, input_stream=StealingBody(data, steal), headers=headers)
    assert response.status_code == 409
    assert bucket.list_stale_uploads() == []  # its multipart upload went with it
    assert bucket_keys(bucket, "t1") == []
    assert tus(b).offset(url) == 0


def test_deleting_the_thread_ends_its_unfinished_upload_in_the_bucket(
    instances: tuple[Instance, Instance],
    bucket: S3ObjectStore,  # noqa: F811
) -> None:
    a, b = instances
    assert a.uploads.upload("t1", (b"kept a moment", "notes.txt")).status_code == 200
    url = tus(a).start("t1", 10 * MiB, "unfinished.bin")
    assert patched(tus(a), url, 0, os.urandom(9 * MiB)) == 9 * MiB
    assert bucket.list_stale_uploads() != []  # one part on its way, and a tail
    assert b.client.delete("/api/threads/t1").status_code == 200
    engine = services(b).engine
    with engine.connect() as db:
        assert db.execute(select(func.count()).select_from(resumable_parts)).scalar_one() == 0
    # Gone with the thread, not left for the sweep.
    assert bucket.list_stale_uploads() == []
    assert bucket_keys(bucket, "t1") == []
    sweeper = services(b).stale_uploads
    sweeper.older_than_seconds = 0.0
    assert sweeper.sweep() == 0
