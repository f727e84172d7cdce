"""The chat preview: what the model would receive for a message, turn by turn.

A person composes a message, ticks files of the thread and picks the injection mode; the
preview answers with the final message content, the `uploads` / `uploaded_files` (and
`shown_uploads`) state, and what `list_uploaded_files` would return now. Every answer
comes from the functions the LangChain side runs (`services/prompt/turn.py` for the
middleware, `services/prompt/tool_listing.py` for the tool), fed the same records, so the
preview cannot drift from the agent. No Flask and no LangChain here.

Turns are kept per thread (`storage/chat_turns.py`), so a person can step through several
and watch the incremental mode: as in a real run, the state key `shown_uploads` carries
over from the last turn that wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Literal

from deerflow_web.models import UploadRecord
from deerflow_web.services.prompt.context_block import DEFAULT_MAX_FILES
from deerflow_web.services.prompt.context_block import strip_upload_blocks
from deerflow_web.services.prompt.tool_listing import DEFAULT_MAX_RESULTS
from deerflow_web.services.prompt.tool_listing import list_uploaded_files_result
from deerflow_web.services.prompt.turn import UploadTurn
from deerflow_web.services.prompt.turn import compose_text
from deerflow_web.services.prompt.turn import current_turn
from deerflow_web.services.prompt.turn import incremental_turn
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.chat_turns import DatabasePreviewHistory
from deerflow_web.storage.chat_turns import PreviewHistory
from deerflow_web.storage.chat_turns import StoredTurn
from deerflow_web.storage.paths import Thread

PreviewMode = Literal["current", "incremental"]
PREVIEW_MODES: tuple[PreviewMode, ...] = ("current", "incremental")
TITLE_CHARS = 80


@dataclass(frozen=True)
class PreviewTurn:
    """One previewed turn: the person's input and everything the model side would see.

    Attributes:
        text: The message as the person typed it.
        attached: The filenames the person attached, in order.
        mode: `"current"` or `"incremental"`.
        message_files: The `additional_kwargs.files` a client would send for `attached`.
        content: The final message content the model receives (block included).
        uploaded_files: State `uploaded_files` after the turn.
        uploads: State `uploads` after the turn (the thread's full record set).
        shown_uploads: State `shown_uploads` after an incremental turn; None otherwise.
        tool_result: What `list_uploaded_files()` (default arguments) returns in this turn.
        turn_id: The stored turn's id; None until saved.
        created_at: When the turn was saved (POSIX time); None until saved.
    """

    text: str
    attached: tuple[str, ...]
    mode: PreviewMode
    message_files: list[dict[str, Any]]
    content: str
    uploaded_files: list[dict[str, Any]]
    uploads: list[dict[str, Any]]
    shown_uploads: list[dict[str, str]] | None
    tool_result: dict[str, Any]
    turn_id: int | None = None
    created_at: float | None = field(default=None, compare=False)

    @property
    def person_text(self) -> str:
        """The message as a UI shows it: injected upload blocks stripped (SPEC 2.7)."""
        return strip_upload_blocks(self.content)

    @property
    def title(self) -> str:
        """The first non-blank line of `person_text`, cut to a list-friendly length."""
        line = next((line.strip() for line in self.person_text.splitlines() if line.strip()), "")
        return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"

    @property
    def injected(self) -> bool:
        """Whether the middleware put a block in front of the message this turn."""
        return self.content != self.text

    def state(self) -> dict[str, Any]:
        """The state keys the uploads middleware wrote in this turn."""
        state: dict[str, Any] = {
            "uploaded_files": self.uploaded_files,
            "uploads": self.uploads,
        }
        if self.shown_uploads is not None:
            state["shown_uploads"] = self.shown_uploads
        return state

    def to_data(self) -> dict[str, Any]:
        """The turn as a JSON document for the history store."""
        return {
            "text": self.text,
            "attached": list(self.attached),
            "mode": self.mode,
            "message_files": self.message_files,
            "content": self.content,
            "uploaded_files": self.uploaded_files,
            "uploads": self.uploads,
            "shown_uploads": self.shown_uploads,
            "tool_result": self.tool_result,
        }

    @classmethod
    def from_stored(cls, stored: StoredTurn) -> PreviewTurn:
        """Rebuild a saved turn."""
        data = stored.data
        return cls(
            text=str(data.get("text", "")),
            attached=tuple(data.get("attached") or ()),
            mode="incremental" if data.get("mode") == "incremental" else "current",
            message_files=list(data.get("message_files") or []),
            content=str(data.get("content", "")),
            uploaded_files=list(data.get("uploaded_files") or []),
            uploads=list(data.get("uploads") or []),
            shown_uploads=data.get("shown_uploads"),
            tool_result=dict(data.get("tool_result") or {}),
            turn_id=stored.turn_id,
            created_at=stored.created_at,
        )


def message_files_for(
    records: Sequence[UploadRecord], attached: Iterable[str]
) -> list[dict[str, Any]]:
    """The `additional_kwargs.files` a client sends for the attached names.

    DeerFlow's frontend copies `filename`, `size` and `path` from the upload response. A
    name without a record is sent bare; the middleware then skips it, as it skips a real
    client's stale entry.
    """
    by_name = {record.filename: record for record in records}
    files: list[dict[str, Any]] = []
    for name in attached:
        record = by_name.get(name)
        if record is None:
            files.append({"filename": name})
        else:
            files.append({"filename": name, "size": record.size, "path": record.virtual_path})
    return files


def build_preview_turn(
    records: Sequence[UploadRecord],
    uploads_dir: Path,
    text: str,
    attached: Sequence[str],
    mode: PreviewMode,
    *,
    shown_uploads: Any = None,
    max_files: int = DEFAULT_MAX_FILES,
    max_results: int = DEFAULT_MAX_RESULTS,
) -> PreviewTurn:
    """Compute one turn exactly as the uploads middleware and the tool would.

    Args:
        records: The thread's upload records (what `UploadService.list_uploads` returns).
        uploads_dir: The thread's uploads folder.
        text: The person's message (string content).
        attached: Filenames attached to the message.
        mode: `"current"` (files of this message) or `"incremental"` (all not yet shown).
        shown_uploads: State `shown_uploads` before the turn (incremental mode only).
        max_files: The middleware's `max_files_per_context_section`.
        max_results: `list_uploaded_files`'s `max_results`.

    Raises:
        ValueError: An unknown mode.
    """
    message_files = message_files_for(records, attached)
    turn: UploadTurn
    if mode == "current":
        turn = current_turn(message_files, records, uploads_dir, max_files=max_files)
    elif mode == "incremental":
        turn = incremental_turn(records, shown_uploads, uploads_dir, max_files=max_files)
    else:
        raise ValueError(f"mode must be one of {', '.join(PREVIEW_MODES)}, not {mode!r}")
    tool_result = list_uploaded_files_result(
        uploads_dir,
        lambda: records,
        current_names={entry["filename"] for entry in turn.uploaded_files},
        max_results=max_results,
    )
    return PreviewTurn(
        text=text,
        attached=tuple(attached),
        mode=mode,
        message_files=message_files,
        content=compose_text(turn.block, text),
        uploaded_files=turn.uploaded_files,
        uploads=turn.uploads or [],
        shown_uploads=turn.shown_uploads,
        tool_result=tool_result,
    )


def carried_shown_uploads(turns: Sequence[PreviewTurn]) -> list[dict[str, str]] | None:
    """State `shown_uploads` before the next turn: the last value a turn wrote.

    A current-mode turn does not write the key, so, as in a real run's state, the last
    incremental turn's value survives it.
    """
    for turn in reversed(turns):
        if turn.shown_uploads is not None:
            return turn.shown_uploads
    return None


class ChatPreviewService:
    """Preview turns for a thread and keep their history."""

    def __init__(
        self,
        uploads: UploadService,
        history: PreviewHistory,
        *,
        max_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        self._uploads = uploads
        self._history = history
        self._max_files = max_files

    def preview(
        self,
        thread: Thread,
        text: str,
        attached: Sequence[str],
        mode: PreviewMode,
    ) -> PreviewTurn:
        """Compute the next turn of the thread's preview and save it in the history.

        Raises:
            ValueError: An unknown mode.
        """
        folders = self._uploads.folders(thread)
        uploads_dir = folders.uploads_dir()
        records = self._uploads.list_uploads(folders)
        turn = build_preview_turn(
            records,
            uploads_dir,
            text,
            attached,
            mode,
            shown_uploads=carried_shown_uploads(self.history(folders)),
            max_files=self._max_files,
        )
        stored = self._history.append(folders.scope, turn.to_data())
        return PreviewTurn.from_stored(stored)

    def history(self, thread: Thread) -> list[PreviewTurn]:
        """The thread's previewed turns, oldest first."""
        stored = self._history.turns(self._scope(thread))
        return [PreviewTurn.from_stored(turn) for turn in stored]

    def clear(self, thread: Thread) -> int:
        """Forget the thread's previewed turns; return how many there were."""
        return self._history.clear(self._scope(thread))

    def _scope(self, thread: Thread) -> str:
        return self._uploads.folders(thread).scope


def make_chat_preview_service(
    uploads: UploadService, *, max_files: int = DEFAULT_MAX_FILES
) -> ChatPreviewService:
    """Build the preview over the upload service's data dir and database."""
    history = DatabasePreviewHistory(uploads.records.engine)
    return ChatPreviewService(uploads, history, max_files=max_files)
