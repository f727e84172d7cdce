"""`jobs.*` (settings.py): where the background jobs run, and `DEER_FLOW_JOBS_RUN_IN_WEB`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from deerflow_web.settings import JobsSettings
from deerflow_web.settings import load_settings

# Settings only: nothing here reads the accounts mode.
pytestmark = pytest.mark.same_in_both_modes


def jobs_from(tmp_path: Path, text: str | None, environ: dict[str, str] | None = None):
    if text is not None:
        (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    return load_settings(environ=environ or {}, cwd=tmp_path).jobs


def test_web_instances_run_the_jobs_by_default(tmp_path: Path) -> None:
    assert jobs_from(tmp_path, None) == JobsSettings(True, 1.0, 20.0)
    assert jobs_from(tmp_path, "jobs: {}\n").run_in_web is True


@pytest.mark.parametrize("word", ["false", "no", "off", "0", "False"])
def test_the_config_file_turns_them_off(tmp_path: Path, word: str) -> None:
    assert jobs_from(tmp_path, f"jobs:\n  run_in_web: {word}\n").run_in_web is False


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("false", False), ("1", True)])
def test_the_environment_wins_over_the_file(tmp_path: Path, value: str, expected: bool) -> None:
    text = f"jobs:\n  run_in_web: {'false' if expected else 'true'}\n"
    jobs = jobs_from(tmp_path, text, {"DEER_FLOW_JOBS_RUN_IN_WEB": value})
    assert jobs.run_in_web is expected


def test_an_empty_variable_leaves_the_file_in_charge(tmp_path: Path) -> None:
    jobs = jobs_from(tmp_path, "jobs:\n  run_in_web: false\n", {"DEER_FLOW_JOBS_RUN_IN_WEB": " "})
    assert jobs.run_in_web is False


@pytest.mark.parametrize("value", ["maybe", "[1, 2]", "2"])
def test_an_unreadable_value_keeps_the_jobs_on(
    tmp_path: Path, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert jobs_from(tmp_path, f"jobs:\n  run_in_web: {value}\n").run_in_web is True
    assert "jobs.run_in_web" in caplog.text


def test_an_unreadable_variable_keeps_the_jobs_on(tmp_path: Path) -> None:
    assert jobs_from(tmp_path, None, {"DEER_FLOW_JOBS_RUN_IN_WEB": "perhaps"}).run_in_web is True


def test_poll_and_grace(tmp_path: Path) -> None:
    jobs = jobs_from(tmp_path, "jobs:\n  poll_seconds: 0.5\n  stop_grace_seconds: 60\n")
    assert (jobs.poll_seconds, jobs.stop_grace_seconds) == (0.5, 60.0)


@pytest.mark.parametrize("bad", ["0", "-1", "soon"])
def test_bad_poll_and_grace_fall_back(tmp_path: Path, bad: str) -> None:
    jobs = jobs_from(tmp_path, f"jobs:\n  poll_seconds: {bad}\n  stop_grace_seconds: {bad}\n")
    assert (jobs.poll_seconds, jobs.stop_grace_seconds) == (1.0, 20.0)


def test_the_example_config_reads_as_the_defaults(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "config.example.yaml"
    assert jobs_from(tmp_path, example.read_text(encoding="utf-8")) == JobsSettings()
