"""`flask --app app worker` as a real process: it exists, starts, runs a job that a web
instance with `jobs.run_in_web: false` queued, and stops cleanly on SIGTERM or SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import UploadActions
from tests.helpers import wait_until
from tests.support.documents import make_docx

ROOT = Path(__file__).resolve().parents[2]
JOBS_OFF = {"run_in_web": False, "poll_seconds": 0.2}


def start_worker(base_dir: Path, config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "DEER_FLOW_HOME": str(base_dir), "DEER_FLOW_CONFIG_PATH": str(config)}
    with open(log, "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "app", "worker"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def listed(uploads: UploadActions, name: str) -> dict:
    return {f["filename"]: f for f in uploads.list("T")["files"]}[name]


def test_the_command_is_there(app) -> None:
    result = app.test_cli_runner().invoke(args=["worker", "--help"])
    assert result.exit_code == 0
    assert "no HTTP server" in result.output


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_runs_a_queued_conversion_and_stops_on_a_signal(
    make_app, base_dir: Path, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    client = make_app(uploads={"conversion_wait_seconds": 0.2}, jobs=JOBS_OFF).test_client()
    uploads = UploadActions(client)
    docx = make_docx(tmp_path / "q.docx", title="Worker Report")
    uploads.upload("T", (docx.read_bytes(), "q.docx"))
    answer = client.post("/api/threads/T/uploads/q.docx/convert")
    assert (answer.status_code, answer.get_json()["conversion_state"]) == (202, "queued")

    log = tmp_path / "worker.log"
    worker = start_worker(base_dir, tmp_path / "config.yaml", log)
    try:
        wait_until(lambda: listed(uploads, "q.docx")["conversion_state"] == "done", timeout=120)
        assert listed(uploads, "q.docx")["markdown_file"] == "q.md"
        companion = client.get("/api/threads/T/artifacts/mnt/user-data/uploads/q.md")
        assert "# Worker Report" in companion.get_data(as_text=True)
        companion.close()
        worker.send_signal(stop_signal)
        assert worker.wait(60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    text = log.read_text(errors="replace")
    started = [line for line in text.splitlines() if "worker started" in line]
    assert len(started) == 1 and "runs conversions (2 converters)" in started[0], text
    stopped = [line for line in text.splitlines() if "worker stopped" in line]
    assert len(stopped) == 1 and stop_signal.name in stopped[0], text
    assert "Traceback" not in text, text
