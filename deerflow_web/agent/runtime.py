"""Read the thread and user of a run from the runtime, never from the model; find its folders.

Middlewares get LangGraph's `Runtime` (which has `context` but no `config`), tools get
`ToolRuntime` (both), and tests pass a `SimpleNamespace(context=..., config=...)`. These
helpers accept all three, and fall back to the ambient run config that LangChain keeps in a
context variable while a graph node or tool runs (SPEC 4.3 step 1, 4.6 step 2, D15).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langchain_core.runnables.config import var_child_runnable_config
from sqlalchemy import Engine

from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ThreadRef
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import use_storage_group


def resolve_thread_paths(
    base_dir: str | os.PathLike[str] | None = None, paths: ThreadPaths | None = None
) -> ThreadPaths:
    """The folders the middlewares and tools work in: `paths` if given, else under the
    explicit base dir, else the ones the web app uses (its settings)."""
    if paths is not None:
        return paths
    if base_dir is not None:
        return ThreadPaths(base_dir)
    from deerflow_web.settings import load_settings  # reads config.yaml: only when needed

    settings = load_settings()
    use_storage_group(settings.storage_group)  # the folders it creates: as the app's
    if settings.storage.backend != "local":
        # The folders as the app keeps them: a working copy of the bucket, by the records.
        # The records are the app's database (`DATABASE_URL`), not the data dir's file.
        from deerflow_web.services.uploads.service import make_upload_service

        engine = app_database(settings.base_dir, settings.database_url)
        return make_upload_service(settings.base_dir, engine=engine, storage=settings.storage).paths
    return ThreadPaths(settings.base_dir)


_engines: dict[tuple[str, str | None], Engine] = {}
_engines_lock = threading.Lock()


def app_database(base_dir: str | os.PathLike[str], url: str | None) -> Engine:
    """The app's database (`url`, else the data dir's SQLite file) for the agent's side,
    opened and migrated once per process: the middlewares, the tools and their document
    reads all share one engine and its pool, as the app's services do (SPEC 9)."""
    from deerflow_web.storage.migrate import open_database

    key = (os.fspath(base_dir), url)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = open_database(Path(base_dir), url)
        return engine


def context_value(runtime: Any, key: str) -> Any:
    """Return `runtime.context[key]`; a None context counts as empty, objects work too."""
    context = getattr(runtime, "context", None)
    if context is None:
        return None
    if isinstance(context, Mapping):
        return context.get(key)
    return getattr(context, key, None)


def _configurable(config: Any) -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        return {}
    configurable = config.get("configurable")
    return configurable if isinstance(configurable, Mapping) else {}


def configurable_value(runtime: Any, key: str) -> Any:
    """Return `configurable[key]` from the runtime's config, else from the ambient config."""
    value = _configurable(getattr(runtime, "config", None)).get(key)
    if value is None:
        value = _configurable(var_child_runnable_config.get()).get(key)
    return value


def thread_id_from(runtime: Any, *, use_config: bool = True) -> str | None:
    """The run's thread id: context first, then (unless disabled) the run config.

    Args:
        runtime: A LangGraph `Runtime`, a `ToolRuntime`, any object with `context`
            (and optionally `config`), or None.
        use_config: False reproduces doc A, which read the context only.

    Returns:
        The id as given (validation happens where paths are built), or None.
    """
    thread_id = context_value(runtime, "thread_id")
    if thread_id is None and use_config:
        thread_id = configurable_value(runtime, "thread_id")
    return thread_id


USER_ID_REQUIRED = (
    "This run has no user id (runtime context 'user_id' or config.configurable 'user_id'). "
    "Accounts are on, so a thread's files are only reachable as their owner."
)


def user_id_from(runtime: Any) -> str | None:
    """The run's user id: context first, then the run config (SPEC 7.4).

    None selects the flat layout (SPEC D1, case 90), which only the single-user mode may use.
    """
    user_id = context_value(runtime, "user_id")
    if user_id is None:
        user_id = configurable_value(runtime, "user_id")
    return user_id or None


def auth_required(explicit: bool | None, uses_app_settings: bool) -> bool:
    """Whether runs must name their user.

    An explicit flag wins. Components built on the app's own settings (no base dir given)
    follow its mode, so a deployment with accounts on never serves the flat layout; those
    given a base dir directly (tests, scripts) default to the single-user behaviour.
    """
    if explicit is not None:
        return explicit
    if not uses_app_settings:
        return False
    from deerflow_web.settings import load_settings  # reads config.yaml: only when needed

    return load_settings().auth.enabled


def required_user_id(runtime: Any, required: bool) -> str | None:
    """The run's user id; ValueError when the mode needs one and the run has none."""
    user_id = user_id_from(runtime)
    if user_id is None and required:
        raise ValueError(USER_ID_REQUIRED)
    return user_id


def thread_ref_from(runtime: Any, required: bool, *, use_config: bool = True) -> ThreadRef | None:
    """The run's thread as a validated reference, made once per tool call or turn; None
    when the run names no thread.

    Raises:
        ValueError: The mode needs a user id and the run has none (`USER_ID_REQUIRED`).
        InvalidThreadId, InvalidUserId: The run's ids are malformed.
    """
    thread_id = thread_id_from(runtime, use_config=use_config)
    if thread_id is None:
        return None
    user_id = required_user_id(runtime, required)
    return ThreadRef(thread_id, SINGLE_USER if user_id is None else user_id)
