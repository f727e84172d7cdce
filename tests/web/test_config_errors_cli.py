"""A configuration that cannot work, under Flask's own development server and the jobs
worker, as real processes: `flask --app app run` (and `worker`) print the same one line
gunicorn prints and exit non-zero, never a traceback, and start nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deerflow_web.storage.database import DATABASE_FILE

pytestmark = pytest.mark.same_in_both_modes  # nothing here reads the mode

ROOT = Path(__file__).resolve().parents[2]
CANNOT_START = "deerflow-web cannot start: "
START_SECONDS = 120  # importing the app on a busy machine; a server that starts fails


def run_flask(
    command: str, env: dict[str, str], app: str = "app"
) -> subprocess.CompletedProcess[str]:
    """`flask --app <app> <command>` from the checkout; a process still running after
    `START_SECONDS` started despite its configuration, and fails the test."""
    args = [sys.executable, "-m", "flask", "--app", app, command]
    if command == "run":
        args += ["--host", "127.0.0.1", "--port", "0"]
    try:
        return subprocess.run(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{command} started with a configuration that cannot work: {expired.output}")


def bad_configurations(tmp_path: Path) -> dict[str, tuple[dict[str, str], str]]:
    """name -> (environment, what the one line must say)."""
    base = tmp_path / "data"
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("storage: [unclosed\n  x: : :\n", encoding="utf-8")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder", encoding="utf-8")
    plain = {"DEER_FLOW_HOME": str(base), "DEER_FLOW_CONFIG_PATH": str(empty)}
    return {
        "unknown backend": (
            {**plain, "DEER_FLOW_STORAGE_BACKEND": "nope"},
            "storage.backend must be one of: local, s3 (got 'nope')",
        ),
        "malformed config.yaml": (
            {**plain, "DEER_FLOW_CONFIG_PATH": str(malformed)},
            f"Config file {malformed} is not valid YAML: expected ',' or ']', but got ':' "
            "(line 2, column 4)",
        ),
        "missing config file": (
            {**plain, "DEER_FLOW_CONFIG_PATH": str(tmp_path / "missing.yaml")},
            "DEER_FLOW_CONFIG_PATH is set to",
        ),
        "data dir through a file": (
            {**plain, "DEER_FLOW_HOME": str(a_file / "data")},
            f"The data dir {a_file / 'data'} cannot be used: Not a directory",
        ),
        "database driver not installed": (
            {**plain, "DATABASE_URL": "mysql://someone@127.0.0.1/deerflow"},
            "database.url / DATABASE_URL is not usable: No module named",
        ),
        "bucket endpoint not a URL": (
            {
                **plain,
                "DEER_FLOW_STORAGE_BACKEND": "s3",
                "DEER_FLOW_STORAGE_S3_BUCKET": "files",
                "DEER_FLOW_STORAGE_S3_ENDPOINT_URL": "not-a-url",
            },
            "storage.s3.endpoint_url 'not-a-url' must be an http:// or https:// URL",
        ),
    }


CASES = [
    "unknown backend",
    "malformed config.yaml",
    "missing config file",
    "data dir through a file",
    "database driver not installed",
    "bucket endpoint not a URL",
]


def assert_one_line(result: subprocess.CompletedProcess[str], says: str) -> None:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    assert output.count("\n") == 0, output  # one line, and nothing else: nothing started
    assert output.startswith(CANNOT_START), output
    assert says in output, output


@pytest.mark.parametrize("case", CASES)
def test_flask_run_says_one_line_and_exits(tmp_path: Path, case: str) -> None:
    environment, says = bad_configurations(tmp_path)[case]
    result = run_flask("run", {**os.environ, **environment})
    assert_one_line(result, says)
    if case != "data dir through a file":
        assert not (tmp_path / "data" / DATABASE_FILE).exists()  # no database made either


@pytest.mark.parametrize("case", ["unknown backend", "malformed config.yaml"])
def test_flask_finding_the_factory_itself_says_the_same_line(tmp_path: Path, case: str) -> None:
    """`--app deerflow_web.web`: Flask's CLI calls `create_app` itself, without app.py."""
    environment, says = bad_configurations(tmp_path)[case]
    assert_one_line(run_flask("run", {**os.environ, **environment}, "deerflow_web.web"), says)


@pytest.mark.parametrize("case", ["unknown backend", "data dir through a file"])
def test_the_jobs_worker_says_the_same_line(tmp_path: Path, case: str) -> None:
    environment, says = bad_configurations(tmp_path)[case]
    assert_one_line(run_flask("worker", {**os.environ, **environment}), says)


def test_a_good_configuration_is_not_refused(tmp_path: Path) -> None:
    """The same command with nothing wrong gets past loading the app (its CLI answers)."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    environment = {"DEER_FLOW_HOME": str(tmp_path / "data"), "DEER_FLOW_CONFIG_PATH": str(empty)}
    result = run_flask("routes", {**os.environ, **environment})
    assert result.returncode == 0, result.stderr
    assert "/api/threads/<thread_id>/uploads" in result.stdout
