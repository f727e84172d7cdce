"""Settings: defaults without a file, config discovery, invalid values (SPEC D2/D3, 1.8)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from deerflow_web.errors import ConfigError
from deerflow_web.models import ImageLimits
from deerflow_web.models import UploadLimits
from deerflow_web.settings import load_settings
from deerflow_web.settings import parse_bool
from deerflow_web.settings import parse_flag


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_any_file(tmp_path: Path) -> None:
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.limits == UploadLimits(10, 52428800, 104857600)
    assert settings.conversion.auto_convert_documents is False
    assert settings.base_dir == Path.cwd().resolve() / ".deer-flow"
    assert settings.config_path is None


def test_config_in_working_dir_is_found(tmp_path: Path) -> None:
    write(tmp_path / "config.yaml", "uploads:\n  max_files: 15\n")
    assert load_settings(environ={}, cwd=tmp_path).limits.max_files == 15


def test_config_path_variable_wins_and_must_exist(tmp_path: Path) -> None:
    write(tmp_path / "config.yaml", "uploads:\n  max_files: 15\n")
    other = write(tmp_path / "other.yaml", "uploads:\n  max_files: 3\n")
    env = {"DEER_FLOW_CONFIG_PATH": str(other)}
    assert load_settings(environ=env, cwd=tmp_path).limits.max_files == 3
    with pytest.raises(ConfigError, match="DEER_FLOW_CONFIG_PATH"):
        load_settings(environ={"DEER_FLOW_CONFIG_PATH": str(tmp_path / "nope.yaml")}, cwd=tmp_path)


def test_broken_yaml_names_the_file(tmp_path: Path) -> None:
    bad = write(tmp_path / "config.yaml", "uploads: [unclosed\n")
    with pytest.raises(ConfigError, match=f"{bad}.*not valid YAML"):
        load_settings(environ={}, cwd=tmp_path)


def test_environment_references(tmp_path: Path) -> None:
    write(tmp_path / "config.yaml", "uploads:\n  max_files: $MAXF\n")
    assert load_settings(environ={"MAXF": "4"}, cwd=tmp_path).limits.max_files == 4
    with pytest.raises(ConfigError, match="MAXF is not set"):
        load_settings(environ={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("uploads", "expected"),
    [
        (
            {"max_files": 15, "max_file_size": "1048576", "max_total_size": 2097152},
            (15, 1048576, 2097152),
        ),
        ({"max_file_count": 7, "max_single_file_size": 123, "max_total_size": 456}, (7, 123, 456)),
        ({}, (10, 52428800, 104857600)),
    ],
)
def test_limits_from_mapping(uploads: dict, expected: tuple[int, int, int]) -> None:
    limits = UploadLimits.from_mapping(uploads)
    assert (limits.max_files, limits.max_file_size, limits.max_total_size) == expected


@pytest.mark.parametrize("bad", [0, -1, "abc", True, 1.5j])
def test_invalid_limit_falls_back_with_warning(
    bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert UploadLimits.from_mapping({"max_files": bad}).max_files == 10
    assert "max_files" in caplog.text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        ("YES", True),
        (" on ", True),
        ("1", True),
        ("false", False),
        (False, False),
        ("maybe", False),
        (0, False),
    ],
)
def test_parse_bool(value: object, expected: bool) -> None:
    assert parse_bool(value) is expected


def test_pdf_converter_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "config.yaml", "uploads:\n  pdf_converter: pymupdf4llm\n")
    with caplog.at_level(logging.WARNING, logger="deerflow_web.settings"):
        settings = load_settings(environ={}, cwd=tmp_path)

    assert not hasattr(settings.conversion, "pdf_converter")
    warnings = [r.getMessage() for r in caplog.records if "pdf_converter" in r.getMessage()]
    assert warnings == [
        "uploads.pdf_converter='pymupdf4llm' is ignored: documents are converted with markitdown"
    ]


def test_no_warning_without_pdf_converter(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "config.yaml", "uploads:\n  max_files: 3\n")
    with caplog.at_level(logging.WARNING, logger="deerflow_web.settings"):
        load_settings(environ={}, cwd=tmp_path)

    assert caplog.records == []


def test_non_mapping_top_level_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "config.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(environ={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[(word, True) for word in ("true", "1", "yes", "on", "t", "y", " TRUE ", "Yes")],
        *[(word, False) for word in ("false", "0", "no", "off", "f", "n", "OFF")],
        *[(word, None) for word in ("", "maybe", "2", "tru", "yess")],
    ],
)
def test_parse_flag_vocabulary(raw: str, expected: bool | None) -> None:
    assert parse_flag(raw) is expected


def test_settings_booleans_use_the_same_words_without_letters() -> None:
    assert [parse_bool(w) for w in ("true", "1", "yes", "on")] == [True] * 4
    assert [parse_bool(w) for w in ("t", "y", "false", "0")] == [False] * 4


def test_secret_key_from_environment_or_config(tmp_path: Path) -> None:
    """SPEC 9: SECRET_KEY wins over server.secret_key; neither means the data dir's file."""
    assert load_settings(environ={}, cwd=tmp_path).secret_key is None
    write(tmp_path / "config.yaml", "server:\n  secret_key: from-config\n")
    assert load_settings(environ={}, cwd=tmp_path).secret_key == "from-config"
    env = {"SECRET_KEY": "from-env"}
    assert load_settings(environ=env, cwd=tmp_path).secret_key == "from-env"
    write(tmp_path / "config.yaml", "server:\n  secret_key: '  '\n")
    assert load_settings(environ={}, cwd=tmp_path).secret_key is None


def test_vision_defaults_to_auto_with_the_image_limits(tmp_path: Path) -> None:
    agent = load_settings(environ={}, cwd=tmp_path).agent
    assert agent.vision is None  # auto: the model's profile decides
    assert agent.images == ImageLimits(max_edge=1568, max_images=5, max_pixels=40_000_000)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("yes", True), ("false", False), ("off", False), ("auto", None), ("", None)],
)
def test_vision_takes_yes_no_or_auto(tmp_path: Path, raw: str, expected: bool | None) -> None:
    write(tmp_path / "config.yaml", f"agent:\n  vision: '{raw}'\n")
    assert load_settings(environ={}, cwd=tmp_path).agent.vision is expected


def test_a_bad_vision_value_means_auto_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "config.yaml", "agent:\n  vision: sometimes\n")
    with caplog.at_level(logging.WARNING):
        assert load_settings(environ={}, cwd=tmp_path).agent.vision is None
    assert "agent.vision" in caplog.text


def test_image_limits_are_read_and_bad_ones_fall_back(tmp_path: Path) -> None:
    write(
        tmp_path / "config.yaml",
        "agent:\n  vision: true\n  image_max_edge: 1024\n  max_images_per_message: 0\n"
        "  image_max_pixels: lots\n",
    )
    agent = load_settings(environ={}, cwd=tmp_path).agent
    assert agent.vision is True
    assert agent.images == ImageLimits(max_edge=1024, max_images=5, max_pixels=40_000_000)


@pytest.mark.parametrize(
    ("config", "environ", "expected"),
    (
        ("", {}, 10 * 1024**3),
        ("quotas:\n  default_bytes: 1048576\n", {}, 1048576),
        ("quotas:\n  default_bytes: null\n", {}, None),
        ("quotas:\n  default_bytes: 0\n", {}, None),
        ("quotas:\n  default_bytes: 5\n", {"DEER_FLOW_QUOTAS_DEFAULT_BYTES": "77"}, 77),
        ("", {"DEER_FLOW_QUOTAS_DEFAULT_BYTES": "0"}, None),
        ("", {"DEER_FLOW_QUOTAS_DEFAULT_BYTES": "null"}, None),
    ),
)
def test_quota_default(tmp_path: Path, config: str, environ: dict, expected: int | None) -> None:
    write(tmp_path / "config.yaml", config)
    settings = load_settings(environ=environ, cwd=tmp_path)
    assert settings.quotas.default_bytes == expected


@pytest.mark.parametrize("bad", ("-1", "lots", "1.5", "true"))
def test_a_bad_quota_default_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    write(tmp_path / "config.yaml", f"quotas:\n  default_bytes: {bad}\n")
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.quotas.default_bytes == 10 * 1024**3
    assert "quotas.default_bytes" in caplog.text


def test_the_tus_lease_is_two_minutes_unless_set(tmp_path: Path) -> None:
    assert load_settings(environ={}, cwd=tmp_path).resumable.lease_seconds == 120.0
    example = Path(__file__).resolve().parents[1] / "config.example.yaml"
    assert load_settings(config_path=example, environ={}).resumable.lease_seconds == 120.0
    write(tmp_path / "config.yaml", "uploads:\n  resumable_lease_seconds: 3\n")
    assert load_settings(environ={}, cwd=tmp_path).resumable.lease_seconds == 3.0
    write(tmp_path / "config.yaml", "uploads:\n  resumable_lease_seconds: '0.5'\n")
    assert load_settings(environ={}, cwd=tmp_path).resumable.lease_seconds == 0.5


@pytest.mark.parametrize("bad", ("0", "-3", "soon", "true", "[30]"))
def test_a_bad_tus_lease_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    write(tmp_path / "config.yaml", f"uploads:\n  resumable_lease_seconds: {bad}\n")
    with caplog.at_level(logging.WARNING, logger="deerflow_web.models"):
        settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.resumable.lease_seconds == 120.0
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("uploads.resumable_lease_seconds=")
    assert warning.endswith("is not a positive number; using 120.0")


@pytest.mark.parametrize("bad", ("2.5", "'2.5'", "0.4"))
def test_a_fraction_where_a_whole_number_is_wanted_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    write(tmp_path / "config.yaml", f"uploads:\n  resumable_max_pending: {bad}\n")
    with caplog.at_level(logging.WARNING, logger="deerflow_web.models"):
        settings = load_settings(environ={}, cwd=tmp_path)
    default = load_settings(environ={}, cwd=tmp_path / "nothing-here").resumable.max_pending
    assert settings.resumable.max_pending == default
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("uploads.resumable_max_pending=")
    assert warning.endswith(f"is not a positive whole number; using {default}")


def test_a_whole_number_written_as_one_is_taken(tmp_path: Path) -> None:
    write(tmp_path / "config.yaml", "uploads:\n  resumable_max_pending: 7.0\n")
    assert load_settings(environ={}, cwd=tmp_path).resumable.max_pending == 7


def test_retention_is_off_unless_set(tmp_path: Path) -> None:
    assert load_settings(environ={}, cwd=tmp_path).retention.thread_days is None
    write(tmp_path / "config.yaml", "retention:\n  thread_days: 0\n")
    assert load_settings(environ={}, cwd=tmp_path).retention.thread_days is None
    write(tmp_path / "config.yaml", "retention:\n  thread_days: 30\n")
    assert load_settings(environ={}, cwd=tmp_path).retention.thread_days == 30.0
