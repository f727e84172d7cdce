"""The agent's document reads where the background jobs run on workers
(`jobs.run_in_web: false`): the tools built from the settings only queue a conversion and
poll the database for it; a worker converts, and the next read returns the text."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.agent import UploadTools
from deerflow_web.models import ConversionState
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from tests.helpers import wait_until
from tests.support.agent_helpers import make_runtime
from tests.support.agent_helpers import save_files
from tests.support.documents import make_pdf

# The tools run with a thread id and no user, as outside the app: the mode is not read.
pytestmark = pytest.mark.same_in_both_modes

UPLOADS = "/mnt/user-data/uploads"


def test_a_read_queues_the_document_for_a_worker_then_reads_its_text(
    base_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEER_FLOW_JOBS_RUN_IN_WEB", "false")
    service = make_upload_service(base_dir)
    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make_pdf(made / "letter.pdf", lines=("Hello worker world",)))
    tools = UploadTools(base_dir=base_dir, read_wait_seconds=0.2)
    read = tools.by_name()["read_file"]
    args = {"path": f"{UPLOADS}/letter.pdf", "runtime": make_runtime({"thread_id": "t1"})}

    assert "still converting" in read.invoke(args)
    jobs, _ = tools.documents.jobs()
    assert not jobs.runs_jobs and jobs.started_jobs == 0
    ref = ThreadRef.single_user("t1")
    job = service.records.conversion_job(service.paths.scope(ref), "letter.pdf")
    assert (job.state, job.owner) == (ConversionState.QUEUED, None)

    worker = ConversionJobs(service, ConversionSettings(timeout_seconds=120))
    worker.become_worker()
    try:
        assert worker.claim_waiting_jobs()
        wait_until(
            lambda: service.get_upload(ref, "letter.pdf").conversion_state is ConversionState.DONE,
            timeout=120,
        )
    finally:
        worker.stop_keeper()
    assert "Hello worker world" in read.invoke(args)
    assert jobs.started_jobs == 0  # read from the worker's companion
