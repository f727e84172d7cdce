"""The conversion queue is bounded: a full queue answers 429 with Retry-After, and the
limits come from `conversion.*` in the config."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deerflow_web.errors import ConversionQueueFull
from deerflow_web.errors import ConversionTimedOut
from deerflow_web.errors import ConversionUserLimit
from deerflow_web.models import ConversionState
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.settings import load_settings
from deerflow_web.web import create_app
from tests.helpers import needs_auth
from tests.helpers import prepare_test_app
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.documents import make_spinning_pdf


class BlockingConverter:
    """Holds every conversion until released, so jobs pile up in the queue."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, source: Path, destination: Path, **_: object) -> None:
        self.release.wait(30)
        destination.write_text(f"# {source.name}\n", encoding="utf-8")


def test_jobs_past_the_bound_are_refused_and_nothing_is_marked(base_dir: Path) -> None:
    service = make_upload_service(base_dir)
    names = ["a.pdf", "b.pdf", "c.pdf", "d.pdf"]
    service.save_uploads(
        ThreadRef.single_user("T"),
        [IncomingFile(n, io.BytesIO(b"%PDF-1.4 " + n.encode())) for n in names],
    )
    blocker = BlockingConverter()
    jobs = ConversionJobs(
        service, ConversionSettings(workers=1, max_queued=2, wait_seconds=0.01), converter=blocker
    )
    try:
        jobs.convert(ThreadRef.single_user("T"), "a.pdf", wait=0.2)  # running
        jobs.convert(ThreadRef.single_user("T"), "b.pdf", wait=0)  # queued
        jobs.convert(ThreadRef.single_user("T"), "c.pdf", wait=0)  # queued: the queue is full now
        assert jobs.queued == 2
        with pytest.raises(ConversionQueueFull) as caught:
            jobs.convert(ThreadRef.single_user("T"), "d.pdf", wait=0)
        assert caught.value.retry_after > 0
        assert "queue is full (2 waiting)" in str(caught.value)
        record = service.get_upload(ThreadRef.single_user("T"), "d.pdf")
        assert record.conversion_state is None  # the refused job left no trace
        jobs.convert(
            ThreadRef.single_user("T"), "b.pdf", wait=0
        )  # asking again for a queued file takes no slot
    finally:
        blocker.release.set()
    assert jobs.convert(ThreadRef.single_user("T"), "c.pdf", wait=10).finished
    assert (
        jobs.convert(ThreadRef.single_user("T"), "d.pdf", wait=10).companion is not None
    )  # room again


def _app(base_dir: Path, tmp_path: Path, config: dict[str, Any]) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    app = create_app(
        {
            "TESTING": True,
            "BASE_DIR": str(base_dir),
            "WTF_CSRF_ENABLED": False,
            "CONFIG_PATH": str(path),
        }
    )
    prepare_test_app(app)  # signed-in clients when accounts are on
    return app


def test_full_queue_answers_429_with_retry_after_and_a_flash(
    base_dir: Path, tmp_path: Path
) -> None:
    app = _app(
        base_dir,
        tmp_path,
        {
            "uploads": {"conversion_workers": 1, "conversion_wait_seconds": 0.05},
            "conversion": {"max_queued": 1},
        },
    )
    jobs = app.extensions["deerflow_web"].conversions
    blocker = BlockingConverter()
    jobs.converter = blocker
    client = app.test_client()
    files = [(io.BytesIO(b"%PDF-1.4 x" + bytes([i])), f"{n}.pdf") for i, n in enumerate("abc")]
    assert client.post("/api/threads/T/uploads", data={"files": files}).status_code == 200
    try:
        assert client.post("/api/threads/T/uploads/a.pdf/convert").status_code == 202
        assert client.post("/api/threads/T/uploads/b.pdf/convert").status_code == 202

        response = client.post("/api/threads/T/uploads/c.pdf/convert")
        assert response.status_code == 429
        assert int(response.headers["Retry-After"]) > 0
        assert "conversion queue is full" in response.get_json()["detail"]

        page = client.post("/threads/T/convert", data={"filename": "c.pdf"}, follow_redirects=True)
        assert page.status_code == 200
        assert "conversion queue is full" in page.get_data(as_text=True)
    finally:
        blocker.release.set()
    assert not (uploads_dir(base_dir, "T") / "c.md").exists()


def test_limits_are_read_from_the_conversion_section(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "uploads": {"max_file_size": 1000},
                "conversion": {
                    "max_output_bytes": 5000,
                    "max_queued": 3,
                    "lease_seconds": 8,
                    "lease_renew_seconds": 2,
                },
                "agent": {"read_conversion_wait_seconds": 7},
            }
        ),
        encoding="utf-8",
    )
    settings = load_settings(tmp_path / "data", config_path=path)
    assert settings.conversion.max_output_bytes == 5000
    assert settings.conversion.max_queued == 3
    assert (settings.conversion.lease_seconds, settings.conversion.lease_renew_seconds) == (8, 2)
    assert settings.agent.read_conversion_wait_seconds == 7


def test_a_lease_renewed_no_faster_than_it_runs_out_is_corrected(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    config = {"conversion": {"lease_seconds": 4, "lease_renew_seconds": 10}}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    settings = load_settings(tmp_path / "data", config_path=path)
    assert (settings.conversion.lease_seconds, settings.conversion.lease_renew_seconds) == (4, 1)


def test_output_cap_defaults_to_the_upload_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump({"uploads": {"max_file_size": 1234}, "conversion": {"max_queued": "x"}}),
        encoding="utf-8",
    )
    settings = load_settings(tmp_path / "data", config_path=path)
    assert settings.conversion.max_output_bytes == 1234
    assert settings.conversion.max_queued == ConversionSettings().max_queued  # bad: default
    assert settings.agent.read_conversion_wait_seconds == 20


# --- fair share between users, and the CPU limit ------------------------------------------


class GatedConverter:
    """Records the order conversions start in and holds each until the gate lets one go."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gate = threading.Semaphore(0)

    def __call__(self, source: Path, destination: Path, **_: object) -> None:
        self.started.append(source.name)
        self.gate.acquire(timeout=30)
        destination.write_text(f"# {source.name}\n", encoding="utf-8")


def _save_for(service: Any, user_id: str | None, *names: str) -> None:
    files = [IncomingFile(name, io.BytesIO(b"%PDF-1.4 " + name.encode())) for name in names]
    service.save_uploads(thread_ref("T", user_id), files)


def test_one_users_backlog_does_not_hold_back_another_users_first_job(base_dir: Path) -> None:
    service = make_upload_service(base_dir)
    alice = ["a1.pdf", "a2.pdf", "a3.pdf", "a4.pdf"]
    _save_for(service, "alice", *alice)
    _save_for(service, "bob", "b1.pdf")
    converter = GatedConverter()
    jobs = ConversionJobs(
        service, ConversionSettings(workers=1, max_per_user=10), converter=converter
    )
    try:
        for name in alice:
            jobs.convert(thread_ref("T", "alice"), name, wait=0)
        wait_until(lambda: converter.started == ["a1.pdf"])
        jobs.convert(thread_ref("T", "bob"), "b1.pdf", wait=0)  # queued after all of alice's
        converter.gate.release()  # a1 ends: the converter is free
        wait_until(lambda: len(converter.started) == 2)
        assert converter.started[1] == "b1.pdf"
    finally:
        for _ in range(5):
            converter.gate.release()
    wait_until(lambda: len(converter.started) == 5)
    assert converter.started[2:] == ["a2.pdf", "a3.pdf", "a4.pdf"]
    for name in alice:
        wait_until(lambda name=name: jobs.status(thread_ref("T", "alice"), name).finished)


def test_a_user_past_their_share_is_refused_and_others_are_not(base_dir: Path) -> None:
    service = make_upload_service(base_dir)
    _save_for(service, "alice", "a1.pdf", "a2.pdf", "a3.pdf")
    _save_for(service, "bob", "b1.pdf")
    _save_for(service, None, "s1.pdf", "s2.pdf", "s3.pdf")
    blocker = BlockingConverter()
    jobs = ConversionJobs(service, ConversionSettings(workers=1, max_per_user=2), converter=blocker)
    try:
        jobs.convert(thread_ref("T", "alice"), "a1.pdf", wait=0)
        jobs.convert(thread_ref("T", "alice"), "a2.pdf", wait=0)
        with pytest.raises(ConversionUserLimit) as caught:
            jobs.convert(thread_ref("T", "alice"), "a3.pdf", wait=0)
        assert caught.value.retry_after > 0
        assert "2 conversions queued or running" in str(caught.value)
        assert "conversion.max_per_user" in str(caught.value)
        assert service.get_upload(thread_ref("T", "alice"), "a3.pdf").conversion_state is None
        jobs.convert(thread_ref("T", "bob"), "b1.pdf", wait=0)  # another user still gets in
        for name in ("s1.pdf", "s2.pdf", "s3.pdf"):  # single-user mode: one user, no share
            jobs.convert(ThreadRef.single_user("T"), name, wait=0)
    finally:
        blocker.release.set()
    assert jobs.convert(thread_ref("T", "alice"), "a2.pdf", wait=10).finished
    assert jobs.convert(thread_ref("T", "alice"), "a3.pdf", wait=10).finished  # room again


@needs_auth
def test_a_user_past_their_share_gets_429_with_retry_after(base_dir: Path, tmp_path: Path) -> None:
    app = _app(
        base_dir,
        tmp_path,
        {
            "uploads": {"conversion_workers": 1, "conversion_wait_seconds": 0.05},
            "conversion": {"max_per_user": 1},
        },
    )
    blocker = BlockingConverter()
    app.extensions["deerflow_web"].conversions.converter = blocker
    client = app.test_client()
    files = [(io.BytesIO(b"%PDF-1.4 x" + bytes([i])), f"{n}.pdf") for i, n in enumerate("ab")]
    assert client.post("/api/threads/T/uploads", data={"files": files}).status_code == 200
    try:
        assert client.post("/api/threads/T/uploads/a.pdf/convert").status_code == 202
        response = client.post("/api/threads/T/uploads/b.pdf/convert")
        assert response.status_code == 429
        assert int(response.headers["Retry-After"]) > 0
        assert "the most one user may have" in response.get_json()["detail"]
    finally:
        blocker.release.set()


def test_a_document_that_spins_the_cpu_is_stopped_by_the_cpu_limit(
    base_dir: Path, tmp_path: Path
) -> None:
    """A few kilobytes of PDF that would keep the parser busy for minutes: stopped after
    3 s of CPU time, long before the wall-clock limit, with a reason in the record."""
    service = make_upload_service(base_dir)
    document = make_spinning_pdf(tmp_path / "spin.pdf", operations=2_000_000)
    service.save_uploads(
        ThreadRef.single_user("T"), [IncomingFile("spin.pdf", io.BytesIO(document.read_bytes()))]
    )
    jobs = ConversionJobs(
        service,
        ConversionSettings(cpu_limit_seconds=3, timeout_seconds=600, wait_seconds=300),
    )
    started = time.monotonic()
    status = jobs.convert(ThreadRef.single_user("T"), "spin.pdf")
    assert status.finished and isinstance(status.error, ConversionTimedOut)
    assert time.monotonic() - started < 300
    record = service.get_upload(ThreadRef.single_user("T"), "spin.pdf")
    assert record.conversion_state is ConversionState.FAILED
    assert "3 s of CPU time" in record.conversion_error
    assert "conversion.cpu_limit_seconds" in record.conversion_error
    assert sorted(p.name for p in uploads_dir(base_dir, "T", None).iterdir()) == ["spin.pdf"]


def test_the_cpu_limit_and_share_are_read_and_kept_below_the_wall_limit(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    config = {
        "uploads": {"conversion_timeout_seconds": 50},
        "conversion": {"cpu_limit_seconds": 80, "max_per_user": 3},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    settings = load_settings(tmp_path / "data", config_path=path)
    assert settings.conversion.cpu_limit_seconds == 50
    assert settings.conversion.max_per_user == 3
