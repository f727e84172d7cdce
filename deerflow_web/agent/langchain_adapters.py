"""The seam to `langchain.agents`, which is an optional dependency (the `agents` extra).

With langchain installed, the middlewares subclass `AgentMiddleware`, so they go straight
into `create_agent(middleware=[...])`, and their state schemas extend `AgentState`, so the
graph keeps the extra keys between nodes and turns. Without it, the same classes still work
when called directly (`before_agent(state, runtime)`); only the base classes change.
"""

from __future__ import annotations

from typing import Any
from typing import NotRequired

from typing_extensions import TypedDict

try:
    from langchain.agents.middleware import AgentMiddleware
    from langchain.agents.middleware import AgentState
except ImportError:  # pragma: no cover - exercised only without the optional extra
    LANGCHAIN_AVAILABLE = False

    class AgentMiddleware:  # type: ignore[no-redef]
        """Stand-in base: the middlewares only need somewhere to hang `state_schema`."""

        state_schema: Any = None

    class AgentState(TypedDict):  # type: ignore[no-redef]
        """Stand-in for LangChain's agent state."""

        messages: list[Any]

else:
    LANGCHAIN_AVAILABLE = True


class ThreadDataState(AgentState):
    """State written by ThreadDataMiddleware: the thread's host folders (SPEC 4.7)."""

    thread_data: NotRequired[dict[str, str] | None]


class UploadsState(AgentState):
    """State written by UploadsMiddleware (SPEC 4.7, D10, D11).

    `uploaded_files`: this run's files; `uploads`: the thread's full record set;
    `shown_uploads`: `{"filename", "sha256"}` pairs the incremental mode already announced.
    """

    uploaded_files: NotRequired[list[dict[str, Any]] | None]
    uploads: NotRequired[list[dict[str, Any]] | None]
    shown_uploads: NotRequired[list[dict[str, str]] | None]


__all__ = [
    "LANGCHAIN_AVAILABLE",
    "AgentMiddleware",
    "AgentState",
    "ThreadDataState",
    "UploadsState",
]
