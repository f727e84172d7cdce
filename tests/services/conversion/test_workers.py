"""Jobs apart from web instances (`jobs.run_in_web`, `flask --app app worker`): a web
instance with jobs off only records a job; a worker claims it at once, only as many as it
has converters free, and hands back or releases what it holds when it stops."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from deerflow_web.errors import ConversionUserLimit
from deerflow_web.models import ConversionState
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.background import BackgroundJobs
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.settings import JobsSettings
from deerflow_web.storage.migrate import open_database
from tests.helpers import wait_until

# The thread is a single-user one and no request is made: nothing here reads the mode.
pytestmark = pytest.mark.same_in_both_modes

THREAD = ThreadRef.single_user("T")


@pytest.fixture
def service(base_dir: Path, database_url: str):
    """An upload service on each engine in turn (SQLite, PostgreSQL)."""
    engine = open_database(base_dir, database_url)
    yield make_upload_service(base_dir, engine=engine)
    engine.dispose()


@pytest.fixture
def made():
    """Every ConversionJobs of a test; afterwards each has finished what it runs (no
    conversion outlives its test's database) and its keeper is stopped."""
    jobs: list[ConversionJobs] = []
    yield jobs
    for item in jobs:
        wait_until(lambda item=item: item.running == 0 and item.queued == 0, timeout=60)
        item.stop_keeper()


def markdown(source: Path, destination: Path, **_: object) -> None:
    destination.write_text(f"# converted {source.name}\n", encoding="utf-8")


def never(source: Path, destination: Path, **_: object) -> None:
    raise AssertionError("a web instance with jobs off converted a document")


class Gate:
    """A converter that waits until released (or `seconds` pass), then writes Markdown."""

    def __init__(self, seconds: float = 30.0) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.seconds = seconds

    def __call__(self, source: Path, destination: Path, **_: object) -> None:
        self.started.set()
        self.release.wait(self.seconds)
        markdown(source, destination)


def jobs_with(made, service, converter, *, runs_jobs: bool = True, **settings) -> ConversionJobs:
    jobs = ConversionJobs(
        service,
        ConversionSettings(**{"wait_seconds": 5, **settings}),
        converter=converter,
        runs_jobs=runs_jobs,
    )
    made.append(jobs)
    return jobs


def worker_with(made, service, converter, **settings) -> ConversionJobs:
    jobs = jobs_with(made, service, converter, **settings)
    jobs.become_worker()
    jobs.owner = f"worker-{len(made)}:1"  # two workers of one test are two processes
    return jobs


def save(service, *names: str) -> UploadResult:
    return service.save_uploads(
        THREAD, [IncomingFile(name, io.BytesIO(b"%PDF-1.4 " + name.encode())) for name in names]
    )


def state(service, name: str) -> ConversionState | None:
    return service.get_upload(THREAD, name).conversion_state


def scope(service) -> str:
    return service.paths.scope(THREAD)


# --- a web instance with jobs off -----------------------------------------------------------


def test_jobs_off_records_the_job_for_any_worker_and_converts_nothing(service, made) -> None:
    save(service, "a.pdf")
    web = jobs_with(made, service, never, runs_jobs=False)
    status = web.convert(THREAD, "a.pdf", wait=0.3)
    assert not status.finished and status.companion is None
    assert status.record.conversion_state is ConversionState.QUEUED
    job = service.records.conversion_job(scope(service), "a.pdf")
    # No holder and no lease: claimable at once, not only after a lease runs out.
    assert (job.owner, job.lease_until) == (None, None)
    assert web.started_jobs == 0 and web.held_jobs() == []
    assert service.records.claim_conversion(scope(service), "a.pdf", "w:1", time.time(), 1e12)


def test_a_worker_runs_the_job_and_the_web_instance_sees_it_done(service, made) -> None:
    save(service, "a.pdf")
    web = jobs_with(made, service, never, runs_jobs=False)
    assert not web.convert(THREAD, "a.pdf", wait=0).finished
    worker = worker_with(made, service, markdown)
    assert worker.claim_waiting_jobs() == [(scope(service), "a.pdf")]
    wait_until(lambda: web.status(THREAD, "a.pdf").finished)  # read from the database
    status = web.status(THREAD, "a.pdf")
    assert status.error is None
    assert status.companion.filename == "a.md"
    assert (service.uploads_dir(THREAD) / "a.md").read_text() == "# converted a.pdf\n"
    assert worker.started_jobs == 1 and web.started_jobs == 0


def test_jobs_off_waits_while_a_worker_converts_then_answers_done(service, made) -> None:
    save(service, "a.pdf")
    web = jobs_with(made, service, never, runs_jobs=False)
    worker = worker_with(made, service, markdown)
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.05):
            worker.claim_waiting_jobs()

    polling = threading.Thread(target=poll)
    polling.start()
    try:
        status = web.convert(THREAD, "a.pdf", wait=20)
    finally:
        stop.set()
        polling.join()
    assert status.finished and status.companion.filename == "a.md"


def test_jobs_off_never_takes_over_a_job_whose_lease_ran_out(service, made) -> None:
    save(service, "a.pdf")
    service.records.set_conversion(
        scope(service), "a.pdf", ConversionState.CONVERTING, None, "dead:1", time.time() - 1
    )
    web = jobs_with(made, service, never, runs_jobs=False)
    assert not web.convert(THREAD, "a.pdf", wait=0.5).finished
    assert service.records.conversion_owner(scope(service), "a.pdf") == "dead:1"
    assert web.reclaim_interrupted_jobs() == 0
    assert web.started_jobs == 0


def test_jobs_off_starts_no_keeper(service, made) -> None:
    web = jobs_with(made, service, never, runs_jobs=False)
    web.start_keeper()
    assert web._keeper is None


def test_jobs_off_queues_the_upload_conversions_and_answers_after_the_wait(service, made) -> None:
    result = save(service, "a.pdf", "b.pdf")
    web = jobs_with(
        made, service, never, runs_jobs=False, auto_convert_documents=True, wait_seconds=0.3
    )
    assert web.convert_after_upload(THREAD, result) == {}  # nobody converted them yet
    assert state(service, "a.pdf") is ConversionState.QUEUED
    assert state(service, "b.pdf") is ConversionState.QUEUED
    worker = worker_with(made, service, markdown, workers=2)
    assert sorted(name for _, name in worker.claim_waiting_jobs()) == ["a.pdf", "b.pdf"]
    wait_until(lambda: state(service, "b.pdf") is ConversionState.DONE)
    wait_until(lambda: state(service, "a.pdf") is ConversionState.DONE)


def test_jobs_off_returns_the_companions_a_worker_made_within_the_wait(service, made) -> None:
    result = save(service, "a.pdf")
    web = jobs_with(
        made, service, never, runs_jobs=False, auto_convert_documents=True, wait_seconds=20
    )
    worker = worker_with(made, service, markdown)
    claimer = threading.Timer(0.3, worker.claim_waiting_jobs)
    claimer.start()
    try:
        companions = web.convert_after_upload(THREAD, result)
    finally:
        claimer.join()
    assert companions["a.pdf"].filename == "a.md"


# --- workers --------------------------------------------------------------------------------


def test_a_worker_claims_only_as_many_jobs_as_it_has_converters_free(service, made) -> None:
    save(service, "a.pdf", "b.pdf", "c.pdf")
    web = jobs_with(made, service, never, runs_jobs=False)
    for name in ("a.pdf", "b.pdf", "c.pdf"):
        web.convert(THREAD, name, wait=0)
    gate = Gate()
    first = worker_with(made, service, gate, workers=1)
    second = worker_with(made, service, markdown, workers=2)
    try:
        assert [name for _, name in first.claim_waiting_jobs()] == ["a.pdf"]  # oldest first
        assert first.free_converters == 0
        assert first.claim_waiting_jobs() == []  # busy: the rest are left to other workers
        assert sorted(name for _, name in second.claim_waiting_jobs()) == ["b.pdf", "c.pdf"]
        wait_until(lambda: state(service, "c.pdf") is ConversionState.DONE)
        assert state(service, "a.pdf") is not ConversionState.DONE
    finally:
        gate.release.set()
    wait_until(lambda: state(service, "a.pdf") is ConversionState.DONE)
    # The record is written first, the converter let go just after it.
    wait_until(lambda: first.free_converters == 1)


def test_a_draining_process_hands_back_the_jobs_no_converter_started(service, made) -> None:
    save(service, "a.pdf", "b.pdf")
    gate = Gate()
    busy = jobs_with(made, service, gate, workers=1)
    busy.convert(THREAD, "a.pdf", wait=0)
    busy.convert(THREAD, "b.pdf", wait=0)  # waits here behind a.pdf
    assert gate.started.wait(10)
    try:
        assert busy.drain() == 1
        job = service.records.conversion_job(scope(service), "b.pdf")
        assert (job.state, job.owner, job.lease_until) == (ConversionState.QUEUED, None, None)
        assert busy.held_jobs() == [(scope(service), "a.pdf")]
        assert busy.claim_waiting_jobs() == []  # stopping: takes nothing new
        other = worker_with(made, service, markdown)
        assert other.claim_waiting_jobs() == [(scope(service), "b.pdf")]
        wait_until(lambda: state(service, "b.pdf") is ConversionState.DONE)
    finally:
        gate.release.set()
    # The running one ends: its record is written first, then its converter is let go.
    wait_until(lambda: state(service, "a.pdf") is ConversionState.DONE and busy.running == 0)
    assert busy.started_jobs == 1


def test_stopping_lets_a_running_conversion_finish_within_the_grace(service, made) -> None:
    save(service, "a.pdf")
    gate = Gate()
    worker = worker_with(made, service, gate)
    jobs = BackgroundJobs(JobsSettings(stop_grace_seconds=30), worker)
    service.records.set_conversion(scope(service), "a.pdf", ConversionState.QUEUED)
    assert worker.claim_waiting_jobs()
    assert gate.started.wait(10)
    threading.Timer(0.3, gate.release.set).start()
    assert jobs.stop_cleanly() == 0
    assert state(service, "a.pdf") is ConversionState.DONE


def test_a_conversion_still_running_after_the_grace_is_released(service, made) -> None:
    save(service, "a.pdf")
    gate = Gate()
    worker = worker_with(made, service, gate)
    jobs = BackgroundJobs(JobsSettings(stop_grace_seconds=0.3), worker)
    service.records.set_conversion(scope(service), "a.pdf", ConversionState.QUEUED)
    try:
        assert worker.claim_waiting_jobs()
        assert gate.started.wait(10)
        assert jobs.stop_cleanly() == 1
        job = service.records.conversion_job(scope(service), "a.pdf")
        assert (job.state, job.owner, job.lease_until) == (ConversionState.QUEUED, None, None)
        other = worker_with(made, service, markdown)
        assert other.claim_waiting_jobs() == [(scope(service), "a.pdf")]  # at once
    finally:
        gate.release.set()
    wait_until(lambda: state(service, "a.pdf") is ConversionState.DONE)
    assert (service.uploads_dir(THREAD) / "a.md").read_text() == "# converted a.pdf\n"


def test_the_worker_loop_claims_until_stopped(service, made) -> None:
    save(service, "a.pdf")
    web = jobs_with(made, service, never, runs_jobs=False)
    worker = jobs_with(made, service, markdown, runs_jobs=False)  # a jobs-off config...
    jobs = BackgroundJobs(JobsSettings(poll_seconds=0.05, stop_grace_seconds=5), worker)
    stop = threading.Event()
    outcome: list[int] = []
    loop = threading.Thread(target=lambda: outcome.append(jobs.run_until(stop)))
    loop.start()
    try:
        web.convert(THREAD, "a.pdf", wait=0)
        wait_until(lambda: state(service, "a.pdf") is ConversionState.DONE)
        assert worker.is_worker and worker.runs_jobs  # ...still runs the jobs as a worker
    finally:
        stop.set()
        loop.join(30)
    assert outcome == [0] and not loop.is_alive()
    assert worker.claim_waiting_jobs() == []  # stopped: claims nothing any more


def test_describe_names_what_a_worker_runs(service, made) -> None:
    worker = jobs_with(made, service, markdown, workers=3)
    text = BackgroundJobs(JobsSettings(), worker).describe()
    assert text.startswith("conversions (3 converters)")
    assert "no rescans (scanning off)" in text and "no retention sweeps" in text


def test_release_conversion_only_releases_the_holders_job(service) -> None:
    save(service, "a.pdf")
    records = service.records
    records.set_conversion(scope(service), "a.pdf", ConversionState.CONVERTING, None, "a:1", 1e12)
    assert not records.release_conversion(scope(service), "a.pdf", "b:1")
    assert records.conversion_owner(scope(service), "a.pdf") == "a:1"
    assert records.release_conversion(scope(service), "a.pdf", "a:1")
    job = records.conversion_job(scope(service), "a.pdf")
    assert (job.state, job.owner, job.lease_until) == (ConversionState.QUEUED, None, None)
    assert not records.release_conversion(scope(service), "missing.pdf", "a:1")


def test_a_starting_process_leaves_the_queued_jobs_to_the_claims(service, made) -> None:
    """Restart recovery takes the jobs of this host's dead processes, not the jobs queued
    for any worker: those go to whoever has a converter free."""
    save(service, "a.pdf", "b.pdf")
    web = jobs_with(made, service, never, runs_jobs=False)
    web.convert(THREAD, "a.pdf", wait=0)
    web.convert(THREAD, "b.pdf", wait=0)
    worker = worker_with(made, service, Gate(seconds=0), workers=1)
    assert worker.reclaim_interrupted_jobs() == 0
    assert len(worker.claim_waiting_jobs()) == 1


def test_jobs_off_still_bounds_what_one_user_has_queued(service, made) -> None:
    """Fair share, counted in the database: one user may have `max_per_user` jobs queued
    or running on all workers together; another user is not held back."""
    alice, bob = ThreadRef("T", "alice"), ThreadRef("T", "bob")
    for ref in (alice, bob):
        service.save_uploads(
            ref, [IncomingFile(f"{n}.pdf", io.BytesIO(b"%PDF-1.4")) for n in "abc"]
        )
    web = jobs_with(made, service, never, runs_jobs=False, max_per_user=2)
    web.convert(alice, "a.pdf", wait=0)
    web.convert(alice, "b.pdf", wait=0)
    web.convert(alice, "b.pdf", wait=0)  # already queued: followed, not counted twice
    with pytest.raises(ConversionUserLimit) as refused:
        web.convert(alice, "c.pdf", wait=0)
    assert refused.value.retry_after > 0
    assert service.get_upload(alice, "c.pdf").conversion_state is None  # nothing queued
    assert not web.convert(bob, "a.pdf", wait=0).finished
    single = jobs_with(made, service, never, runs_jobs=False, max_per_user=1)
    save(service, "a.pdf", "b.pdf")
    single.convert(THREAD, "a.pdf", wait=0)
    single.convert(THREAD, "b.pdf", wait=0)  # single-user mode: one user, no share to keep
    assert state(service, "b.pdf") is ConversionState.QUEUED


def test_claimable_means_active_with_no_lease_or_a_lapsed_one(service) -> None:
    save(service, "a.pdf")
    records, now = service.records, time.time()
    assert not records.has_claimable_conversions(now)  # no job at all
    records.set_conversion(scope(service), "a.pdf", ConversionState.QUEUED, None, "w:1", now + 60)
    assert not records.has_claimable_conversions(now)  # held, lease live
    assert records.has_claimable_conversions(now + 61)  # its lease ran out
    records.set_conversion(scope(service), "a.pdf", ConversionState.QUEUED)
    assert records.has_claimable_conversions(now)  # queued for any worker
    records.set_conversion(scope(service), "a.pdf", ConversionState.DONE)
    assert not records.has_claimable_conversions(now)  # over
