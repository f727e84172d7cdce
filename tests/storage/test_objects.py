"""The object-store contract (storage/objects), held to both backends alike: the data dir and
a real S3 server (SeaweedFS, tests/support/seaweedfs.py).

Each S3 test works under a prefix of its own in the session's one bucket, so it also proves
that a store never sees past its prefix. Faults are real: a writer's process is killed with
SIGKILL mid-upload, and the S3 server is stopped and started again under a live store.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deerflow_web.errors import InvalidObjectKey
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.errors import StorageFailure
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import Area
from deerflow_web.storage.objects import ObjectStore
from deerflow_web.storage.objects import area_key
from deerflow_web.storage.objects import sweep_stale_uploads
from deerflow_web.storage.objects.base import ObjectFile
from deerflow_web.storage.objects.disk import DiskObjectStore
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.keys import incoming_key
from deerflow_web.storage.objects.s3 import MIN_PART_SIZE
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.storage.objects.working_copy import WorkingCopies
from tests.support.seaweedfs import ACCESS_KEY
from tests.support.seaweedfs import SECRET_KEY
from tests.support.seaweedfs import SeaweedFS

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

BUCKET = "deerflow-tests"
MiB = 1024 * 1024
KEY = "users/u1/threads/t1/user-data/uploads/report.txt"


@pytest.fixture(scope="module")
def bucket(seaweedfs: SeaweedFS) -> S3ObjectStore:
    """The session bucket through one client, with S3's smallest parts (5 MiB)."""
    return seaweedfs.store(BUCKET, part_size=MIN_PART_SIZE)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each backend in turn; the S3 one under a fresh prefix of the bucket."""
    if request.param == "local":
        return DiskObjectStore(tmp_path / "data")
    bucket: S3ObjectStore = request.getfixturevalue("bucket")
    return bucket.with_prefix(f"test-{uuid.uuid4().hex}")


def read_all(store: ObjectStore, key: str, start: int = 0, length: int | None = None) -> bytes:
    with store.open_read(key, start, length) as stream:
        return b"".join(stream)


def write(store: ObjectStore, key: str, *chunks: bytes) -> str:
    """Write and commit `chunks`; return the sha256 the writer reported."""
    with store.open_writer(key) as writer:
        for chunk in chunks:
            writer.write(chunk)
        return writer.commit().sha256 or ""


def test_written_bytes_are_read_back_with_their_sha256(store: ObjectStore) -> None:
    body = b"quarterly numbers\n" * 1000
    with store.open_writer(KEY) as writer:
        writer.write(body[:7000])
        writer.write(body[7000:])
        assert writer.size == len(body)
        info = writer.commit()
    assert info.key == KEY and info.size == len(body)
    assert info.sha256 == hashlib.sha256(body).hexdigest()
    assert read_all(store, KEY) == body
    head = store.head(KEY)
    assert head.size == len(body)
    # S3 keeps the digest of a single-PUT object as metadata; the disk keeps none
    assert head.sha256 == (info.sha256 if store.name == "s3" else None)
    assert store.exists(KEY)


def test_an_empty_object(store: ObjectStore) -> None:
    assert write(store, KEY) == hashlib.sha256(b"").hexdigest()
    assert read_all(store, KEY) == b"" and store.head(KEY).size == 0


def test_nothing_is_visible_before_commit(store: ObjectStore) -> None:
    writer = store.open_writer(KEY)
    writer.write(os.urandom(MIN_PART_SIZE + 10))  # on S3, a multipart upload has begun
    assert not store.exists(KEY)
    assert [info.key for info in store.list_keys()] == []
    writer.commit()
    assert store.exists(KEY)
    assert [info.key for info in store.list_keys()] == [KEY]


@pytest.mark.parametrize("size", [100, MIN_PART_SIZE + 10])
def test_abort_leaves_nothing(store: ObjectStore, size: int) -> None:
    writer = store.open_writer(KEY)
    writer.write(os.urandom(size))
    writer.abort()
    writer.abort()  # twice is fine
    assert not store.exists(KEY)
    assert list(store.list_keys()) == [] and store.list_stale_uploads() == []


def test_an_error_inside_the_writer_block_aborts(store: ObjectStore) -> None:
    with pytest.raises(RuntimeError), store.open_writer(KEY) as writer:
        writer.write(os.urandom(MIN_PART_SIZE + 10))
        raise RuntimeError("the client went away")
    assert not store.exists(KEY)
    assert store.list_stale_uploads() == []


def test_a_commit_replaces_the_old_bytes(store: ObjectStore) -> None:
    write(store, KEY, b"first version")
    write(store, KEY, b"second")
    assert read_all(store, KEY) == b"second"
    assert store.head(KEY).size == len(b"second")


@pytest.mark.parametrize(
    ("start", "length", "expected"),
    [
        (0, None, b"0123456789"),
        (3, None, b"3456789"),
        (2, 3, b"234"),
        (9, 5, b"9"),  # clipped at the end
        (10, None, b""),  # past the end: nothing
        (25, 4, b""),
        (4, 0, b""),
    ],
)
def test_ranges(store: ObjectStore, start: int, length: int | None, expected: bytes) -> None:
    write(store, KEY, b"0123456789")
    with store.open_read(KEY, start, length) as stream:
        assert stream.total_size == 10
        assert stream.length == len(expected)
        assert b"".join(stream) == expected


def test_a_negative_range_is_refused(store: ObjectStore) -> None:
    write(store, KEY, b"abc")
    with pytest.raises(ValueError):
        store.open_read(KEY, -1)


def test_missing_objects(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.head(KEY)
    with pytest.raises(ObjectNotFound):
        store.open_read(KEY)
    with pytest.raises(ObjectNotFound):
        store.copy(KEY, KEY + ".copy")
    assert not store.exists(KEY)
    store.delete(KEY)  # deleting nothing is fine


def test_delete(store: ObjectStore) -> None:
    write(store, KEY, b"x")
    store.delete(KEY)
    assert not store.exists(KEY)
    store.delete(KEY)


def test_copy_and_rename(store: ObjectStore) -> None:
    sha256 = write(store, KEY, b"the bytes")
    copied = store.copy(KEY, "users/u1/threads/t1/user-data/outputs/copy.txt")
    assert copied.size == 9
    assert read_all(store, "users/u1/threads/t1/user-data/outputs/copy.txt") == b"the bytes"
    assert read_all(store, KEY) == b"the bytes"
    moved = store.rename(KEY, "users/u1/threads/t1/user-data/uploads/renamed.txt")
    assert moved.size == 9 and not store.exists(KEY)
    assert read_all(store, "users/u1/threads/t1/user-data/uploads/renamed.txt") == b"the bytes"
    if store.name == "s3":  # server-side: the metadata went along
        assert store.head("users/u1/threads/t1/user-data/uploads/renamed.txt").sha256 == sha256


def test_copy_and_rename_replace_the_destination(store: ObjectStore) -> None:
    write(store, KEY, b"new")
    write(store, "a/old.txt", b"old bytes")
    store.rename(KEY, "a/old.txt")
    assert read_all(store, "a/old.txt") == b"new"


def test_listing_a_prefix(store: ObjectStore) -> None:
    keys = [
        "users/u1/threads/t1/user-data/uploads/a.txt",
        "users/u1/threads/t1/user-data/uploads/b.txt",
        "users/u1/threads/t1/user-data/outputs/c.txt",
        "users/u1/threads/t10/user-data/uploads/d.txt",
        "users/u2/threads/t1/user-data/uploads/e.txt",
    ]
    for key in keys:
        write(store, key, key.encode())
    live = store.open_writer("users/u1/threads/t1/user-data/uploads/unfinished.txt")
    live.write(b"half")
    try:
        found = {info.key: info.size for info in store.list_keys("users/u1/threads/t1/")}
        assert found == {key: len(key) for key in keys[:3]}  # not t10, not u2, not unfinished
        assert {i.key for i in store.list_keys("users/u1/threads/t1")} == set(keys[:4])
        assert {i.key for i in store.list_keys()} == set(keys)
        assert list(store.list_keys("users/nobody/")) == []
    finally:
        live.abort()


def test_a_five_mib_plus_object_round_trips_in_parts(store: ObjectStore) -> None:
    body = os.urandom(2 * MIN_PART_SIZE + 12345)  # three parts on S3: 5 MiB, 5 MiB, the rest
    with store.open_writer(KEY) as writer:
        for offset in range(0, len(body), 700_001):  # chunks that straddle the part edges
            writer.write(body[offset : offset + 700_001])
        if isinstance(store, S3ObjectStore):
            assert writer.upload_id is not None  # type: ignore[attr-defined]
        info = writer.commit()
    assert info.sha256 == hashlib.sha256(body).hexdigest()
    assert store.head(KEY).size == len(body)
    assert hashlib.sha256(read_all(store, KEY)).hexdigest() == info.sha256
    assert read_all(store, KEY, MIN_PART_SIZE - 3, 6) == body[MIN_PART_SIZE - 3 : MIN_PART_SIZE + 3]
    if store.name == "s3":
        assert store.head(KEY).sha256 is None  # S3 fixes metadata before the first part


def test_an_object_of_exactly_one_part(store: ObjectStore) -> None:
    body = os.urandom(MIN_PART_SIZE)
    assert write(store, KEY, body) == hashlib.sha256(body).hexdigest()
    assert read_all(store, KEY) == body


@pytest.mark.parametrize(
    "name",
    ["报告 final (1).pdf", "naïve café.txt", "with  two spaces.md", "emoji 📎.png", "%41+&=?#.txt"],
)
def test_unicode_and_spaces_in_keys(store: ObjectStore, name: str) -> None:
    key = area_key("users/u1/threads/t1", Area.UPLOADS, name)
    write(store, key, name.encode())
    assert read_all(store, key) == name.encode()
    assert [info.key for info in store.list_keys("users/u1/")] == [key]
    store.delete(key)
    assert not store.exists(key)


BAD_KEYS = [
    "../escaped.txt",
    "users/u1/../../escaped.txt",
    "users/u1/threads/t1/user-data/uploads/..",
    "/etc/passwd",
    "users//u1/a.txt",
    "users/./u1/a.txt",
    "users/u1/",
    "",
    "a\x00b",
    "x" * 1025,
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_key_leaving_its_prefix_is_refused(store: ObjectStore, key: str, tmp_path: Path) -> None:
    for attempt in (
        lambda: store.open_writer(key),
        lambda: store.open_read(key),
        lambda: store.head(key),
        lambda: store.delete(key),
        lambda: store.copy(KEY, key),
        lambda: store.rename(KEY, key),
        lambda: store.presigned_url(key),
    ):
        with pytest.raises(InvalidObjectKey):
            attempt()
    assert list(store.list_keys()) == []
    assert not (tmp_path / "escaped.txt").exists()


def test_a_listing_prefix_leaving_the_store_is_refused(store: ObjectStore) -> None:
    for prefix in ("../", "users/../../", "/"):
        with pytest.raises(InvalidObjectKey):
            list(store.list_keys(prefix))
        with pytest.raises(InvalidObjectKey):
            store.list_stale_uploads(prefix)


WRITER_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from deerflow_web.storage.objects.disk import DiskObjectStore
    from deerflow_web.storage.objects.s3 import S3ObjectStore
    backend, target, prefix, key, bucket, access, secret = sys.argv[1:8]
    if backend == "local":
        store = DiskObjectStore(target)
    else:
        store = S3ObjectStore(
            bucket, endpoint_url=target, region="us-east-1", prefix=prefix,
            access_key=access, secret_key=secret, part_size=5 * 1024 * 1024, max_attempts=1,
        )
    writer = store.open_writer(key)
    writer.write(os.urandom(6 * 1024 * 1024))  # past one part: S3 holds a part already
    print("writing", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def killed_writer(store: ObjectStore, tmp_path: Path) -> Iterator[None]:
    """A writer in another process, killed with SIGKILL in the middle of its upload."""
    if isinstance(store, DiskObjectStore):
        arguments = ["local", str(store.base_dir), "", KEY]
    else:
        assert isinstance(store, S3ObjectStore)
        endpoint = store.client.meta.endpoint_url
        arguments = ["s3", endpoint, store.prefix, KEY]
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, *arguments, BUCKET, ACCESS_KEY, SECRET_KEY],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"writing\n"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        yield
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_a_killed_writer_leaves_no_object_and_the_sweep_removes_its_upload(
    store: ObjectStore, killed_writer: None
) -> None:
    assert not store.exists(KEY)
    assert list(store.list_keys()) == []
    stale = store.list_stale_uploads()
    assert [upload.key for upload in stale] == (
        [KEY] if store.name == "s3" else [stale[0].key]  # the disk: its staging file
    )
    if store.name == "local":
        assert stale[0].key.startswith("users/u1/threads/t1/user-data/uploads/.upload-")
    assert store.list_stale_uploads(older_than=3600) == []  # it is not an hour old
    live = store.open_writer("users/u1/threads/t1/user-data/uploads/live.txt")
    live.write(os.urandom(MIN_PART_SIZE + 1))  # a live upload, past its first part
    try:
        # On disk the live writer's lock spares it. S3 cannot tell live from dead: with
        # an age of 0 the sweep takes both, so a real sweep passes an age (see there).
        assert sweep_stale_uploads(store, "users/u1/") == (1 if store.name == "local" else 2)
    finally:
        live.abort()
    assert store.list_stale_uploads() == []
    if isinstance(store, DiskObjectStore):
        uploads = store.base_dir / "users/u1/threads/t1/user-data/uploads"
        assert sorted(os.listdir(uploads)) == []


def test_a_link_on_the_way_is_refused_on_disk(tmp_path: Path) -> None:
    store = DiskObjectStore(tmp_path / "data")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"not yours")
    (tmp_path / "data" / "users").mkdir(parents=True)
    (tmp_path / "data" / "users" / "u1").symlink_to(outside)
    for attempt in (
        lambda: store.open_writer("users/u1/a.txt"),
        lambda: store.open_read("users/u1/secret.txt"),
        lambda: store.head("users/u1/secret.txt"),
    ):
        with pytest.raises(UnsafeFolder):
            attempt()
    store.delete("users/u1/secret.txt")
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert list(store.list_keys("users/")) == []


def test_presigned_urls(store: ObjectStore) -> None:
    write(store, KEY, b"shared bytes")
    url = store.presigned_url(
        KEY, expires_seconds=60, filename="报告.txt", content_type="text/plain"
    )
    if store.name == "local":
        assert url is None  # the app serves files on disk itself
        return
    assert url is not None
    with urllib.request.urlopen(url, timeout=10) as response:  # no credentials
        assert response.read() == b"shared bytes"
        assert response.headers["Content-Type"] == "text/plain"
        assert "attachment" in response.headers["Content-Disposition"]
        assert "%E6%8A%A5%E5%91%8A.txt" in response.headers["Content-Disposition"]


def test_a_wrong_secret_is_a_storage_failure_not_an_outage(seaweedfs: SeaweedFS) -> None:
    store = S3ObjectStore(
        BUCKET,
        endpoint_url=seaweedfs.endpoint_url,
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key="wrong",
        max_attempts=1,
    )
    with pytest.raises(StorageFailure):
        store.head(KEY)


def test_s3_down_is_unavailable_and_the_same_store_recovers(seaweedfs: SeaweedFS) -> None:
    store = seaweedfs.store(BUCKET, prefix=f"outage-{uuid.uuid4().hex}", part_size=MIN_PART_SIZE)
    write(store, KEY, b"before the outage")
    seaweedfs.stop()
    try:
        with pytest.raises(ObjectStoreUnavailable) as raised:
            store.head(KEY)
        assert raised.value.retry_after > 0
        with pytest.raises(ObjectStoreUnavailable):
            read_all(store, KEY)
        with pytest.raises(ObjectStoreUnavailable):
            write(store, "users/u1/threads/t1/user-data/uploads/during.txt", b"lost")
        with pytest.raises(ObjectStoreUnavailable), store.open_writer(KEY) as writer:
            writer.write(os.urandom(MIN_PART_SIZE + 1))  # the first part cannot go
        with pytest.raises(ObjectStoreUnavailable):
            store.list_stale_uploads()
    finally:
        seaweedfs.start_again()
    assert read_all(store, KEY) == b"before the outage"  # the same store, reconnected
    assert not store.exists("users/u1/threads/t1/user-data/uploads/during.txt")
    write(store, KEY, b"after")
    assert read_all(store, KEY) == b"after"


def test_a_copy_past_the_single_request_limit_goes_in_parts(
    bucket: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CopyObject stops at 5 GiB; the limits are lowered here so 11 MiB takes that path."""
    from deerflow_web.storage.objects import s3

    monkeypatch.setattr(s3, "MAX_COPY_SIZE", 6 * MiB)
    monkeypatch.setattr(s3, "COPY_PART_SIZE", MIN_PART_SIZE)
    store = bucket.with_prefix(f"copy-{uuid.uuid4().hex}")
    body = os.urandom(2 * MIN_PART_SIZE + 999)
    write(store, KEY, body)
    copied = store.copy(KEY, "a/copy.bin")
    assert copied.size == len(body)
    assert read_all(store, "a/copy.bin") == body
    assert store.list_stale_uploads() == []


GEVENT_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import hashlib, os, sys
    import gevent
    from deerflow_web.concurrency import on_event_loop
    from deerflow_web.storage.objects.disk import DiskObjectStore
    from deerflow_web.storage.objects.s3 import S3ObjectStore
    backend, target, prefix, key, bucket, access, secret = sys.argv[1:8]
    if backend == "local":
        store = DiskObjectStore(target)
    else:
        store = S3ObjectStore(
            bucket, endpoint_url=target, region="us-east-1", prefix=prefix,
            access_key=access, secret_key=secret, part_size=5 * 1024 * 1024, max_attempts=1,
        )
    assert on_event_loop()

    def round_trip(number):
        body = os.urandom(6 * 1024 * 1024 + number)
        with store.open_writer(f"{key}.{number}") as writer:
            for offset in range(0, len(body), 1024 * 1024):
                writer.write(body[offset : offset + 1024 * 1024], hash_beside=True)
            info = writer.commit()
        with store.open_read(f"{key}.{number}") as stream:
            back = hashlib.sha256(b"".join(stream)).hexdigest()
        return info.sha256 == hashlib.sha256(body).hexdigest() == back

    jobs = [gevent.spawn(round_trip, number) for number in range(4)]
    gevent.joinall(jobs, raise_error=True)
    print("ok" if all(job.value for job in jobs) else "mismatch", flush=True)
    """
)


def test_writers_side_by_side_on_gevents_loop(store: ObjectStore) -> None:
    """As `make run` serves: greenlets writing multipart objects at once, parts hashed on
    gevent's native threads, each sha256 that of the bytes stored."""
    if isinstance(store, DiskObjectStore):
        arguments = ["local", str(store.base_dir), "", KEY]
    else:
        assert isinstance(store, S3ObjectStore)
        arguments = ["s3", store.client.meta.endpoint_url, store.prefix, KEY]
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_SCRIPT, *arguments, BUCKET, ACCESS_KEY, SECRET_KEY],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
    assert len(list(store.list_keys())) == 4
    assert store.list_stale_uploads() == []


# -- an upload streamed before its SHA-256 was known becomes the thread's blob ---------

SCOPE = "users/u1/threads/t1"


def test_adopted_bytes_become_the_blob_and_the_incoming_key_goes(store: ObjectStore) -> None:
    body = os.urandom(3 * MiB)
    incoming = incoming_key(SCOPE, uuid.uuid4().hex)
    sha256 = write(store, incoming, body)
    copies = WorkingCopies(store, "unused")

    copies.adopt(SCOPE, incoming, sha256)

    assert read_all(store, blob_key(SCOPE, sha256)) == body
    assert not store.exists(incoming)
    assert [info.key for info in store.list_keys(SCOPE + "/")] == [blob_key(SCOPE, sha256)]


def test_adopting_bytes_the_thread_holds_drops_the_incoming_copy(store: ObjectStore) -> None:
    body = b"the same report twice\n" * 100
    first = write(store, blob_key(SCOPE, hashlib.sha256(body).hexdigest()), body)
    incoming = incoming_key(SCOPE, "second")
    write(store, incoming, body)

    WorkingCopies(store, "unused").adopt(SCOPE, incoming, first)

    assert [info.key for info in store.list_keys(SCOPE + "/")] == [blob_key(SCOPE, first)]
    assert read_all(store, blob_key(SCOPE, first)) == body


def test_adopting_a_vanished_upload_is_a_storage_failure(store: ObjectStore) -> None:
    with pytest.raises(StorageFailure, match="gone"):
        WorkingCopies(store, "unused").adopt(SCOPE, incoming_key(SCOPE, "never"), "a" * 64)
    assert list(store.list_keys()) == []


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_an_incoming_name_is_one_plain_segment(name: str) -> None:
    with pytest.raises(InvalidObjectKey):
        incoming_key(SCOPE, name)


# -- an object as a file ----------------------------------------------------------------


def test_an_object_as_a_file_reads_seeks_and_opens_nothing_before_the_first_read(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = os.urandom(3 * 1024 * 1024 + 17)  # more than one of the store's chunks
    write(store, "t/blob", body)
    opened: list[int] = []
    open_read = store.open_read

    def recording(key: str, start: int = 0, length: int | None = None):  # noqa: ANN202
        opened.append(start)
        return open_read(key, start, length)

    monkeypatch.setattr(store, "open_read", recording)
    with ObjectFile(store, "t/blob", len(body)) as file:
        assert (file.readable(), file.seekable(), file.tell()) == (True, True, 0)
        with pytest.raises(io.UnsupportedOperation):
            file.fileno()  # no kernel sendfile is tried on it
        assert opened == []
        assert file.read(10) == body[:10]
        assert file.read(5) == body[10:15]  # from the chunk on hand
        assert opened == [0]
        assert file.seek(2 * 1024 * 1024 + 3) == 2 * 1024 * 1024 + 3
        assert file.read(100) == body[2 * 1024 * 1024 + 3 : 2 * 1024 * 1024 + 103]
        assert opened == [0, 2 * 1024 * 1024 + 3]  # a seek elsewhere is a ranged read
        file.seek(-7, io.SEEK_END)
        buffer = bytearray(32)
        assert file.readinto(buffer) == 7
        assert bytes(buffer[:7]) == body[-7:]
        assert file.read(10) == b""  # the end
        file.seek(0)
        assert file.read() == body
        with pytest.raises(ValueError, match="negative"):
            file.seek(-1)
    assert file.closed


def test_an_object_file_of_a_missing_key_fails_at_the_first_read(store: ObjectStore) -> None:
    file = ObjectFile(store, "t/never-written", 10)
    with pytest.raises(ObjectNotFound):
        file.read(1)
    file.close()
