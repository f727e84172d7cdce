"""Storage quotas (issue 27): what counts, every kind of write refused over the quota with
nothing left behind, and writers racing for one owner never together going over. Each
test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy import func
from sqlalchemy import select

from deerflow_web.errors import ConversionOverQuota
from deerflow_web.errors import QuotaExceeded
from deerflow_web.models import ConversionState
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.files.artifact_edit import edit_artifact
from deerflow_web.services.quotas.policy import QuotaPolicy
from deerflow_web.services.quotas.usage import owner_range
from deerflow_web.services.quotas.usage import owner_versions_query
from deerflow_web.services.quotas.usage import stored_bytes
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.resumable import ResumableUploadService
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.database import record_versions
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import uploads as uploads_table
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.resumable import DatabaseResumableStore
from tests.helpers import uploads_dir

# Nothing here reads the mode: every thread is named with its owner and the service
# is built by hand. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

OWNER = "u1"


@pytest.fixture
def engine(base_dir: Path, database_url: str) -> Iterator[Engine]:
    engine = open_database(base_dir, database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def policy(engine: Engine) -> QuotaPolicy:
    return QuotaPolicy(engine, 100)


@pytest.fixture
def service(base_dir: Path, engine: Engine, policy: QuotaPolicy) -> UploadService:
    return make_upload_service(base_dir, engine=engine, quotas=policy)


def ref(thread_id: str = "T", owner: str = OWNER) -> ThreadRef:
    return ThreadRef(thread_id, owner)


def save(service: UploadService, thread: ThreadRef, *files: tuple[bytes, str], **options):
    incoming = [IncomingFile(name, io.BytesIO(body)) for body, name in files]
    return service.save_uploads(thread, incoming, **options)


def on_disk(base_dir: Path, thread_id: str = "T", owner: str = OWNER) -> list[str]:
    folder = uploads_dir(base_dir, thread_id, owner)
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def record_names(engine: Engine) -> list[str]:
    with engine.connect() as db:
        return sorted(row[0] for row in db.execute(select(uploads_table.c.filename)))


def pending_rows(engine: Engine) -> int:
    with engine.connect() as db:
        return db.execute(select(func.count()).select_from(resumable_uploads)).scalar_one()


def resumable(service: UploadService) -> ResumableUploadService:
    intake = UploadIntake(service, ConversionJobs(service, ConversionSettings()))
    store = DatabaseResumableStore(service.records.engine)
    return ResumableUploadService(intake, store, expiry_seconds=3600)


def meta(name: str) -> str:
    return "filename " + base64.b64encode(name.encode()).decode()


# ---- what counts ----------------------------------------------------------------------


def test_usage_is_every_thread_of_the_owner_and_only_theirs(service, policy, engine) -> None:
    save(service, ref("A"), (b"x" * 10, "a.txt"))
    save(service, ref("B"), (b"x" * 20, "b.txt"))
    # Neighbours whose keys share a prefix or match it as a LIKE pattern would.
    save(service, ref("A", "u1x"), (b"x" * 40, "c.txt"))
    save(service, ref("A", "u_"), (b"x" * 50, "d.txt"))
    save(service, ThreadRef.single_user("A"), (b"x" * 7, "e.txt"))
    assert policy.usage(OWNER).bytes == 30
    assert policy.usage("uA").bytes == 0
    assert policy.usage("u_").bytes == 50
    assert policy.usage("").bytes == 7  # the single-user layout's one owner
    assert policy.usage(OWNER).quota_bytes == 100


def test_pending_resumable_uploads_count_by_declared_length(service, policy) -> None:
    tus = resumable(service)
    tus.create(ref(), 60, meta("big.bin"))
    assert policy.usage(OWNER).bytes == 60
    with pytest.raises(QuotaExceeded):
        save(service, ref("B"), (b"x" * 50, "other.txt"))  # 60 reserved + 50 > 100


def test_converted_companions_count(service, policy) -> None:
    save(service, ref(), (b"%PDF-1.4", "r.pdf"))
    jobs = ConversionJobs(
        service,
        ConversionSettings(wait_seconds=5),
        converter=lambda s, d, **_: d.write_text("# " + "m" * 20, encoding="utf-8"),
    )
    status = jobs.convert(ref(), "r.pdf")
    assert status.error is None
    assert policy.usage(OWNER).bytes == 8 + 22


# ---- refusals leave nothing -----------------------------------------------------------


def test_a_multipart_upload_over_the_quota_leaves_nothing(service, engine, base_dir) -> None:
    save(service, ref(), (b"x" * 60, "first.txt"))
    with pytest.raises(QuotaExceeded) as refused:
        save(service, ref(), (b"y" * 30, "second.txt"), (b"z" * 20, "third.txt"))
    assert str(refused.value) == (
        "Storage quota exceeded: 60 B of 100 B used, this upload needs 50 B"
    )
    assert on_disk(base_dir) == ["first.txt"]  # no staging file, neither part
    assert record_names(engine) == ["first.txt"]


def test_an_upload_that_exactly_fills_the_quota_is_stored(service, policy) -> None:
    save(service, ref(), (b"x" * 60, "a.txt"))
    save(service, ref("B"), (b"x" * 40, "b.txt"))
    assert policy.usage(OWNER).bytes == 100


def test_a_replacement_is_charged_only_what_it_adds(service, policy, base_dir) -> None:
    save(service, ref(), (b"x" * 90, "a.txt"))
    save(service, ref(), (b"y" * 95, "a.txt"))  # replaces: 95 in all
    with pytest.raises(QuotaExceeded):
        save(service, ref(), (b"z" * 101, "a.txt"))
    assert (uploads_dir(base_dir, "T", OWNER) / "a.txt").read_bytes() == b"y" * 95
    assert policy.usage(OWNER).bytes == 95


def test_over_a_lowered_quota_a_write_that_does_not_grow_is_kept(service, engine) -> None:
    save(service, ref(), (b"x" * 90, "a.txt"))
    small = QuotaPolicy(engine, 10)
    lowered = make_upload_service(service.paths.base_dir, engine=engine, quotas=small)
    save(lowered, ref(), (b"y" * 50, "a.txt"))  # shrinking is always allowed
    with pytest.raises(QuotaExceeded):
        save(lowered, ref(), (b"y" * 1, "b.txt"))
    assert small.usage(OWNER).bytes == 50


def test_rename_mode_refused_over_quota_leaves_nothing(service, engine, base_dir) -> None:
    save(service, ref(), (b"x" * 60, "a.txt"))
    with pytest.raises(QuotaExceeded):
        save(service, ref(), (b"y" * 60, "a.txt"), on_conflict=OnConflict.RENAME)
    assert on_disk(base_dir) == ["a.txt"]
    assert record_names(engine) == ["a.txt"]


def test_a_tus_creation_over_the_quota_keeps_nothing(service, engine, base_dir) -> None:
    save(service, ref(), (b"x" * 60, "a.txt"))
    with pytest.raises(QuotaExceeded) as refused:
        resumable(service).create(ref(), 41, meta("big.bin"))
    assert "60 B of 100 B used, this upload needs 41 B" in str(refused.value)
    assert pending_rows(engine) == 0
    assert on_disk(base_dir) == ["a.txt"]  # no staging file


def test_a_reserved_tus_upload_commits_under_a_quota_lowered_meanwhile(
    service, engine, base_dir
) -> None:
    """Its declared length was admitted at creation: finishing it adds nothing; the next
    new write is what the lowered quota refuses."""
    tus = resumable(service)
    upload_id = tus.create(ref(), 50, meta("big.bin")).upload.upload_id
    save(service, ref("B"), (b"x" * 40, "other.txt"))
    service.quotas = QuotaPolicy(engine, 60)  # the admin lowers the quota
    tus.append(ref(), upload_id, offset=0, body=io.BytesIO(b"z" * 50), content_length=50)
    assert record_names(engine) == ["big.bin", "other.txt"]
    with pytest.raises(QuotaExceeded):
        save(service, ref("B"), (b"y", "more.txt"))
    assert on_disk(base_dir, "B") == ["other.txt"]


def test_a_tus_upload_within_its_reservation_commits(service, policy, engine) -> None:
    tus = resumable(service)
    upload_id = tus.create(ref(), 90, meta("big.bin")).upload.upload_id
    outcome = tus.append(ref(), upload_id, offset=0, body=io.BytesIO(b"z" * 90), content_length=90)
    assert outcome.accepted is not None
    assert record_names(engine) == ["big.bin"]
    assert policy.usage(OWNER).bytes == 90  # the reservation became the record


def test_conversion_output_over_the_quota_is_not_kept(service, engine, base_dir) -> None:
    save(service, ref(), (b"%PDF-1.4", "r.pdf"))
    jobs = ConversionJobs(
        service,
        ConversionSettings(wait_seconds=5),
        converter=lambda s, d, **_: d.write_text("m" * 200, encoding="utf-8"),
    )
    status = jobs.convert(ref(), "r.pdf")
    assert isinstance(status.error, ConversionOverQuota)
    assert "Storage quota exceeded" in str(status.error)
    assert status.record.conversion_state is ConversionState.FAILED
    assert on_disk(base_dir) == ["r.pdf"]  # no companion, no temporary
    assert record_names(engine) == ["r.pdf"]


def test_an_artifact_edit_that_grows_past_the_quota_is_refused(service, base_dir) -> None:
    save(service, ref(), (b"x" * 90, "a.txt"))
    outputs = uploads_dir(base_dir, "T", OWNER).parent / "outputs"
    outputs.mkdir()
    (outputs / "notes.md").write_text("short", encoding="utf-8")
    import hashlib

    sha = hashlib.sha256(b"short").hexdigest()
    folders = service.folders(ref())
    path = "/mnt/user-data/outputs/notes.md"
    with pytest.raises(QuotaExceeded):
        edit_artifact(folders, path, "s" * 20, sha, quotas=service.quotas)
    assert (outputs / "notes.md").read_text(encoding="utf-8") == "short"
    assert sorted(p.name for p in outputs.iterdir()) == ["notes.md"]  # no staging file
    edited = edit_artifact(folders, path, "s" * 10, sha, quotas=service.quotas)  # +5 fits
    assert edited.size == 10


def test_without_a_quota_nothing_is_refused(base_dir, engine) -> None:
    service = make_upload_service(base_dir, engine=engine, quotas=QuotaPolicy(engine, None))
    save(service, ref(), (b"x" * 5000, "a.txt"))
    assert service.quotas is not None and service.quotas.usage(OWNER).quota_bytes is None


# ---- racing writers -------------------------------------------------------------------


def test_writers_racing_for_one_owner_never_go_over(service, engine, base_dir) -> None:
    """Twenty uploads of 10 bytes at once, to twenty threads of one owner (on PostgreSQL
    twenty records locks that do not exclude each other): exactly ten fit in 100."""
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def one(index: int) -> None:
        barrier.wait()
        try:
            save(service, ref(f"T{index}"), (b"x" * 10, "f.txt"))
            outcomes.append("stored")
        except QuotaExceeded:
            outcomes.append("refused")

    workers = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert outcomes.count("stored") == 10 and outcomes.count("refused") == 10
    with engine.connect() as db:
        assert stored_bytes(db, OWNER, 0.0) == 100
    for index in range(20):
        names = on_disk(base_dir, f"T{index}")
        assert names in ([], ["f.txt"])  # a refused one left no staging file


# ---- the kept sums --------------------------------------------------------------------


def test_kept_thread_sums_always_match_the_records(service, engine, base_dir) -> None:
    """Two processes' policies (each with its own kept sums) and a full sum agree after
    every kind of change, whoever made it."""
    other = QuotaPolicy(engine, 100_000)
    service.quotas = QuotaPolicy(engine, 100_000)
    second = make_upload_service(base_dir, engine=engine, quotas=other)

    def agree() -> None:
        with engine.connect() as db:
            full = stored_bytes(db, OWNER, 0.0)
        assert service.quotas.usage(OWNER).bytes == full
        assert other.usage(OWNER).bytes == full

    save(service, ref("A"), (b"x" * 10, "a.txt"), (b"y" * 20, "b.txt"))
    agree()
    save(second, ref("A"), (b"z" * 5, "a.txt"))  # a replacement by the other process
    agree()
    save(service, ref("B"), (b"%PDF-1.4", "r.pdf"))
    jobs = ConversionJobs(
        service,
        ConversionSettings(wait_seconds=5),
        converter=lambda s, d, **_: d.write_text("m" * 33, encoding="utf-8"),
    )
    jobs.convert(ref("B"), "r.pdf")
    agree()
    service.delete_upload(ref("A"), "b.txt")
    agree()
    second.rename_upload(ref("A"), "a.txt", "c.txt")
    agree()
    (uploads_dir(base_dir, "B", OWNER) / "r.md").unlink()  # behind the app's back
    service.list_uploads(ref("B"))  # reconciled
    agree()
    tus = resumable(second)
    upload_id = tus.create(ref("C"), 7, meta("t.bin")).upload.upload_id
    agree()
    tus.append(ref("C"), upload_id, offset=0, body=io.BytesIO(b"t" * 7), content_length=7)
    agree()
    save(service, ref("A"), (b"w" * 3, "c.txt"))  # replaces again, sums kept on both sides
    agree()


def test_an_owners_threads_are_read_by_index_not_by_scanning_everyones(
    engine: Engine, database_url: str
) -> None:
    """The commit's usage read finds one owner's threads by a range of their scopes; with
    50,000 threads of 500 owners stored it must read the owner's 100, through an index.
    (On PostgreSQL the range compares as "C", which the primary key cannot serve: each
    commit read the whole table before migration 0012.)"""
    with engine.begin() as db:
        db.execute(
            record_versions.insert(),
            [{"scope": f"users/u{n % 500}/threads/t{n}", "version": 1} for n in range(50_000)],
        )
        if engine.dialect.name == "postgresql":
            db.exec_driver_sql("ANALYZE record_versions")
    query = owner_versions_query(engine.dialect.name)
    with engine.connect() as db:
        params = owner_range("u7")
        sql = query.params(**params).compile(
            dialect=engine.dialect, compile_kwargs={"literal_binds": True}
        )
        prefix = "EXPLAIN " if engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
        plan = " ".join(str(row[-1]) for row in db.exec_driver_sql(f"{prefix}{sql}"))
        found = db.execute(query, params).all()
    assert len(found) == 100 and all(s.startswith("users/u7/threads/") for s, _ in found)
    assert "Seq Scan" not in plan and "SCAN record_versions" not in plan, plan
    assert "Index" in plan or "INDEX" in plan, plan
