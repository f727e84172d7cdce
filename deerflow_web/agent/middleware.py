"""Agent middlewares: where the thread's folders are, and which uploads the model sees.

Order in an agent: `ThreadDataMiddleware`, then `UploadsMiddleware` (SPEC 4.7). Both read
the thread from the runtime (context, then run config), never from the model, and both
return state updates instead of mutating the state or its messages.

What `UploadsMiddleware` announces is decided in `services/prompt/turn.py`, which the chat
preview page calls too; this module only extracts the inputs from the runtime and state
and rewrites the LangChain message.

`UploadsMiddleware` has three modes (SPEC D11):

- `"current"` (default, SPEC 4.4): announce the files of this message
  (`additional_kwargs.files`, checked against disk) in a `<current_uploads>` block.
- `"incremental"` (doc A's idea, hardened): announce every upload not yet shown, tracked
  in state `shown_uploads` as name + sha256, so new content under an old name is announced
  again; non-text content blocks are kept.
- `"legacy"` (SPEC 4.5): doc A exactly, history parsing and `<uploaded_files>`; kept for
  comparison with old threads.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any
from typing import Literal

from langchain_core.messages import HumanMessage

from deerflow_web.agent.langchain_adapters import AgentMiddleware
from deerflow_web.agent.langchain_adapters import ThreadDataState
from deerflow_web.agent.langchain_adapters import UploadsState
from deerflow_web.agent.messages import last_human
from deerflow_web.agent.messages import legacy_text
from deerflow_web.agent.messages import state_messages
from deerflow_web.agent.messages import state_value
from deerflow_web.agent.messages import with_upload_block
from deerflow_web.agent.runtime import auth_required
from deerflow_web.agent.runtime import context_value
from deerflow_web.agent.runtime import required_user_id
from deerflow_web.agent.runtime import resolve_thread_paths
from deerflow_web.agent.runtime import thread_id_from
from deerflow_web.agent.runtime import thread_ref_from
from deerflow_web.agent.uploads_source import DirectoryUploadLister
from deerflow_web.agent.uploads_source import UploadLister
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import Area
from deerflow_web.models import UploadRecord
from deerflow_web.services.prompt.context_block import build_legacy_upload_block
from deerflow_web.services.prompt.context_block import context_files_for
from deerflow_web.services.prompt.turn import compose_text
from deerflow_web.services.prompt.turn import current_turn
from deerflow_web.services.prompt.turn import file_entry
from deerflow_web.services.prompt.turn import incremental_turn
from deerflow_web.services.prompt.turn import message_files
from deerflow_web.services.prompt.turn import record_to_state
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags
from deerflow_web.storage.local import is_foreign_link
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name

logger = logging.getLogger(__name__)

THREAD_ID_REQUIRED = "Thread ID is required in runtime context or config.configurable"
DEFAULT_MESSAGE_NAME = "user-input"
UploadsMode = Literal["current", "incremental", "legacy"]
_MODES = ("current", "incremental", "legacy")

_LEGACY_BLOCK = re.compile(r"<uploaded_files>(.*?)</uploaded_files>", re.DOTALL)
_LEGACY_ENTRY = re.compile(r"^-\s+(.+?)\s*\(")


class ThreadDataMiddleware(AgentMiddleware):
    """Tell the run where the thread's workspace, uploads and outputs live (SPEC 4.3, D15)."""

    state_schema = ThreadDataState

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        lazy_init: bool = True,
        *,
        paths: ThreadPaths | None = None,
        require_user: bool | None = None,
    ) -> None:
        """Configure the middleware.

        Args:
            base_dir: Data root; None uses the app's settings (SPEC D2).
            lazy_init: True only computes paths; False creates the folders first, for
                tools that write before anything else would create them.
            paths: A ready `ThreadPaths`, shared with the rest of the app (wins over base_dir).
            require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
                follows the app's settings when they are used, else False.
        """
        super().__init__()
        self._require_user = auth_required(require_user, base_dir is None and paths is None)
        self._paths = resolve_thread_paths(base_dir, paths)
        self._lazy_init = lazy_init

    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """Return `thread_data` and the last human message stamped with run id and time.

        Raises:
            ValueError: No thread id in the context or config, or an invalid one.
            UnsafeFolder: (`lazy_init=False`) a folder on the way is a link; nothing was
                created through it.
        """
        ref = thread_ref_from(runtime, self._require_user)
        if ref is None:
            raise ValueError(THREAD_ID_REQUIRED)
        if not self._lazy_init:
            self._paths.ensure_thread_dirs(ref)
            logger.debug("created folders of thread %s", ref.thread_id)
        # Where the folders belong, for the sandbox: the app's own file operations check
        # each folder for planted links themselves, so a run is not refused here.
        update: dict[str, Any] = {
            "thread_data": {
                f"{area.value}_path": str(self._paths.area_location(ref, area))
                for area in (Area.WORKSPACE, Area.UPLOADS, Area.OUTPUTS)
            }
        }
        messages = state_messages(state)
        last = last_human(messages)
        if last is not None:
            kwargs = {
                **last.additional_kwargs,
                "run_id": context_value(runtime, "run_id"),
                "timestamp": datetime.now(UTC).isoformat(),
            }
            messages[-1] = last.model_copy(
                update={"name": last.name or DEFAULT_MESSAGE_NAME, "additional_kwargs": kwargs}
            )
            update["messages"] = messages
        return update


def files_from_message(message: HumanMessage, uploads_dir: Path | None) -> list[dict[str, Any]]:
    """The valid entries of the message's `additional_kwargs.files` (SPEC 4.4 step 4)."""
    return message_files(message.additional_kwargs.get("files"), uploads_dir)


class UploadsMiddleware(AgentMiddleware):
    """Announce uploads to the model in front of the person's message (SPEC 4.4, 4.5, D11)."""

    state_schema = UploadsState

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        max_files_per_context_section: int = 10,
        *,
        mode: UploadsMode = "current",
        upload_service: UploadLister | None = None,
        paths: ThreadPaths | None = None,
        require_user: bool | None = None,
    ) -> None:
        """Configure the middleware.

        Args:
            base_dir: Data root; None uses the app's settings (SPEC D2).
            max_files_per_context_section: Files described in full before the rest are
                summarised (at least 1).
            mode: `"current"`, `"incremental"` or `"legacy"` (see the module docstring).
            upload_service: Source of the thread's upload records (`list_uploads`); None
                derives them from the uploads folder.
            paths: A ready `ThreadPaths`, shared with the rest of the app (wins over base_dir).
            require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
                follows the app's settings when they are used, else False.

        Raises:
            ValueError: A cap below 1 or an unknown mode.
        """
        super().__init__()
        if max_files_per_context_section < 1:
            raise ValueError("max_files_per_context_section must be at least 1")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        self._require_user = auth_required(require_user, base_dir is None and paths is None)
        self._paths = resolve_thread_paths(base_dir, paths)
        self._max_files = max_files_per_context_section
        self._mode = mode
        self._lister: UploadLister = upload_service or DirectoryUploadLister(self._paths)

    @property
    def mode(self) -> str:
        """The injection model this instance uses."""
        return self._mode

    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """Return the state update for this turn (None only in legacy mode's no-op cases)."""
        if self._mode == "legacy":
            return self._legacy(state, runtime)
        if self._mode == "incremental":
            return self._incremental(state, runtime)
        return self._current(state, runtime)

    def _thread(self, runtime: Any, *, use_config: bool = True) -> ThreadFolders | None:
        """The run's thread for this turn (made once, its folders walked once)."""
        ref = thread_ref_from(runtime, self._require_user, use_config=use_config)
        return None if ref is None else self._paths.folders(ref)

    def _records(self, thread: ThreadFolders) -> list[UploadRecord] | None:
        try:
            return list(self._lister.list_uploads(thread))
        except ValueError:
            raise  # an invalid thread or user id is the caller's bug, not a storage hiccup
        except Exception:
            # The turn must go on when the record index is unavailable: the current mode
            # still announces from the message, only the `uploads` key is left out.
            logger.exception("cannot list the uploads of thread %s", thread.thread_id)
            return None

    def _current(self, state: Any, runtime: Any) -> dict[str, Any]:
        required_user_id(runtime, self._require_user)  # even for a run without a thread
        thread = self._thread(runtime)
        thread_id = thread.thread_id if thread is not None else None
        uploads_dir = None
        records = None
        if thread is not None:
            uploads_dir = self._uploads_dir(thread)
            records = self._records(thread) if uploads_dir is not None else None
        last = last_human(state_messages(state))
        raw_files = last.additional_kwargs.get("files") if last is not None else None
        turn = current_turn(raw_files, records, uploads_dir, max_files=self._max_files)
        update = turn.state_update()
        if last is None or turn.block is None:
            if raw_files:
                logger.info("file metadata in the message matched no upload of %s", thread_id)
            return update
        update["messages"] = self._replace_last(state, with_upload_block(last, turn.block))
        return update

    @staticmethod
    def _uploads_dir(thread: ThreadFolders) -> Path | None:
        """The uploads folder, or None when a link was planted on the way to it.

        The turn goes on without uploads rather than read through the link.
        """
        try:
            return thread.uploads_dir()
        except UnsafeFolder:
            logger.warning("the uploads folder of thread %s is behind a link", thread.thread_id)
            return None

    @staticmethod
    def _replace_last(state: Any, message: HumanMessage) -> list[Any]:
        messages = state_messages(state)
        messages[-1] = message
        return messages

    def _incremental(self, state: Any, runtime: Any) -> dict[str, Any]:
        thread = self._thread(runtime)
        if thread is None:
            return {"uploaded_files": []}
        records = self._records(thread)
        if records is None:
            return {"uploaded_files": []}
        last = last_human(state_messages(state))
        if last is None:  # nothing was shown, so nothing is marked as shown
            return {"uploaded_files": [], "uploads": [record_to_state(r) for r in records]}
        turn = incremental_turn(
            records,
            state_value(state, "shown_uploads"),
            self._uploads_dir(thread),
            max_files=self._max_files,
        )
        update = turn.state_update()
        if turn.block is not None:
            update["messages"] = self._replace_last(state, with_upload_block(last, turn.block))
        return update

    def _legacy(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        if thread_id_from(runtime, use_config=False) is None:
            return None
        messages = state_messages(state)
        if not messages:
            return None
        shown = _legacy_shown_names(messages[:-1])
        thread = self._thread(runtime, use_config=False)
        assert thread is not None
        uploads_dir = self._uploads_dir(thread)
        if uploads_dir is None:
            return None
        files = [
            file_entry(path.name, path.stat().st_size)
            for path in _legacy_scan(uploads_dir)
            # The block shows names neutralised, so an escaped name also counts as shown.
            if path.name not in shown and neutralize_untrusted_tags(path.name) not in shown
        ]
        if not files:
            return None
        last = last_human(messages)
        if last is None:
            return None
        block = build_legacy_upload_block(context_files_for(None, files))
        messages[-1] = HumanMessage(
            content=compose_text(block, legacy_text(last.content)),
            id=last.id,
            additional_kwargs=last.additional_kwargs,
        )
        return {"uploaded_files": files, "messages": messages}


def make_upload_middleware(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    upload_service: UploadLister | None = None,
    paths: ThreadPaths | None = None,
    lazy_init: bool = True,
    mode: UploadsMode = "current",
    max_files_per_context_section: int = 10,
    require_user: bool | None = None,
) -> list[AgentMiddleware]:
    """Both middlewares in SPEC 4.7's order, sharing one `ThreadPaths` and one auth mode."""
    needs_user = auth_required(require_user, base_dir is None and paths is None)
    thread_paths = resolve_thread_paths(base_dir, paths)
    return [
        ThreadDataMiddleware(lazy_init=lazy_init, paths=thread_paths, require_user=needs_user),
        UploadsMiddleware(
            max_files_per_context_section=max_files_per_context_section,
            mode=mode,
            upload_service=upload_service,
            paths=thread_paths,
            require_user=needs_user,
        ),
    ]


def _legacy_shown_names(history: list[Any]) -> set[str]:
    """Names listed in the first `<uploaded_files>` block of each earlier human message."""
    shown: set[str] = set()
    for message in history:
        if not isinstance(message, HumanMessage) or not isinstance(message.content, str):
            continue
        block = _LEGACY_BLOCK.search(message.content)
        if block is None:
            continue
        for line in block.group(1).splitlines():
            entry = _LEGACY_ENTRY.match(line.strip())
            if entry is not None:
                shown.add(entry.group(1).strip())
    return shown


def _legacy_scan(uploads_dir: Path) -> list[Path]:
    if not uploads_dir.is_dir():
        return []
    return [
        path
        for path in sorted(uploads_dir.iterdir(), key=lambda item: item.name)
        if path.is_file()
        and not is_staging_name(path.name)
        and not is_foreign_link(path.stat(), None)  # no records here to vouch for a link
    ]


__all__ = [
    "THREAD_ID_REQUIRED",
    "ThreadDataMiddleware",
    "UploadsMiddleware",
    "files_from_message",
    "make_upload_middleware",
]
