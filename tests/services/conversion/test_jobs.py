"""Conversion jobs: naming (SPEC 3.2, D8), states, waiting, restarts, and the HTTP surface."""

from __future__ import annotations

import io
import socket
import threading
import time
from pathlib import Path

import pytest

from deerflow_web.errors import ConversionError
from deerflow_web.errors import ConversionTimedOut
from deerflow_web.errors import NotConvertible
from deerflow_web.models import ConversionState
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.migrate import open_database
from tests.helpers import UploadActions
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.documents import make_docx
from tests.support.documents import make_encrypted_pdf


def fake_converter(text_for=lambda source: f"# converted {source.name}\n"):
    """A stand-in for the isolated converter: writes Markdown, or raises what the text says."""

    def convert(source: Path, destination: Path, **_: object) -> None:
        text = text_for(source)
        if isinstance(text, Exception):
            raise text
        destination.write_text(text, encoding="utf-8")

    return convert


@pytest.fixture
def service(base_dir: Path, database_url: str):
    """An upload service on each engine in turn (SQLite, PostgreSQL)."""
    engine = open_database(base_dir, database_url)
    yield make_upload_service(base_dir, engine=engine)
    engine.dispose()


def jobs_with(service, converter, **settings) -> ConversionJobs:
    return ConversionJobs(
        service, ConversionSettings(**{"wait_seconds": 5, **settings}), converter=converter
    )


def save(service, *files: tuple[bytes, str]):
    return service.save_uploads(
        ThreadRef.single_user("T"), [IncomingFile(name, io.BytesIO(body)) for body, name in files]
    )


def test_explicit_conversion_records_the_companion(service, base_dir: Path) -> None:
    save(service, (b"%PDF-1.4", "report.pdf"))
    status = jobs_with(service, fake_converter()).convert(ThreadRef.single_user("T"), "report.pdf")
    assert status.finished and status.error is None
    assert status.record.conversion_state is ConversionState.DONE
    assert status.companion.filename == "report.md"
    assert status.companion.converted_from == "report.pdf"
    assert (
        uploads_dir(base_dir, "T", None) / "report.md"
    ).read_text() == "# converted report.pdf\n"


def test_a_users_md_is_never_overwritten(service, base_dir: Path) -> None:
    save(service, (b"USER_MARKDOWN", "notes.md"), (b"PK\x03\x04", "notes.docx"))
    status = jobs_with(service, fake_converter()).convert(ThreadRef.single_user("T"), "notes.docx")
    assert status.companion.filename == "notes_1.md"
    assert (uploads_dir(base_dir, "T", None) / "notes.md").read_bytes() == b"USER_MARKDOWN"


def test_reconversion_replaces_its_own_companion(service, base_dir: Path) -> None:
    save(service, (b"%PDF", "a.pdf"))
    texts = iter(["# first\n", "# second\n"])
    jobs = jobs_with(service, fake_converter(lambda _: next(texts)))
    jobs.convert(ThreadRef.single_user("T"), "a.pdf")
    status = jobs.convert(ThreadRef.single_user("T"), "a.pdf")
    assert status.companion.filename == "a.md"
    assert (uploads_dir(base_dir, "T", None) / "a.md").read_text() == "# second\n"
    assert [r.filename for r in service.list_uploads(ThreadRef.single_user("T"))] == [
        "a.md",
        "a.pdf",
    ]


def test_same_stem_documents_get_their_own_companions(service, base_dir: Path) -> None:
    result = save(service, (b"PK", "a.docx"), (b"%PDF", "a.pdf"), (b"x", "a.txt"))
    jobs = jobs_with(service, fake_converter(), auto_convert_documents=True)
    companions = jobs.convert_after_upload(ThreadRef.single_user("T"), result)
    assert sorted(companions) == ["a.docx", "a.pdf"]
    assert companions["a.docx"].filename == "a.md"
    assert companions["a.pdf"].filename == "a_1.md"
    folder = uploads_dir(base_dir, "T", None)
    assert (folder / "a.md").read_text() == "# converted a.docx\n"
    assert (folder / "a_1.md").read_text() == "# converted a.pdf\n"


def test_delete_removes_exactly_the_recorded_companion(service, base_dir: Path) -> None:
    save(service, (b"USER", "a.md"), (b"%PDF", "a.pdf"))
    jobs_with(service, fake_converter()).convert(ThreadRef.single_user("T"), "a.pdf")
    assert service.delete_upload(ThreadRef.single_user("T"), "a.pdf") == ["a.pdf", "a_1.md"]
    assert [r.filename for r in service.list_uploads(ThreadRef.single_user("T"))] == ["a.md"]


def test_rename_moves_the_companion_link(service) -> None:
    save(service, (b"%PDF", "a.pdf"))
    jobs_with(service, fake_converter()).convert(ThreadRef.single_user("T"), "a.pdf")
    service.rename_upload(ThreadRef.single_user("T"), "a.pdf", "b.pdf")
    assert {
        r.filename: r.converted_from for r in service.list_uploads(ThreadRef.single_user("T"))
    } == {
        "a.md": "b.pdf",
        "b.pdf": None,
    }
    assert service.delete_upload(ThreadRef.single_user("T"), "b.pdf") == ["b.pdf", "a.md"]


def test_failure_is_recorded_and_keeps_the_original(service, base_dir: Path) -> None:
    save(service, (b"%PDF-broken", "bad.pdf"))
    jobs = jobs_with(service, fake_converter(lambda _: ConversionError("bad.pdf is corrupt")))
    status = jobs.convert(ThreadRef.single_user("T"), "bad.pdf")
    assert status.finished
    assert str(status.error) == "bad.pdf is corrupt"
    assert status.record.conversion_state is ConversionState.FAILED
    assert status.record.conversion_error == "bad.pdf is corrupt"
    assert status.companion is None
    assert sorted(p.name for p in uploads_dir(base_dir, "T", None).iterdir()) == ["bad.pdf"]


def test_slow_job_answers_queued_then_finishes(service) -> None:
    release = threading.Event()

    def slow(source: Path, destination: Path, **_: object) -> None:
        release.wait(10)
        destination.write_text("# late\n")

    jobs = jobs_with(service, slow, wait_seconds=0.1)
    save(service, (b"%PDF", "big.pdf"))
    status = jobs.convert(ThreadRef.single_user("T"), "big.pdf")
    assert not status.finished
    assert status.record.conversion_state in (ConversionState.QUEUED, ConversionState.CONVERTING)
    release.set()
    wait_until(lambda: jobs.status(ThreadRef.single_user("T"), "big.pdf").finished)
    assert jobs.status(ThreadRef.single_user("T"), "big.pdf").companion.filename == "big.md"


def test_nothing_is_converted_at_upload_unless_configured(service) -> None:
    result = save(service, (b"%PDF", "a.pdf"))
    calls = []
    jobs = jobs_with(service, lambda *args, **kwargs: calls.append(args))
    assert jobs.convert_after_upload(ThreadRef.single_user("T"), result) == {}
    assert calls == []


def test_not_convertible(service) -> None:
    save(service, (b"a,b", "data.csv"))
    with pytest.raises(NotConvertible):
        jobs_with(service, fake_converter()).convert(ThreadRef.single_user("T"), "data.csv")


def test_jobs_cut_off_by_a_restart_are_run_again(service) -> None:
    save(service, (b"%PDF", "a.pdf"), (b"%PDF", "b.pdf"))
    scope = service.paths.scope(ThreadRef.single_user("T"))
    lease = time.time() + 60
    service.records.set_conversion(
        scope, "a.pdf", ConversionState.CONVERTING, None, "another-host:1", lease
    )
    service.records.set_conversion(
        scope, "b.pdf", ConversionState.QUEUED, None, f"{socket.gethostname()}:999999999", lease
    )
    jobs = jobs_with(service, fake_converter())
    assert jobs.reclaim_interrupted_jobs() == 1  # the dead local process's job, at once
    wait_until(
        lambda: (
            service.get_upload(ThreadRef.single_user("T"), "b.pdf").conversion_state
            is ConversionState.DONE
        )
    )
    assert (service.uploads_dir(ThreadRef.single_user("T")) / "b.md").exists()
    # Another machine's job keeps its live lease: nobody else runs it.
    assert (
        service.get_upload(ThreadRef.single_user("T"), "a.pdf").conversion_state
        is ConversionState.CONVERTING
    )
    assert service.records.conversion_owner(scope, "a.pdf") == "another-host:1"


def test_a_job_whose_lease_ran_out_is_claimed_by_another_instance(service) -> None:
    save(service, (b"%PDF", "a.pdf"), (b"%PDF", "b.pdf"))
    scope = service.paths.scope(ThreadRef.single_user("T"))
    past, future = time.time() - 1, time.time() + 60
    service.records.set_conversion(scope, "a.pdf", ConversionState.CONVERTING, None, "dead:1", past)
    service.records.set_conversion(scope, "b.pdf", ConversionState.QUEUED, None, "alive:1", future)
    jobs = jobs_with(service, fake_converter())
    assert jobs.keep_once() == [(scope, "a.pdf")]  # the live lease is left alone
    wait_until(
        lambda: (
            service.get_upload(ThreadRef.single_user("T"), "a.pdf").conversion_state
            is ConversionState.DONE
        )
    )
    assert (
        service.get_upload(ThreadRef.single_user("T"), "b.pdf").conversion_state
        is ConversionState.QUEUED
    )
    assert service.records.conversion_owner(scope, "b.pdf") == "alive:1"
    assert jobs.keep_once() == []


def test_the_keeper_renews_the_leases_of_its_jobs(service) -> None:
    save(service, (b"%PDF", "a.pdf"))
    scope = service.paths.scope(ThreadRef.single_user("T"))
    release = threading.Event()

    def slow(source: Path, destination: Path, **_: object) -> None:
        release.wait(10)
        destination.write_text("# done\n")

    jobs = jobs_with(service, slow, lease_seconds=2.0, lease_renew_seconds=0.1)
    try:
        assert not jobs.convert(ThreadRef.single_user("T"), "a.pdf", wait=0).finished
        first = service.records.conversion_job(scope, "a.pdf").lease_until
        wait_until(lambda: service.records.conversion_job(scope, "a.pdf").lease_until > first)
        job = service.records.conversion_job(scope, "a.pdf")
        assert job.owner == jobs.owner and job.live(time.time())
    finally:
        release.set()
        jobs.stop_keeper()
    assert jobs.convert(ThreadRef.single_user("T"), "a.pdf", wait=5).finished


def test_convert_follows_another_instances_job_then_takes_it_over_when_its_lease_ends(
    service,
) -> None:
    save(service, (b"%PDF", "a.pdf"))
    scope = service.paths.scope(ThreadRef.single_user("T"))
    service.records.set_conversion(
        scope, "a.pdf", ConversionState.CONVERTING, None, "other:1", time.time() + 0.6
    )
    jobs = jobs_with(service, fake_converter())
    status = jobs.convert(
        ThreadRef.single_user("T"), "a.pdf", wait=0.2
    )  # the other instance holds the lease
    assert not status.finished and jobs.started_jobs == 0
    status = jobs.convert(
        ThreadRef.single_user("T"), "a.pdf", wait=5
    )  # its lease runs out during the wait
    assert status.finished and status.companion is not None
    assert jobs.started_jobs == 1


def test_instances_sweeping_together_claim_each_orphan_once(service) -> None:
    names = [f"d{n}.pdf" for n in range(9)]
    save(service, *[(b"%PDF", name) for name in names])
    scope = service.paths.scope(ThreadRef.single_user("T"))
    for name in names:
        service.records.set_conversion(scope, name, ConversionState.QUEUED, None, "dead:1", 0.0)
    claims: dict[str, list[tuple[str, str]]] = {}
    start = threading.Barrier(3)

    def sweep(owner: str) -> None:
        start.wait()
        mine = []
        for _ in range(4):
            mine += service.records.claim_expired_conversions(owner, time.time(), 1e12, 2)
        claims[owner] = mine

    workers = [threading.Thread(target=sweep, args=(f"i{n}:1",)) for n in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    claimed = [name for owner_claims in claims.values() for _, name in owner_claims]
    assert sorted(claimed) == sorted(names)  # every orphan once, none twice
    for owner, owner_claims in claims.items():
        for _, name in owner_claims:
            assert service.records.conversion_owner(scope, name) == owner


def test_result_of_a_file_replaced_meanwhile_is_dropped(service, base_dir: Path) -> None:
    def replace_then_convert(source: Path, destination: Path, **_: object) -> None:
        save(service, (b"%PDF new content", "a.pdf"))
        destination.write_text("# stale\n")

    save(service, (b"%PDF old", "a.pdf"))
    jobs_with(service, replace_then_convert).convert(ThreadRef.single_user("T"), "a.pdf")
    assert sorted(p.name for p in uploads_dir(base_dir, "T", None).iterdir()) == ["a.pdf"]


def test_a_job_this_process_does_not_run_is_not_renewed_but_run_again(service) -> None:
    """A row naming this process as owner, with nothing running here (its end was lost):
    the keeper does not keep it alive, it claims the lapsed job and runs it to the end."""
    save(service, (b"%PDF", "a.pdf"))
    scope = service.paths.scope(ThreadRef.single_user("T"))
    jobs = jobs_with(service, fake_converter())
    lapsed = time.time() - 1
    service.records.set_conversion(
        scope, "a.pdf", ConversionState.CONVERTING, None, jobs.owner, lapsed
    )
    assert jobs.keep_once() == [(scope, "a.pdf")]
    wait_until(
        lambda: (
            service.get_upload(ThreadRef.single_user("T"), "a.pdf").conversion_state
            is ConversionState.DONE
        )
    )
    wait_until(lambda: jobs.held_jobs() == [])  # released once its end is written


@pytest.mark.parametrize("ending", [ConversionState.DONE, ConversionState.FAILED])
def test_a_job_ending_during_a_postgresql_crash_still_ends(
    base_dir: Path, own_postgres, own_postgres_url: str, ending: ConversionState
) -> None:
    """PostgreSQL stops (`-m immediate`) the moment the converter finishes, so the job's
    final write meets the outage; the server is back well within the lease. The record
    ends done or failed, never stays "converting" under a lease renewed for nothing."""
    engine = open_database(base_dir, own_postgres_url)
    service = make_upload_service(base_dir, engine=engine)
    save(service, (b"%PDF-1.4", "a.pdf"))
    scope = service.paths.scope(ThreadRef.single_user("T"))
    crashed = threading.Event()
    answered = threading.Event()  # the convert request has read its status

    def converter(source: Path, destination: Path, **_: object) -> None:
        destination.write_text("# made during the outage\n", encoding="utf-8")
        # The outage is the final write's, not the request's: on a busy machine this
        # thread could otherwise crash the server before `convert` read its answer.
        assert answered.wait(60), "convert never answered"
        own_postgres.crash_server()
        crashed.set()
        if ending is ConversionState.FAILED:
            raise ConversionError("a.pdf is corrupt")

    jobs = jobs_with(service, converter, lease_seconds=30, lease_renew_seconds=0.2)
    try:
        jobs.convert(ThreadRef.single_user("T"), "a.pdf", wait=0)
        answered.set()
        assert crashed.wait(60), "the converter never ran"
        time.sleep(2)  # the outage itself: a few renewals and final writes fail meanwhile
    finally:
        own_postgres.start_server()
    job = wait_until(
        lambda: (j := service.records.conversion_job(scope, "a.pdf")).state is ending and j,
        timeout=30,
    )
    assert job.owner is None and job.lease_until is None
    wait_until(lambda: jobs.held_jobs() == [])  # released once its end is written
    record = service.get_upload(ThreadRef.single_user("T"), "a.pdf")
    if ending is ConversionState.FAILED:
        assert record.conversion_error == "a.pdf is corrupt"
        assert sorted(
            p.name for p in service.uploads_dir(ThreadRef.single_user("T")).iterdir()
        ) == ["a.pdf"]
    else:
        companion = service.get_upload(ThreadRef.single_user("T"), "a.md")
        assert companion.converted_from == "a.pdf"
        assert (
            service.uploads_dir(ThreadRef.single_user("T")) / "a.md"
        ).read_text() == "# made during the outage\n"
        assert sorted(
            p.name for p in service.uploads_dir(ThreadRef.single_user("T")).iterdir()
        ) == ["a.md", "a.pdf"]
    jobs.stop_keeper()
    engine.dispose()


# --- HTTP surface, with the real isolated converter on generated documents -------------------


# A real conversion takes seconds, more on a busy machine: the API tests wait long enough
# for the 200/422 answer instead of racing the default wait into a 202.
PATIENT = {"conversion_wait_seconds": 120}


def test_convert_endpoint_with_a_real_docx(make_app, tmp_path: Path) -> None:
    client = make_app(uploads=PATIENT).test_client()
    uploads = UploadActions(client)
    docx = make_docx(tmp_path / "q.docx", title="Quarterly Report")
    uploads.upload("T", (docx.read_bytes(), "q.docx"))
    response = client.post("/api/threads/T/uploads/q.docx/convert")
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["markdown_file"] == "q.md"
    assert body["markdown_virtual_path"] == "/mnt/user-data/uploads/q.md"
    assert body["markdown_artifact_url"].endswith("/uploads/q.md")
    assert body["conversion_state"] == "done"
    listed = {f["filename"]: f for f in uploads.list("T")["files"]}
    assert listed["q.md"]["converted_from"] == "q.docx"
    assert listed["q.docx"]["markdown_file"] == "q.md"
    markdown = client.get(body["markdown_artifact_url"])
    assert "# Quarterly Report" in markdown.get_data(as_text=True)
    markdown.close()


def test_convert_endpoint_errors(make_app, tmp_path: Path) -> None:
    client = make_app(uploads=PATIENT).test_client()
    uploads = UploadActions(client)
    uploads.upload(
        "T",
        (b"a,b\n1,2\n", "data.csv"),
        (make_encrypted_pdf(tmp_path / "locked.pdf").read_bytes(), "locked.pdf"),
    )
    assert client.post("/api/threads/T/uploads/data.csv/convert").status_code == 400
    assert client.post("/api/threads/T/uploads/nope.pdf/convert").status_code == 404
    locked = client.post("/api/threads/T/uploads/locked.pdf/convert")
    assert locked.status_code == 422
    assert "password" in locked.get_json()["detail"].lower()
    assert uploads.names("T") == ["data.csv", "locked.pdf"]
    failed = {f["filename"]: f for f in uploads.list("T")["files"]}["locked.pdf"]
    assert failed["conversion_state"] == "failed" and failed["conversion_error"]


def test_timeout_answers_504(uploads: UploadActions, client, app) -> None:
    def too_slow(source: Path, destination: Path, **_: object) -> None:
        raise ConversionTimedOut(f"Conversion of {source.name} stopped after 1 s (time limit)")

    app.extensions["deerflow_web"].conversions.converter = too_slow
    uploads.upload("T", (b"%PDF", "slow.pdf"))
    response = client.post("/api/threads/T/uploads/slow.pdf/convert")
    assert response.status_code == 504
    assert "time limit" in response.get_json()["detail"]


def test_no_conversion_at_upload_by_default(
    uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    docx = make_docx(tmp_path / "r.docx")
    entry = uploads.upload("T", (docx.read_bytes(), "r.docx")).get_json()["files"][0]
    assert entry["markdown_file"] is None
    assert sorted(p.name for p in uploads_dir(base_dir, "T").iterdir()) == ["r.docx"]


def test_automatic_conversion_when_configured(make_app, base_dir: Path, tmp_path: Path) -> None:
    client = make_app(uploads={"auto_convert_documents": True, **PATIENT}).test_client()
    docx = make_docx(tmp_path / "r.docx", title="Board Minutes")
    body = UploadActions(client).upload("T", (b"USER", "r.md"), (docx.read_bytes(), "r.docx"))
    entries = body.get_json()["files"]
    assert entries[0]["markdown_file"] is None
    assert entries[1]["markdown_file"] == "r_1.md"
    assert entries[1]["markdown_path"].endswith("/uploads/r_1.md")
    assert "Board Minutes" in (uploads_dir(base_dir, "T") / "r_1.md").read_text()
    assert (uploads_dir(base_dir, "T") / "r.md").read_bytes() == b"USER"


def test_a_job_that_finishes_before_it_is_registered_does_not_hang(service) -> None:
    """The done-callback of an already finished job runs at once, in the caller's thread."""
    save(service, (b"%PDF", "fast.pdf"))
    jobs = jobs_with(service, fake_converter())
    real_submit = None

    def submit_and_finish(fn, *args):
        future = real_submit(fn, *args)
        future.result()  # finished before `_start` registers its callback
        return future

    jobs.convert(ThreadRef.single_user("T"), "fast.pdf")  # creates the pool
    real_submit = jobs._pool.submit
    jobs._pool.submit = submit_and_finish
    outcome: list[object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(jobs.convert(ThreadRef.single_user("T"), "fast.pdf")),
        daemon=True,
    )
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "convert() deadlocked"
    assert outcome[0].finished


@pytest.mark.parametrize(
    "form_url", ["/threads/T/upload", "/threads/T/chat/upload"], ids=["file-manager", "chat"]
)
def test_automatic_conversion_applies_to_the_page_forms(
    make_app, base_dir: Path, tmp_path: Path, form_url: str
) -> None:
    """The forms hand their files to the same intake as the API, conversion included."""
    client = make_app(uploads={"auto_convert_documents": True, **PATIENT}).test_client()
    docx = make_docx(tmp_path / "minutes.docx", title="Board Minutes")
    response = client.post(
        form_url,
        data={"on_conflict": "replace", "files": (io.BytesIO(docx.read_bytes()), "minutes.docx")},
        content_type="multipart/form-data",
    )
    assert response.status_code == 302
    folder = uploads_dir(base_dir, "T")
    listing = UploadActions(client)
    wait_until(lambda: listing.list("T")["files"][0]["conversion_state"] == "done", timeout=60)
    assert sorted(p.name for p in folder.iterdir()) == ["minutes.docx", "minutes.md"]
    assert "Board Minutes" in (folder / "minutes.md").read_text(encoding="utf-8")
    listed = {f["filename"]: f for f in listing.list("T")["files"]}
    assert listed["minutes.docx"]["markdown_file"] == "minutes.md"
    assert listed["minutes.docx"]["conversion_state"] == "done"


def test_page_form_uploads_are_not_converted_by_default(
    client, base_dir: Path, tmp_path: Path
) -> None:
    docx = make_docx(tmp_path / "minutes.docx")
    response = client.post(
        "/threads/T/upload",
        data={"files": (io.BytesIO(docx.read_bytes()), "minutes.docx")},
        content_type="multipart/form-data",
    )
    assert response.status_code == 302
    assert [p.name for p in uploads_dir(base_dir, "T").iterdir()] == ["minutes.docx"]
