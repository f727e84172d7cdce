"""Where a run's thread, user and folders come from (agent/runtime.py): never the model.

The runtimes are the three shapes the module accepts: an object with `context` (and
`config`), a mapping context, and None; the ambient run config is LangChain's own context
variable, set here as a graph node would have it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from langchain_core.runnables.config import var_child_runnable_config

from deerflow_web.agent.runtime import USER_ID_REQUIRED
from deerflow_web.agent.runtime import auth_required
from deerflow_web.agent.runtime import configurable_value
from deerflow_web.agent.runtime import context_value
from deerflow_web.agent.runtime import required_user_id
from deerflow_web.agent.runtime import resolve_thread_paths
from deerflow_web.agent.runtime import thread_id_from
from deerflow_web.agent.runtime import user_id_from
from deerflow_web.storage.paths import ThreadPaths


@contextmanager
def ambient(config: Any) -> Iterator[None]:
    """The run config LangChain keeps while a node or tool runs."""
    token = var_child_runnable_config.set(config)
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)


def runtime(context: Any = None, config: Any = None) -> SimpleNamespace:
    return SimpleNamespace(context=context, config=config)


def configured(**values: Any) -> dict[str, Any]:
    return {"configurable": values}


# ---- context and config ------------------------------------------------------------------


def test_context_value_reads_mappings_and_objects() -> None:
    assert context_value(runtime({"thread_id": "t1"}), "thread_id") == "t1"
    assert context_value(runtime(SimpleNamespace(thread_id="t2")), "thread_id") == "t2"


@pytest.mark.parametrize(
    "given",
    (None, runtime(None), runtime({}), runtime(SimpleNamespace()), SimpleNamespace(), object()),
)
def test_context_value_of_nothing_is_none(given: Any) -> None:
    assert context_value(given, "thread_id") is None


def test_configurable_value_prefers_the_runtimes_config_to_the_ambient_one() -> None:
    with ambient(configured(thread_id="ambient")):
        assert configurable_value(runtime(config=configured(thread_id="own")), "thread_id") == "own"
        assert configurable_value(runtime(config=configured()), "thread_id") == "ambient"
        assert configurable_value(None, "thread_id") == "ambient"


@pytest.mark.parametrize(
    "config",
    (None, "not a mapping", {"configurable": "not a mapping"}, {"configurable": None}, {}),
)
def test_configurable_value_ignores_malformed_configs(config: Any) -> None:
    with ambient(config):
        assert configurable_value(runtime(config=config), "thread_id") is None


def test_no_config_anywhere_gives_none() -> None:
    assert configurable_value(runtime(), "user_id") is None


# ---- the thread ---------------------------------------------------------------------------


def test_the_thread_comes_from_the_context_first() -> None:
    given = runtime({"thread_id": "from-context"}, configured(thread_id="from-config"))
    assert thread_id_from(given) == "from-context"


def test_the_thread_falls_back_to_the_run_config_and_then_the_ambient_one() -> None:
    assert thread_id_from(runtime({}, configured(thread_id="from-config"))) == "from-config"
    with ambient(configured(thread_id="ambient")):
        assert thread_id_from(runtime({})) == "ambient"
        assert thread_id_from(None) == "ambient"


def test_use_config_false_reads_the_context_only() -> None:
    with ambient(configured(thread_id="ambient")):
        assert thread_id_from(runtime({}, configured(thread_id="c")), use_config=False) is None
        assert thread_id_from(runtime({"thread_id": "t"}), use_config=False) == "t"


def test_the_thread_id_is_returned_as_given_validation_happens_later() -> None:
    assert thread_id_from(runtime({"thread_id": "../escape"})) == "../escape"


def test_no_thread_anywhere() -> None:
    assert thread_id_from(runtime()) is None


# ---- the user -----------------------------------------------------------------------------


def test_the_user_comes_from_the_context_then_the_config() -> None:
    assert user_id_from(runtime({"user_id": "u1"}, configured(user_id="u2"))) == "u1"
    assert user_id_from(runtime({}, configured(user_id="u2"))) == "u2"
    with ambient(configured(user_id="u3")):
        assert user_id_from(runtime()) == "u3"


@pytest.mark.parametrize("empty", (None, ""))
def test_an_empty_user_id_is_no_user(empty: str | None) -> None:
    assert user_id_from(runtime({"user_id": empty})) is None


def test_a_required_user_that_is_missing_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        required_user_id(runtime({"thread_id": "t1"}), required=True)
    assert str(raised.value) == USER_ID_REQUIRED


def test_a_required_user_that_is_given_passes() -> None:
    assert required_user_id(runtime({"user_id": "u1"}), required=True) == "u1"


def test_without_accounts_no_user_is_fine() -> None:
    assert required_user_id(runtime(), required=False) is None
    assert required_user_id(runtime({"user_id": "u1"}), required=False) == "u1"


# ---- the mode and the folders ---------------------------------------------------------


@pytest.mark.parametrize("explicit", (True, False))
def test_an_explicit_flag_wins(explicit: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEER_FLOW_AUTH_DISABLED", "1")
    assert auth_required(explicit, uses_app_settings=True) is explicit
    assert auth_required(explicit, uses_app_settings=False) is explicit


def test_components_given_a_base_dir_default_to_single_user() -> None:
    assert auth_required(None, uses_app_settings=False) is False


@pytest.mark.parametrize(("disabled", "expected"), (("1", False), ("", True)))
def test_components_on_the_apps_settings_follow_its_mode(
    disabled: str, expected: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no config.yaml of the checkout
    monkeypatch.delenv("DEER_FLOW_CONFIG_PATH", raising=False)
    monkeypatch.setenv("DEER_FLOW_AUTH_DISABLED", disabled)
    assert auth_required(None, uses_app_settings=True) is expected


def test_given_paths_are_used_as_they_are(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path / "given")
    assert resolve_thread_paths(tmp_path / "other", paths=paths) is paths


def test_a_base_dir_makes_its_own_paths(tmp_path: Path) -> None:
    paths = resolve_thread_paths(tmp_path / "data")
    assert isinstance(paths, ThreadPaths) and paths.base_dir == (tmp_path / "data").resolve()
    assert resolve_thread_paths(str(tmp_path)).base_dir == tmp_path.resolve()


def test_without_a_base_dir_the_apps_settings_decide(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"base_dir": str(tmp_path / "from-config")}))
    monkeypatch.setenv("DEER_FLOW_CONFIG_PATH", str(config))
    monkeypatch.delenv("DEER_FLOW_HOME", raising=False)
    assert resolve_thread_paths().base_dir == (tmp_path / "from-config").resolve()
