"""Two instances on the S3 backend: one database and one bucket (a real SeaweedFS) shared,
each with a data dir of its own, empty at first. What one instance stores, the other lists,
serves and converts; nothing either serves comes from anywhere but the records and the
bucket."""

from __future__ import annotations

import hashlib
import secrets
import zipfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any
from typing import NamedTuple

import pytest
from flask import Flask
from werkzeug.datastructures import FileStorage
from werkzeug.datastructures import Headers
from werkzeug.datastructures import MultiDict
from werkzeug.test import encode_multipart

from deerflow_web.storage.objects.base import sweep_stale_uploads
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.storage.objects.working_copy import WorkingCopies
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import thread_dir
from tests.helpers import uploads_dir
from tests.support.clamd import EICAR
from tests.support.clamd import Clamd
from tests.support.s3_deployment import s3_environment
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.same_in_both_modes

BUCKET = "deerflow-instances"


@pytest.fixture
def s3_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SeaweedFS]:
    """The session's SeaweedFS; a server of the test's own for a test marked
    `own_s3_server`, which stops it (the session's must never go down under others)."""
    if request.node.get_closest_marker("own_s3_server") is None:
        yield request.getfixturevalue("seaweedfs")
        return
    server = SeaweedFS.start(tmp_path / "seaweedfs")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def bucket(s3_server: SeaweedFS) -> S3ObjectStore:
    """This test's own prefix of the shared bucket, as the instances see it."""
    return s3_server.store(BUCKET, prefix=f"t-{secrets.token_hex(6)}")


@pytest.fixture
def on_s3(
    monkeypatch: pytest.MonkeyPatch, s3_server: SeaweedFS, bucket: S3ObjectStore, database_url: str
) -> None:
    """Every app made from here on keeps its files in `bucket`, its records in one database."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    for name, value in s3_environment(s3_server.endpoint_url, BUCKET, bucket.prefix).items():
        monkeypatch.setenv(name, value)


class Instance:
    def __init__(self, app: Flask, base_dir: Path) -> None:
        self.app = app
        self.base_dir = base_dir
        self.client = app.test_client()
        self.uploads = UploadActions(self.client)

    def download(self, thread_id: str, name: str) -> Any:
        response = self.client.get(
            f"/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}"
        )
        response.get_data()
        response.close()
        return response

    def rename(self, thread_id: str, name: str, new_name: str) -> Any:
        return self.client.post(
            f"/api/threads/{thread_id}/uploads/{name}/rename", json={"new_name": new_name}
        )

    def local(self, thread_id: str, name: str) -> Path:
        return uploads_dir(self.base_dir, thread_id) / name


@pytest.fixture
def instances(on_s3: None, make_app: Any, tmp_path: Path) -> Iterator[tuple[Instance, Instance]]:
    made = []
    for name in ("a", "b"):
        base_dir = tmp_path / name
        base_dir.mkdir()
        made.append(Instance(make_app(BASE_DIR=str(base_dir)), base_dir))
    yield made[0], made[1]


def scope_of(thread_id: str) -> str:
    base = Path("/x")
    return thread_dir(base, thread_id).relative_to(base).as_posix()


def test_what_one_instance_stores_the_other_lists_and_serves(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, b = instances
    body = secrets.token_bytes(300_000)
    assert a.uploads.upload("t1", (body, "report.bin")).status_code == 200
    assert not thread_dir(b.base_dir, "t1").exists()  # B has nothing of its own
    assert b.uploads.names("t1") == ["report.bin"]  # listed from the records alone
    assert not b.local("t1", "report.bin").exists()  # a listing fetches nothing
    served = b.download("t1", "report.bin")
    assert served.status_code == 200
    assert served.data == body
    assert b.local("t1", "report.bin").read_bytes() == body  # streamed, then kept as B's copy
    assert b.client.get("/threads/t1/files/uploads/report.bin").status_code == 200
    sha256 = hashlib.sha256(body).hexdigest()
    assert bucket.head(blob_key(scope_of("t1"), sha256)).size == len(body)


def test_a_replace_a_rename_and_a_delete_reach_the_other_instance(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    assert a.uploads.upload("t1", (b"first", "notes.txt")).status_code == 200
    assert b.download("t1", "notes.txt").data == b"first"
    assert a.uploads.upload("t1", (b"second, longer", "notes.txt")).status_code == 200
    assert b.download("t1", "notes.txt").data == b"second, longer"
    renamed = a.client.post(
        "/api/threads/t1/uploads/notes.txt/rename", json={"new_name": "kept.txt"}
    )
    assert renamed.status_code == 200, renamed.get_json()
    assert b.download("t1", "kept.txt").data == b"second, longer"
    assert b.download("t1", "notes.txt").status_code == 404
    assert not b.local("t1", "notes.txt").exists()  # the old name left B's copy too
    assert a.client.delete("/api/threads/t1/uploads/kept.txt").status_code == 200
    assert b.download("t1", "kept.txt").status_code == 404
    assert b.uploads.names("t1") == []
    assert not b.local("t1", "kept.txt").exists()


def test_b_stores_what_a_then_serves(instances: tuple[Instance, Instance]) -> None:
    a, b = instances
    assert b.uploads.upload("t2", (b"from b", "b.txt")).status_code == 200
    assert a.uploads.upload("t2", (b"from a", "a.txt")).status_code == 200
    assert a.download("t2", "b.txt").data == b"from b"
    assert b.download("t2", "a.txt").data == b"from a"
    assert sorted(a.uploads.names("t2")) == sorted(b.uploads.names("t2")) == ["a.txt", "b.txt"]


def test_the_services_use_the_bucket(instances: tuple[Instance, Instance]) -> None:
    a, _ = instances
    services = a.app.extensions[EXTENSION_KEY]
    assert services.uploads.paths.copies is not None
    assert services.uploads.paths.copies.store.name == "s3"


def test_a_version_kept_on_one_instance_is_served_and_restored_on_the_other(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    assert a.uploads.upload("t3", (b"version one", "plan.txt")).status_code == 200
    assert a.uploads.upload("t3", (b"version two!", "plan.txt")).status_code == 200
    listed = b.client.get("/api/threads/t3/uploads/plan.txt/versions")
    assert listed.status_code == 200
    (version,) = listed.get_json()["versions"]
    old = b.client.get(f"/api/threads/t3/uploads/plan.txt/versions/{version['version_id']}")
    assert old.status_code == 200
    assert old.get_data() == b"version one"
    old.close()
    restored = b.client.post(
        f"/api/threads/t3/uploads/plan.txt/versions/{version['version_id']}/restore"
    )
    assert restored.status_code == 200, restored.get_json()
    assert a.download("t3", "plan.txt").data == b"version one"
    assert b.download("t3", "plan.txt").data == b"version one"


def test_a_file_trashed_on_one_instance_is_restored_on_the_other(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    assert a.uploads.upload("t4", (b"keep me", "draft.txt")).status_code == 200
    assert a.client.delete("/api/threads/t4/uploads/draft.txt").status_code == 200
    listed = b.client.get("/api/threads/t4/trash")
    assert listed.status_code == 200, listed.get_json()
    (entry,) = listed.get_json()["files"]
    restored = b.client.post(f"/api/threads/t4/trash/{entry['trash_id']}/restore")
    assert restored.status_code == 200, restored.get_json()
    assert b.download("t4", "draft.txt").data == b"keep me"
    assert a.download("t4", "draft.txt").data == b"keep me"
    assert a.client.get("/api/threads/t4/trash").get_json()["files"] == []


def test_deleting_a_thread_takes_its_bytes_out_of_the_bucket(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, b = instances
    assert a.uploads.upload("t5", (b"one", "1.txt"), (b"two", "2.txt")).status_code == 200
    assert b.download("t5", "1.txt").data == b"one"  # B holds a copy too
    prefix = f"{scope_of('t5')}/"
    assert len(list(bucket.list_keys(prefix))) == 2
    assert b.client.delete("/api/threads/t5").status_code == 200
    assert list(bucket.list_keys(prefix)) == []
    # Gone for both: neither A's folder nor B's copy keeps the thread alive.
    assert a.client.get("/api/threads/t5").status_code == 404
    assert b.client.get("/api/threads/t5").status_code == 404
    assert a.download("t5", "1.txt").status_code == 404


@pytest.mark.own_s3_server
def test_an_upload_while_the_bucket_is_down_changes_nothing_and_says_when_to_retry(
    instances: tuple[Instance, Instance], s3_server: SeaweedFS
) -> None:
    a, b = instances
    assert a.uploads.upload("t6", (b"before", "kept.txt")).status_code == 200
    s3_server.stop()
    try:
        refused = a.uploads.upload("t6", (b"during", "new.txt"), (b"x", "kept.txt"))
        assert refused.status_code == 503
        assert refused.headers["Retry-After"].isdigit()
        assert "try again" in refused.get_json()["detail"]
        assert a.uploads.names("t6") == ["kept.txt"]  # nothing of the request was kept
        assert a.download("t6", "kept.txt").data == b"before"  # A's copy is current
        fetch = b.download("t6", "kept.txt")  # B has to fetch it, and cannot
        assert fetch.status_code == 503
        assert not b.local("t6", "kept.txt").exists()
    finally:
        s3_server.start_again()
    assert b.download("t6", "kept.txt").data == b"before"
    assert a.uploads.upload("t6", (b"after", "new.txt")).status_code == 200
    assert b.download("t6", "new.txt").data == b"after"


def blobs(bucket: S3ObjectStore, thread_id: str) -> set[str]:
    return {info.key.rsplit("/", 1)[-1] for info in bucket.list_keys(f"{scope_of(thread_id)}/")}


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def test_bytes_leave_the_bucket_once_nothing_names_them(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, b = instances
    first, second = b"first bytes", b"second bytes"
    assert a.uploads.upload("t7", (first, "a.txt"), (first, "same.txt")).status_code == 200
    assert blobs(bucket, "t7") == {sha(first)}  # one blob for both names
    assert a.uploads.upload("t7", (second, "a.txt")).status_code == 200
    assert blobs(bucket, "t7") == {sha(first), sha(second)}  # same.txt and a's version
    trashed = a.client.delete("/api/threads/t7/uploads/same.txt")
    assert trashed.status_code == 200
    assert blobs(bucket, "t7") == {sha(first), sha(second)}  # the trash and the version
    assert b.client.delete("/api/threads/t7/trash").status_code == 200
    assert blobs(bucket, "t7") == {sha(first), sha(second)}  # a.txt's version still
    gone = b.client.delete("/api/threads/t7/uploads/a.txt", query_string={"permanent": "true"})
    assert gone.status_code == 200
    assert blobs(bucket, "t7") == set()  # the file, its version: nothing names them


def test_presigned_downloads_send_the_client_to_the_bucket_after_the_same_checks(
    instances: tuple[Instance, Instance],
    monkeypatch: pytest.MonkeyPatch,
    make_app: Any,
    tmp_path: Path,
) -> None:
    import urllib.request

    a, _ = instances
    body = secrets.token_bytes(70_000)
    assert a.uploads.upload("t8", (body, "Q3 report.pdf")).status_code == 200
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_PRESIGNED_DOWNLOADS", "true")
    base_dir = tmp_path / "c"
    base_dir.mkdir()
    c = Instance(make_app(BASE_DIR=str(base_dir)), base_dir)
    path = "/api/threads/t8/artifacts/mnt/user-data/uploads/Q3%20report.pdf"
    sent = c.client.get(path, query_string={"download": "true"})
    assert sent.status_code == 302
    with urllib.request.urlopen(sent.headers["Location"], timeout=30) as bucket_answer:
        assert bucket_answer.read() == body
        disposition = bucket_answer.headers["Content-Disposition"]
        assert disposition.startswith("attachment") and "Q3%20report.pdf" in disposition
        (listed,) = a.uploads.list("t8")["files"]
        assert bucket_answer.headers["Content-Type"] == listed["content_type"]
    assert not c.local("t8", "Q3 report.pdf").exists()  # nothing fetched here for it
    inline = c.client.get(path)  # shown inline: served by the app, as ever
    assert inline.status_code == 200
    assert inline.get_data() == body
    inline.close()
    missing = c.client.get(path.replace("Q3", "Q4"), query_string={"download": "true"})
    assert missing.status_code == 404


def test_an_instance_without_one_key_for_all_says_so(
    on_s3: None, make_app: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SECRET_KEY", raising=False)
    make_app()
    assert "no SECRET_KEY or server.secret_key is set" in caplog.text
    caplog.clear()
    monkeypatch.setenv("SECRET_KEY", "one key for every instance")
    make_app()
    assert "SECRET_KEY" not in caplog.text


def test_a_sandbox_gets_the_thread_under_real_paths_and_how_fresh_they_are(
    instances: tuple[Instance, Instance], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import time

    from deerflow_web.agent.runtime import resolve_thread_paths
    from deerflow_web.agent.sandbox import materialise
    from deerflow_web.models import ThreadRef

    a, _ = instances
    assert a.uploads.upload("t9", (b"col1,col2\n1,2\n", "data.csv")).status_code == 200
    sandbox_home = tmp_path / "sandbox"  # a third machine: the agent's, empty
    monkeypatch.setenv("DEER_FLOW_HOME", str(sandbox_home))
    ref = ThreadRef("t9", USER_ID) if USER_ID else ThreadRef.single_user("t9")
    paths = resolve_thread_paths()  # the agent side's, from the settings as the app's
    assert paths.copies is not None
    before = time.time()
    try:
        folder = materialise(ref, paths)
        assert a.uploads.upload("t9", (b"more", "notes.txt")).status_code == 200
        again = materialise(ref, paths)
    finally:
        assert paths.copies.records is not None
        paths.copies.records.engine.dispose()
    assert not folder.live and folder.as_of >= before and folder.uploads == 1
    assert (folder.path / "uploads" / "data.csv").read_bytes() == b"col1,col2\n1,2\n"
    assert folder.path.is_relative_to(sandbox_home.resolve())
    assert again.uploads == 2 and again.as_of >= folder.as_of
    assert (again.path / "uploads" / "notes.txt").read_bytes() == b"more"


# -- uploads stream into the bucket while their body arrives -----------------------------

MiB = 1024 * 1024
LARGE = 20 * MiB  # parts of 8 MiB: two sent while the body streams, the rest at its end


def upload(instance: Instance, thread_id: str, *files: tuple[bytes, str], **form: str) -> Any:
    """`UploadActions.upload` with the body encoded here, in memory: the test client spools
    a body past 500 KiB to a temporary file it never closes."""
    fields = MultiDict(
        [*form.items(), *((("files", FileStorage(BytesIO(b), n)) for b, n in files))]
    )
    boundary, encoded = encode_multipart(fields)
    return instance.client.post(
        f"/api/threads/{thread_id}/uploads",
        data=encoded,
        content_type=f"multipart/form-data; boundary={boundary}",
    )


def bucket_keys(bucket: S3ObjectStore, thread_id: str) -> list[str]:
    return sorted(info.key for info in bucket.list_keys(f"{scope_of(thread_id)}/"))


def assert_nothing_in_flight(bucket: S3ObjectStore) -> None:
    """No multipart upload left unfinished and no incoming object, anywhere in the test's
    prefix."""
    assert bucket.list_stale_uploads() == []
    assert [info.key for info in bucket.list_keys() if "/incoming/" in info.key] == []


@pytest.fixture
def adopted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The incoming keys `WorkingCopies.adopt` made blobs of, in order."""
    seen: list[str] = []
    adopt = WorkingCopies.adopt

    def recording(self: WorkingCopies, scope: str, incoming: str, sha256: str) -> None:
        seen.append(incoming)
        adopt(self, scope, incoming, sha256)

    monkeypatch.setattr(WorkingCopies, "adopt", recording)
    return seen


def test_a_large_upload_streams_into_the_bucket_and_the_other_instance_serves_it(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore, adopted: list[str]
) -> None:
    a, b = instances
    body = secrets.token_bytes(LARGE)
    answer = upload(a, "s1", (body, "big.bin"))
    assert answer.status_code == 200, answer.get_json()
    assert [key.rsplit("/", 2)[-2] for key in adopted] == ["incoming"]  # streamed, not pushed
    assert bucket_keys(bucket, "s1") == [blob_key(scope_of("s1"), sha(body))]  # one blob
    assert_nothing_in_flight(bucket)
    served = b.download("s1", "big.bin")
    assert served.status_code == 200
    assert hashlib.sha256(served.data).hexdigest() == sha(body)
    assert a.local("s1", "big.bin").read_bytes() == body  # A's staging file, now its copy


def test_a_small_upload_is_one_put_with_nothing_on_its_way(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore, adopted: list[str]
) -> None:
    a, b = instances
    body = secrets.token_bytes(MiB)
    assert upload(a, "s2", (body, "small.bin")).status_code == 200
    assert adopted == []
    assert bucket_keys(bucket, "s2") == [blob_key(scope_of("s2"), sha(body))]
    assert b.download("s2", "small.bin").data == body


def test_the_same_bytes_uploaded_twice_leave_one_blob(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore, adopted: list[str]
) -> None:
    a, b = instances
    body = secrets.token_bytes(LARGE)
    assert upload(a, "s3", (body, "one.bin"), (body, "two.bin")).status_code == 200
    assert upload(b, "s3", (body, "three.bin")).status_code == 200
    assert len(adopted) == 3
    assert bucket_keys(bucket, "s3") == [blob_key(scope_of("s3"), sha(body))]
    assert_nothing_in_flight(bucket)
    assert sorted(a.uploads.names("s3")) == ["one.bin", "three.bin", "two.bin"]
    assert hashlib.sha256(a.download("s3", "three.bin").data).hexdigest() == sha(body)


def test_a_file_over_the_size_limit_mid_stream_leaves_nothing_in_the_bucket(
    on_s3: None, make_app: Any, tmp_path: Path, bucket: S3ObjectStore
) -> None:
    a = Instance(make_app(BASE_DIR=str(tmp_path), uploads={"max_file_size": 18 * MiB}), tmp_path)
    refused = upload(a, "s4", (secrets.token_bytes(LARGE), "too-big.bin"))
    assert refused.status_code == 413, refused.get_json()
    assert refused.get_json()["detail"]
    assert bucket_keys(bucket, "s4") == []  # two parts were sent before the limit hit
    assert_nothing_in_flight(bucket)
    assert a.uploads.names("s4") == []
    assert not a.local("s4", "too-big.bin").exists()


def test_a_name_conflict_after_a_large_part_leaves_nothing_in_the_bucket(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, _ = instances
    assert upload(a, "s5", (b"first", "taken.txt")).status_code == 200
    refused = upload(
        a,
        "s5",
        (secrets.token_bytes(LARGE), "fresh.bin"),
        (b"second", "taken.txt"),
        on_conflict="reject",
    )
    assert refused.status_code == 409, refused.get_json()
    assert bucket_keys(bucket, "s5") == [blob_key(scope_of("s5"), sha(b"first"))]
    assert_nothing_in_flight(bucket)
    assert a.uploads.names("s5") == ["taken.txt"]
    assert not a.local("s5", "fresh.bin").exists()


@pytest.mark.own_s3_server
def test_the_bucket_stopping_mid_upload_answers_503_and_keeps_nothing(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore, s3_server: SeaweedFS
) -> None:
    a, b = instances
    store = a.app.extensions[EXTENSION_KEY].uploads.paths.copies.store
    send = store.client.upload_part

    def first_part_then_the_bucket_stops(**arguments: Any) -> Any:
        sent = send(**arguments)
        if arguments["PartNumber"] == 1:
            s3_server.stop()
        return sent

    store.client.upload_part = first_part_then_the_bucket_stops
    try:
        refused = upload(a, "s6", (secrets.token_bytes(LARGE), "cut.bin"))
        assert refused.status_code == 503, refused.get_json()
        assert refused.headers["Retry-After"].isdigit()
        assert "try again" in refused.get_json()["detail"]
        assert not a.local("s6", "cut.bin").exists()
        assert not uploads_dir(a.base_dir, "s6").exists()  # no staging file, no folder
    finally:
        store.client.upload_part = send
        if s3_server.process is None or s3_server.process.poll() is not None:
            s3_server.start_again()
    assert a.uploads.names("s6") == []
    assert b.uploads.names("s6") == []
    assert bucket_keys(bucket, "s6") == []  # nothing was ever completed
    # The abort could not reach the stopped bucket: the upload is the sweep's, as after a
    # crash, and nothing else is left.
    sweep_stale_uploads(bucket)
    assert_nothing_in_flight(bucket)
    assert upload(a, "s6", (secrets.token_bytes(LARGE), "after.bin")).status_code == 200


def test_an_infected_upload_streamed_into_the_bucket_is_taken_back_out(
    on_s3: None, make_app: Any, tmp_path: Path, bucket: S3ObjectStore, clamd: Clamd
) -> None:
    app = make_app(BASE_DIR=str(tmp_path), scanning={"clamd": clamd.address, "timeout_seconds": 10})
    a = Instance(app, tmp_path)
    archive = BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as bundle:
        bundle.writestr("padding.bin", secrets.token_bytes(LARGE))  # parts sent as it streams
        bundle.writestr("eicar.com", EICAR)
    clean = secrets.token_bytes(LARGE)
    answer = upload(a, "s7", (archive.getvalue(), "bundle.zip"), (clean, "clean.bin"))
    assert answer.status_code == 200, answer.get_json()
    assert [f["filename"] for f in answer.get_json()["rejected_files"]] == ["bundle.zip"]
    assert a.uploads.names("s7") == ["clean.bin"]
    assert bucket_keys(bucket, "s7") == [blob_key(scope_of("s7"), sha(clean))]
    assert_nothing_in_flight(bucket)


def test_a_download_streams_from_the_bucket_and_keeps_only_what_it_sent_whole(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, b = instances
    bodies = {name: secrets.token_bytes(100_000) for name in ("a.bin", "b.bin", "c.bin")}
    assert (
        a.uploads.upload("t9", *[(body, name) for name, body in bodies.items()]).status_code == 200
    )

    ranged = b.client.get(
        "/api/threads/t9/artifacts/mnt/user-data/uploads/c.bin", headers={"Range": "bytes=10-19"}
    )
    assert ranged.status_code == 206
    assert ranged.headers["Content-Range"] == "bytes 10-19/100000"
    assert ranged.get_data() == bodies["c.bin"][10:20]
    ranged.close()
    assert b.client.head("/api/threads/t9/artifacts/mnt/user-data/uploads/c.bin").status_code == 200
    assert not uploads_dir(b.base_dir, "t9").exists()  # nothing was fetched to serve them
    # A whole download is B's copy once sent, with its record's mtime: the next one is
    # sent from B's disk, even with the bytes gone from the bucket behind the app's back.
    assert b.download("t9", "b.bin").data == bodies["b.bin"]
    assert sorted(p.name for p in uploads_dir(b.base_dir, "t9").iterdir()) == ["b.bin"]
    assert b.local("t9", "b.bin").stat().st_mtime_ns == a.local("t9", "b.bin").stat().st_mtime_ns
    bucket.delete(blob_key(scope_of("t9"), sha(bodies["b.bin"])))
    assert b.download("t9", "b.bin").data == bodies["b.bin"]
    # Replaced on A: B serves the new bytes (and keeps them); deleted on A: B answers 404.
    assert a.uploads.upload("t9", (b"second version", "b.bin")).status_code == 200
    assert b.download("t9", "b.bin").data == b"second version"
    assert b.local("t9", "b.bin").read_bytes() == b"second version"
    assert a.client.delete("/api/threads/t9/uploads/c.bin").status_code == 200
    assert b.download("t9", "c.bin").status_code == 404
    # A preview reads the file here: it is fetched for it.
    assert b.client.get("/threads/t9/files/uploads/a.bin").status_code == 200
    assert b.local("t9", "a.bin").read_bytes() == bodies["a.bin"]
    assert b.client.get("/threads/t9/files/uploads/c.bin").status_code == 404
    assert not b.local("t9", "c.bin").exists()
    # A zip of the thread fetches the members it lacks, each checked against its record.
    assert b.uploads.names("t9") == ["a.bin", "b.bin"]
    zipped = b.client.get("/threads/t9/zip")
    assert zipped.status_code == 200
    with zipfile.ZipFile(BytesIO(zipped.get_data())) as archive:
        assert archive.read("a.bin") == bodies["a.bin"]
        assert archive.read("b.bin") == b"second version"


class Fetched(NamedTuple):
    status_code: int
    headers: Headers
    data: bytes


def fetch(client: Any, url: str, *, method: str = "GET", headers: Any = None) -> Fetched:
    """What was sent, as sent, the file it was sent from closed."""
    response = client.open(url, method=method, headers=headers)
    fetched = Fetched(response.status_code, response.headers.copy(), response.get_data())
    response.close()
    return fetched


SENT_HEADERS = (
    "Content-Type",
    "Content-Length",
    "Content-Disposition",
    "Content-Security-Policy",
    "ETag",
    "Last-Modified",
    "Accept-Ranges",
)


SENT_AS = {
    "notes.txt": b"plain text\n",
    "script.py": b"print('hello')\n",  # code: sent as text/plain
    "page.html": b"<script>alert(1)</script>",  # markup: an attachment
    "unknown.zzz": b"text under a name no table knows\n",  # sniffed: text
    "blob.zzz": b"\x00\x01binary" * 100,  # sniffed: binary, a download
    "picture.png": b"\x89PNG\r\n\x1a\n" + bytes(range(64)),
}


def test_an_upload_streamed_from_the_bucket_is_sent_as_the_copy_here_would_be(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    assert (
        a.uploads.upload("t10", *[(body, name) for name, body in SENT_AS.items()]).status_code
        == 200
    )
    for name, body in SENT_AS.items():
        url = f"/api/threads/t10/artifacts/mnt/user-data/uploads/{name}"
        for query in ("", "?download=true"):
            here = fetch(a.client, url + query)  # A holds the file: served from its copy
            there = fetch(b.client, url + query)  # B does not: streamed from the bucket
            assert (here.status_code, there.status_code) == (200, 200), name
            assert there.data == here.data == body
            for header in SENT_HEADERS:
                assert there.headers.get(header) == here.headers.get(header), (name, header)
            assert b.local("t10", name).read_bytes() == body  # kept by that download
            b.local("t10", name).unlink()  # let go, as eviction would: the next one streams


def test_conditional_and_ranged_requests_on_an_upload_in_the_bucket(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    body = secrets.token_bytes(3 * MiB)  # several of the bucket's chunks
    assert upload(a, "t11", (body, "data.bin")).status_code == 200
    url = "/api/threads/t11/artifacts/mnt/user-data/uploads/data.bin"
    etag = f'"{sha(body)}"'
    assert fetch(b.client, url, method="HEAD").headers["ETag"] == etag
    unchanged = fetch(b.client, url, headers={"If-None-Match": etag})
    assert (unchanged.status_code, unchanged.data) == (304, b"")
    start = 2 * MiB + 5
    tail = fetch(b.client, url, headers={"Range": f"bytes={start}-"})
    assert tail.status_code == 206
    assert tail.headers["Content-Range"] == f"bytes {start}-{len(body) - 1}/{len(body)}"
    assert tail.data == body[start:]
    last = fetch(b.client, url, headers={"Range": "bytes=-5"})
    assert (last.status_code, last.data) == (206, body[-5:])
    head = fetch(b.client, url, headers={"Range": "bytes=0-9"})
    assert (head.status_code, head.data) == (206, body[:10])
    past_the_end = fetch(b.client, url, headers={"Range": f"bytes={len(body)}-"})
    assert past_the_end.status_code == 416
    assert fetch(b.client, url, method="HEAD").headers["Content-Length"] == str(len(body))
    assert files_here(b, "t11") == []  # no range is kept, not even the first
    changed = fetch(b.client, url, headers={"Range": "bytes=0-9", "If-Range": '"other"'})
    assert (changed.status_code, changed.data) == (200, body)  # whole: not the bytes asked of
    assert b.local("t11", "data.bin").read_bytes() == body  # and so kept


def files_here(instance: Instance, thread_id: str) -> list[str]:
    """Every name in the instance's uploads folder of the thread, staging files included."""
    folder = uploads_dir(instance.base_dir, thread_id)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def stream(instance: Instance, thread_id: str, name: str) -> Any:
    """A download on its way: its body is read as the test iterates it."""
    url = f"/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}"
    response = instance.client.get(url, buffered=False)
    assert response.status_code == 200
    return response


def test_a_download_cut_short_or_outrun_by_a_replace_keeps_nothing(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    body = secrets.token_bytes(3 * MiB)  # several of the bucket's chunks
    assert upload(a, "t15", (body, "data.bin")).status_code == 200
    cut = stream(b, "t15", "data.bin")
    assert next(iter(cut.response))  # the first chunk, then the client goes
    cut.close()
    assert files_here(b, "t15") == []  # no copy, no staging file

    outrun = stream(b, "t15", "data.bin")
    chunks = iter(outrun.response)
    first = next(chunks)
    assert upload(a, "t15", (b"replaced meanwhile", "data.bin")).status_code == 200
    assert first + b"".join(chunks) == body  # the download ends with the bytes it began
    outrun.close()
    assert files_here(b, "t15") == []  # not the record's bytes now
    assert b.download("t15", "data.bin").data == b"replaced meanwhile"


def test_bytes_in_the_bucket_unlike_their_record_are_never_kept(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, b = instances
    assert a.uploads.upload("t16", (b"the recorded bytes", "notes.txt")).status_code == 200
    key = blob_key(scope_of("t16"), sha(b"the recorded bytes"))
    with bucket.open_writer(key) as writer:  # behind the app's back, the same size
        writer.write(b"some other bytes!!")
        writer.commit()
    b.download("t16", "notes.txt")
    assert files_here(b, "t16") == []


def test_a_download_that_cannot_be_kept_is_still_sent_whole(
    instances: tuple[Instance, Instance], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = instances
    body = secrets.token_bytes(2 * MiB)
    assert upload(a, "t17", (body, "data.bin")).status_code == 200
    nowhere = tmp_path / "no such folder" / "staging"  # as a full or read-only disk fails
    monkeypatch.setattr("deerflow_web.storage.local.staging_path", lambda folder: nowhere)
    assert b.download("t17", "data.bin").data == body
    assert not b.local("t17", "data.bin").exists()


def test_a_copy_older_than_its_record_is_not_served(instances: tuple[Instance, Instance]) -> None:
    a, b = instances
    assert a.uploads.upload("t12", (b"first bytes", "notes.txt")).status_code == 200
    assert b.client.get("/threads/t12/files/uploads/notes.txt").status_code == 200  # B's copy
    assert b.local("t12", "notes.txt").read_bytes() == b"first bytes"
    assert a.uploads.upload("t12", (b"the second bytes", "notes.txt")).status_code == 200
    assert b.download("t12", "notes.txt").data == b"the second bytes"  # from the bucket


def test_an_upload_on_an_instance_lacking_the_thread_fetches_only_what_it_replaces(
    instances: tuple[Instance, Instance],
) -> None:
    a, b = instances
    first = {name: secrets.token_bytes(50_000) for name in ("a.bin", "b.bin", "gone.bin")}
    assert a.uploads.upload("t13", *[(body, n) for n, body in first.items()]).status_code == 200
    assert b.client.get("/threads/t13/zip?filenames=gone.bin").status_code == 200  # B's copy
    assert sorted(p.name for p in uploads_dir(b.base_dir, "t13").iterdir()) == ["gone.bin"]
    assert a.client.delete("/api/threads/t13/uploads/gone.bin?permanent=true").status_code == 200

    assert b.uploads.upload("t13", (b"new", "c.bin")).status_code == 200
    assert sorted(p.name for p in uploads_dir(b.base_dir, "t13").iterdir()) == [
        "c.bin",
        "gone.bin",  # B's copy of a file deleted since: nothing this upload touched
    ]
    # The conflict rule sees the records, not B's copy.
    taken = b.uploads.upload("t13", (b"x", "a.bin"), on_conflict="reject")
    assert taken.status_code == 409, taken.get_json()
    numbered = b.uploads.upload("t13", (b"y", "b.bin"), on_conflict="rename")
    assert numbered.get_json()["files"][0]["filename"] == "b_1.bin"
    free_again = b.uploads.upload("t13", (b"back", "gone.bin"), on_conflict="reject")
    assert free_again.status_code == 200, free_again.get_json()
    # A replace keeps the bytes it replaced as a version, fetched for that alone.
    assert b.uploads.upload("t13", (b"second a", "a.bin")).status_code == 200
    versions = a.client.get("/api/threads/t13/uploads/a.bin/versions").get_json()["versions"]
    (version,) = versions
    assert version["sha256"] == sha(first["a.bin"])
    assert sorted(p.name for p in uploads_dir(b.base_dir, "t13").iterdir()) == [
        "a.bin",
        "b_1.bin",
        "c.bin",
        "gone.bin",
    ]
    assert a.download("t13", "a.bin").data == b"second a"
    assert a.download("t13", "gone.bin").data == b"back"
    assert sorted(a.uploads.names("t13")) == ["a.bin", "b.bin", "b_1.bin", "c.bin", "gone.bin"]


def test_a_download_whose_bytes_left_the_bucket_says_so_before_sending_any(
    instances: tuple[Instance, Instance], bucket: S3ObjectStore
) -> None:
    a, b = instances
    assert a.uploads.upload("t14", (b"soon gone", "lost.txt")).status_code == 200
    bucket.delete(blob_key(scope_of("t14"), sha(b"soon gone")))  # behind the app's back
    lost = b.client.get("/api/threads/t14/artifacts/mnt/user-data/uploads/lost.txt")
    assert lost.status_code == 500
    detail = lost.get_json()["detail"]
    assert "lost.txt" in detail and "missing from the bucket" in detail
    assert "blobs" not in detail  # the bucket's layout is not the client's business
    assert not uploads_dir(b.base_dir, "t14").exists()
