"""Retention (issue 27): threads untouched for `retention.thread_days` go, fresh ones and
ones with an upload in progress stay, and two sweepers never both run. SQLite and
PostgreSQL each."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy import update

from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.history.hooks import make_history
from deerflow_web.services.prompt.chat_preview import make_chat_preview_service
from deerflow_web.services.quotas.retention import LEASE_NAME
from deerflow_web.services.quotas.retention import RetentionSweeper
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.resumable import ResumableUploadService
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.settings import HistorySettings
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import uploads as uploads_table
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.resumable import DatabaseResumableStore

# Nothing here reads the mode: every thread is named with its owner and the catalog
# is built by hand. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

DAY = 86400.0
OWNER = "u1"


@pytest.fixture
def engine(base_dir: Path, database_url: str) -> Iterator[Engine]:
    engine = open_database(base_dir, database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def service(base_dir: Path, engine: Engine) -> UploadService:
    return make_upload_service(base_dir, engine=engine)


@pytest.fixture
def catalog(service: UploadService) -> ThreadCatalog:
    return ThreadCatalog(service, make_chat_preview_service(service))


def sweeper(catalog: ThreadCatalog, **kwargs) -> RetentionSweeper:
    return RetentionSweeper(catalog, JobLeases(catalog.engine), 30, **kwargs)


def make_thread(catalog: ThreadCatalog, service: UploadService, thread_id: str, age_days: float):
    """A thread with one file, every trace of activity `age_days` old."""
    ref = ThreadRef(thread_id, OWNER)
    catalog.create(OWNER, thread_id)
    service.save_uploads(ref, [IncomingFile("a.txt", io.BytesIO(b"hello"))])
    then = time.time() - age_days * DAY
    with catalog.engine.begin() as db:
        db.execute(
            update(threads)
            .where(threads.c.thread_id == thread_id)
            .values(created_at=then, updated_at=then)
        )
        db.execute(
            update(uploads_table)
            .where(uploads_table.c.scope == catalog.paths.scope(ref))
            .values(uploaded_at=then, mtime_ns=int(then * 1e9))
        )
    thread_dir = catalog.paths.thread_dir(ref)
    for folder in [thread_dir, *(p for p in thread_dir.rglob("*"))]:
        os.utime(folder, (then, then), follow_symlinks=False)
    return ref


def test_expired_threads_go_and_fresh_ones_stay(catalog, service, caplog) -> None:
    old = make_thread(catalog, service, "old", 40)
    fresh = make_thread(catalog, service, "fresh", 3)
    caplog.set_level("INFO", logger="deerflow_web.services.quotas.retention")
    report = sweeper(catalog).sweep()
    assert report is not None and report.removed == [old]
    assert catalog.find(old) is None
    assert not catalog.paths.thread_dir(old).exists()
    assert service.records.all(catalog.paths.scope(old)) == []
    assert catalog.find(fresh) is not None
    assert "removed thread old of u1, untouched for 30 days" in caplog.text


def test_a_recent_file_keeps_an_old_thread(catalog, service) -> None:
    ref = make_thread(catalog, service, "old", 40)
    service.save_uploads(ref, [IncomingFile("new.txt", io.BytesIO(b"new"))])
    report = sweeper(catalog).sweep()
    assert report is not None and report.removed == []
    assert catalog.find(ref) is not None


def test_a_pending_resumable_upload_keeps_its_thread(catalog, service) -> None:
    ref = make_thread(catalog, service, "old", 40)
    intake = UploadIntake(service, ConversionJobs(service, ConversionSettings()))
    tus = ResumableUploadService(intake, DatabaseResumableStore(service.records.engine))
    tus.create(ref, 100, "filename " + "YmlnLmJpbg==")
    thread_dir = catalog.paths.thread_dir(ref)
    then = time.time() - 40 * DAY
    for folder in [thread_dir, *(p for p in thread_dir.rglob("*"))]:
        os.utime(folder, (then, then), follow_symlinks=False)  # as if resumed long ago
    report = sweeper(catalog).sweep()
    assert report is not None and report.removed == [] and report.kept_in_progress == [ref]
    assert catalog.find(ref) is not None


def test_a_multipart_upload_streaming_keeps_its_thread(catalog, service) -> None:
    """A staging file in the folder is an upload under way on some instance."""
    ref = make_thread(catalog, service, "old", 40)
    staging = catalog.paths.uploads_dir(ref) / ".upload-abc.part"
    staging.write_bytes(b"half")
    then = time.time() - 40 * DAY
    for path in (staging, staging.parent):
        os.utime(path, (then, then))
    report = sweeper(catalog).sweep()
    assert report is not None and report.kept_in_progress == [ref]
    assert staging.exists()


def test_a_sweep_waits_for_its_interval(catalog, service) -> None:
    make_thread(catalog, service, "old", 40)
    first = sweeper(catalog, interval_seconds=3600)
    assert first.sweep_if_due() is not None
    make_thread(catalog, service, "older", 50)
    assert sweeper(catalog, interval_seconds=3600).sweep_if_due() is None  # ran just now
    assert catalog.find(ThreadRef("older", OWNER)) is not None


def test_retention_off_never_sweeps(catalog, service) -> None:
    make_thread(catalog, service, "old", 400)
    off = RetentionSweeper(catalog, JobLeases(catalog.engine), None)
    assert not off.enabled and off.sweep_if_due() is None


def test_a_sweep_while_another_holds_the_lease_does_nothing(catalog, service) -> None:
    ref = make_thread(catalog, service, "old", 40)
    now = time.time()
    assert JobLeases(catalog.engine).take(LEASE_NAME, "other:1", now, now + 300)
    assert sweeper(catalog, owner="me:2").sweep() is None
    assert catalog.find(ref) is not None


def test_two_sweepers_never_both_run(catalog, service, monkeypatch) -> None:
    """Many sweepers start at once on separate connections; while one sweeps (held up
    inside its sweep), every other one finds the lease taken."""
    for index in range(3):
        make_thread(catalog, service, f"old{index}", 40)
    inside = threading.Semaphore(0)
    release = threading.Event()
    running = []
    overlap = []
    original = RetentionSweeper._sweep_threads

    def slow(self, cutoff, report):
        running.append(self.owner)
        if len(running) > 1:
            overlap.append(list(running))
        inside.release()
        release.wait(10)
        try:
            original(self, cutoff, report)
        finally:
            running.remove(self.owner)

    monkeypatch.setattr(RetentionSweeper, "_sweep_threads", slow)
    results: dict[str, object] = {}
    barrier = threading.Barrier(6)

    def one(index: int) -> None:
        barrier.wait()
        results[f"s{index}"] = sweeper(catalog, owner=f"s{index}").sweep()

    workers = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for worker in workers:
        worker.start()
    assert inside.acquire(timeout=10)
    time.sleep(0.3)  # the others try meanwhile
    release.set()
    for worker in workers:
        worker.join()
    ran = [name for name, report in results.items() if report is not None]
    assert overlap == []
    assert len(ran) >= 1
    assert all(catalog.find(ThreadRef(f"old{i}", OWNER)) is None for i in range(3))


def test_with_a_trash_an_expired_thread_goes_there_first_then_for_good(catalog, service) -> None:
    """Nothing goes without the trash's grace: the files first, restorable; the thread
    once its trash has expired."""
    trash = make_history(service, HistorySettings(trash_days=30)).trash_bin
    old = make_thread(catalog, service, "old", 40)
    clock = time.time

    report = sweeper(catalog, trash=trash).sweep()
    assert report is not None and report.trashed == [old] and report.removed == []
    assert service.list_uploads(old) == []
    [entry] = trash.list(old)
    assert entry.filename == "a.txt" and catalog.find(old) is not None

    later = sweeper(catalog, trash=trash, clock=lambda: clock() + 31 * DAY).sweep()
    assert later is not None and later.trashed == [] and later.removed == [old]
    assert catalog.find(old) is None and not catalog.paths.thread_dir(old).exists()
