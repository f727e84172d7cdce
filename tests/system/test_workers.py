"""Workers apart from web instances, as real processes (issue 29, item 6): a gunicorn web
instance with `jobs.run_in_web: false` and `flask --app app worker` processes, on one
PostgreSQL and one data dir, as a web machine and worker machines would run.

The web instance only records a conversion; a worker runs it, and the web instance lists
and serves the companion. Without a worker the job waits as `queued`, never `failed`, for a
worker started later; a worker SIGKILLed mid-conversion takes its converter along and
leaves a job that a second worker finishes once its lease ran out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from deerflow_web.services.conversion.runner import process_start_time
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import provision_server_user
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.documents import make_docx
from tests.support.live_server import LiveServer
from tests.support.live_worker import LiveWorker
from tests.support.live_worker import converters_in

# Real processes, signed in with the test user's token: the mode changes only the gate,
# which tests/web covers in both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes

AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
LEASE_SECONDS = 3  # short, so a killed worker's job is claimed again soon
CONVERT_SECONDS = 120.0  # a small .docx on a loaded machine, the lease included


@dataclass
class Deployment:
    """One web instance with jobs off, and what a worker of it needs."""

    web: LiveServer
    base_dir: Path
    config: Path
    database_url: str
    tmp_path: Path

    def worker(self, name: str, **options: object) -> LiveWorker:
        return LiveWorker(
            self.base_dir,
            self.tmp_path / f"worker-{name}.log",
            config=self.config,
            database_url=self.database_url,
            **options,  # type: ignore[arg-type]
        )

    def upload(self, name: str, data: bytes) -> None:
        response = requests.post(
            f"{self.web.url}/api/threads/W/uploads",
            files={"files": (name, data)},
            headers=AUTH,
            timeout=60,
        )
        assert response.status_code == 200, response.text

    def convert(self, name: str) -> requests.Response:
        return requests.post(
            f"{self.web.url}/api/threads/W/uploads/{name}/convert", headers=AUTH, timeout=60
        )

    def listing(self) -> dict[str, dict]:
        response = requests.get(
            f"{self.web.url}/api/threads/W/uploads/list", headers=AUTH, timeout=30
        )
        assert response.status_code == 200, response.text
        return {f["filename"]: f for f in response.json()["files"]}

    def state(self, name: str) -> str:
        state = self.listing()[name]["conversion_state"]
        assert state != "failed", self.listing()[name]
        return state

    def artifact(self, name: str) -> requests.Response:
        return requests.get(
            f"{self.web.url}/api/threads/W/artifacts/mnt/user-data/uploads/{name}",
            headers=AUTH,
            timeout=30,
        )

    def assert_converted(self, original: str, companion: str, title: str) -> None:
        wait_until(lambda: self.state(original) == "done", timeout=CONVERT_SECONDS, interval=0.2)
        files = self.listing()
        assert files[original]["markdown_file"] == companion
        assert files[companion]["converted_from"] == original
        markdown = self.artifact(companion)
        assert markdown.status_code == 200
        assert f"# {title}" in markdown.text
        assert "Revenue grew in every region." in markdown.text
        on_disk = uploads_dir(self.base_dir, "W") / companion
        assert on_disk.read_text(encoding="utf-8") == markdown.text


@pytest.fixture
def deployment(base_dir: Path, tmp_path: Path, postgres_url: str) -> Iterator[Deployment]:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "uploads": {"conversion_wait_seconds": 0.2},
                "conversion": {"lease_seconds": LEASE_SECONDS, "lease_renew_seconds": 1},
                "jobs": {"run_in_web": False, "poll_seconds": 0.2, "stop_grace_seconds": 5},
            }
        )
    )
    provision_server_user(base_dir, database_url=postgres_url)
    web = LiveServer(base_dir, config=config, database_url=postgres_url, log=tmp_path / "web.log")
    web.start()
    try:
        yield Deployment(web, base_dir, config, postgres_url, tmp_path)
    finally:
        web.kill()


def test_a_worker_converts_what_the_web_instance_queued(deployment: Deployment, tmp_path) -> None:
    ready = requests.get(f"{deployment.web.url}/readyz", timeout=10).json()
    assert (ready["status"], ready["jobs"]) == ("ok", "off")
    worker = deployment.worker("a").start()
    try:
        docx = make_docx(tmp_path / "report.docx", title="Worker Report")
        deployment.upload("report.docx", docx.read_bytes())
        answer = deployment.convert("report.docx")
        assert answer.status_code in (200, 202), answer.text
        deployment.assert_converted("report.docx", "report.md", "Worker Report")
        assert worker.stop() == 0
    finally:
        worker.kill()
    log = worker.log.read_text(errors="replace")
    assert "claimed conversion of report.docx" in log and "converted report.docx" in log
    assert "worker stopped" in log


def test_with_no_worker_the_job_waits_queued_for_one(deployment: Deployment, tmp_path) -> None:
    docx = make_docx(tmp_path / "later.docx", title="Later Report")
    deployment.upload("later.docx", docx.read_bytes())
    answer = deployment.convert("later.docx")
    assert (answer.status_code, answer.json()["conversion_state"]) == (202, "queued")
    time.sleep(LEASE_SECONDS + 1)  # longer than any lease: nothing fails it or takes it
    assert deployment.state("later.docx") == "queued"
    assert sorted(deployment.listing()) == ["later.docx"]
    worker = deployment.worker("late").start()
    try:
        deployment.assert_converted("later.docx", "later.md", "Later Report")
    finally:
        assert worker.stop() == 0


def stalled_worker(deployment: Deployment, tmp_path: Path) -> tuple[LiveWorker, Path]:
    """A started worker whose converter never finishes, and its TMPDIR, where that
    converter works."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    worker = deployment.worker(
        "stalled", app="tests.support.stalled_converter_app", env={"TMPDIR": str(temp)}
    )
    return worker.start(), temp


def stalled_conversion(
    deployment: Deployment, tmp_path: Path, temp: Path, stem: str, title: str
) -> int:
    """Upload `{stem}.docx` and ask to convert it; once the stalled worker's converter is
    running it, return that converter's pid."""
    docx = make_docx(tmp_path / f"{stem}.docx", title=title)
    deployment.upload(f"{stem}.docx", docx.read_bytes())
    assert deployment.convert(f"{stem}.docx").status_code == 202
    wait_until(lambda: deployment.state(f"{stem}.docx") == "converting", timeout=60)
    [converter] = wait_until(lambda: list(converters_in(temp)), timeout=60)
    return converter


def test_a_worker_killed_mid_conversion_leaves_the_job_to_another(
    deployment: Deployment, tmp_path: Path
) -> None:
    stalled, temp = stalled_worker(deployment, tmp_path)
    second = deployment.worker("second")
    try:
        converter = stalled_conversion(deployment, tmp_path, temp, "cut", "Cut Report")
        # Running already, as on another machine: it takes the job only once the lease of
        # the killed worker has run out (a worker starting on the same host would take a
        # dead local process's job at once).
        second.start()
        stalled.kill()
        wait_until(lambda: process_start_time(converter) is None, timeout=10)
        assert sorted(deployment.listing()) == ["cut.docx"]  # nothing half-made listed
        deployment.assert_converted("cut.docx", "cut.md", "Cut Report")
        assert second.stop() == 0
    finally:
        stalled.kill()
        second.kill()
    assert "claimed conversion of cut.docx" in second.log.read_text(errors="replace")


def test_a_worker_stopped_mid_conversion_releases_the_job(
    deployment: Deployment, tmp_path: Path
) -> None:
    """SIGTERM while a conversion runs past the stop grace: the worker exits 0, its
    converter goes with it, and the job is released, so another worker takes it at once."""
    stalled, temp = stalled_worker(deployment, tmp_path)
    second = deployment.worker("second")
    try:
        converter = stalled_conversion(deployment, tmp_path, temp, "held", "Held Report")
        assert stalled.stop() == 0  # after `jobs.stop_grace_seconds`
        wait_until(lambda: process_start_time(converter) is None, timeout=10)
        assert deployment.state("held.docx") == "queued"  # handed back, not failed
        second.start()
        deployment.assert_converted("held.docx", "held.md", "Held Report")
        assert second.stop() == 0
    finally:
        stalled.kill()
        second.kill()
    log = stalled.log.read_text(errors="replace")
    assert "1 conversion(s) left to other workers" in log, log
