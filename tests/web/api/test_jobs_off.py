"""A web instance with `jobs.run_in_web: false`: the API answers as always, the jobs are
only recorded for the workers, and `/readyz` says the jobs are off here."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import UploadActions
from tests.helpers import uploads_dir
from tests.support.documents import make_docx

QUICK = {"conversion_wait_seconds": 0.3}
OFF = {"run_in_web": False}


def listed(uploads: UploadActions, thread_id: str) -> dict[str, dict]:
    return {f["filename"]: f for f in uploads.list(thread_id)["files"]}


def test_convert_answers_queued_and_converts_nothing(make_app, base_dir: Path, tmp_path) -> None:
    client = make_app(uploads=QUICK, jobs=OFF).test_client()
    uploads = UploadActions(client)
    docx = make_docx(tmp_path / "q.docx")
    uploads.upload("T", (docx.read_bytes(), "q.docx"))
    response = client.post("/api/threads/T/uploads/q.docx/convert")
    assert response.status_code == 202, response.get_json()
    assert response.get_json()["conversion_state"] == "queued"
    assert response.get_json()["markdown_file"] is None
    again = client.post("/api/threads/T/uploads/q.docx/convert")  # still queued: followed
    assert (again.status_code, again.get_json()["conversion_state"]) == (202, "queued")
    services = client.application.extensions[EXTENSION_KEY]
    assert services.conversions.started_jobs == 0 and services.conversions.held_jobs() == []
    assert sorted(p.name for p in uploads_dir(base_dir, "T").iterdir()) == ["q.docx"]
    assert listed(uploads, "T")["q.docx"]["conversion_state"] == "queued"


def test_an_upload_with_auto_conversion_is_answered_and_queued(make_app, tmp_path) -> None:
    client = make_app(uploads={**QUICK, "auto_convert_documents": True}, jobs=OFF).test_client()
    uploads = UploadActions(client)
    docx = make_docx(tmp_path / "r.docx")
    response = uploads.upload("T", (docx.read_bytes(), "r.docx"))
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["files"][0]["markdown_file"] is None
    assert listed(uploads, "T")["r.docx"]["conversion_state"] == "queued"


def test_convert_still_refuses_what_it_refused(make_app) -> None:
    client = make_app(uploads=QUICK, jobs=OFF).test_client()
    UploadActions(client).upload("T", (b"a,b\n", "data.csv"))
    refused = client.post("/api/threads/T/uploads/data.csv/convert")
    assert refused.status_code == 400 and refused.get_json()["detail"]
    missing = client.post("/api/threads/T/uploads/none.pdf/convert")
    assert missing.status_code == 404 and missing.get_json()["detail"]


def test_readyz_says_whether_this_instance_runs_the_jobs(make_app) -> None:
    assert make_app().test_client().get("/readyz").get_json()["jobs"] == "on"
    off = make_app(jobs=OFF).test_client().get("/readyz")
    assert off.status_code == 200 and off.get_json()["jobs"] == "off"
    assert off.get_json()["status"] == "ok"  # reported, never a reason to leave rotation


def test_the_environment_turns_the_jobs_off(make_app, monkeypatch) -> None:
    monkeypatch.setenv("DEER_FLOW_JOBS_RUN_IN_WEB", "0")
    assert make_app().test_client().get("/readyz").get_json()["jobs"] == "off"


@pytest.mark.parametrize(("jobs", "started"), [(None, True), (OFF, False)])
def test_rescans_and_sweeps_start_only_where_jobs_run(
    make_app, tmp_path: Path, jobs, started: bool
) -> None:
    app = make_app(
        jobs=jobs,
        retention={"thread_days": 30},
        scanning={"clamd": str(tmp_path / "clamd.sock"), "rescan_interval_seconds": 3600},
    )
    services = app.extensions[EXTENSION_KEY]
    assert services.rescans is not None
    assert services.rescans.is_running is started
    assert services.retention.is_running is started
    described = services.jobs.describe()
    assert "rescans every 3600 s" in described and "retention sweeps every 60 min" in described
    services.conversions.start_keeper()  # what app.py does in a server
    assert (services.conversions._keeper is not None) is started
