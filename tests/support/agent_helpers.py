"""Shared helpers for the agent-side tests (no Flask): runtimes, thread folders, messages,
and a fake model for real `create_agent` loops."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.messages import BaseMessage
from langchain_core.messages import HumanMessage
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from typing_extensions import TypedDict

from deerflow_web.agent import make_file_tools
from deerflow_web.agent import make_upload_middleware
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.uploads.service import UploadService


class AgentContext(TypedDict, total=False):
    """What the server puts in the runtime context; the model never sets it."""

    thread_id: str
    user_id: str
    run_id: str


class RecordingToolModel(GenericFakeChatModel):
    """Replays scripted replies and records what it was shown; tools are bound as-is."""

    received: list[list[BaseMessage]] = Field(default_factory=list)
    bound_tools: list[str] = Field(default_factory=list)  # the names of the tools offered

    def bind_tools(self, tools: Any, **kwargs: Any) -> RecordingToolModel:
        self.bound_tools = [getattr(item, "name", str(item)) for item in tools]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def file_agent(
    model: GenericFakeChatModel,
    base_dir: Path,
    *,
    tool_options: dict[str, Any] | None = None,
    middleware_options: dict[str, Any] | None = None,
) -> Any:
    """A real `create_agent` loop with this project's file tools and upload middlewares."""
    return create_agent(
        model,
        tools=make_file_tools(base_dir=base_dir, **(tool_options or {})),
        middleware=make_upload_middleware(base_dir=base_dir, **(middleware_options or {})),
        context_schema=AgentContext,
        checkpointer=InMemorySaver(),
    )


def tool_call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    """A tool call as a model's AIMessage carries it."""
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def make_runtime(
    context: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
) -> SimpleNamespace:
    """A stand-in for LangGraph's Runtime / ToolRuntime with just the attributes we read."""
    return SimpleNamespace(context=context, config=config or {}, state=state or {})


def thread_uploads(base: Path, thread_id: str = "t1", user_id: str | None = None) -> Path:
    """Create and return a thread's uploads folder in the flat or per-user layout."""
    root = (
        base / "threads" / thread_id
        if user_id is None
        else (base / "users" / user_id / "threads" / thread_id)
    )
    folder = root / "user-data" / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_file(path: Path, content: str | bytes = b"x", mtime: float | None = None) -> Path:
    """Write a file (text or bytes), optionally pinning its mtime for ordering tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def human_with_files(content: Any, *files: dict[str, Any], **kwargs: Any) -> HumanMessage:
    """A human message carrying `additional_kwargs.files` the way DeerFlow's client sends it."""
    extra = dict(kwargs.pop("additional_kwargs", {}))
    if files:
        extra["files"] = list(files)
    return HumanMessage(
        content=content, id=kwargs.pop("id", "msg-1"), additional_kwargs=extra, **kwargs
    )


def tool_messages(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    """The tool results among `messages`, by the id of the call they answer."""
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def save_files(service: UploadService, *paths: Path, thread_id: str = "t1") -> None:
    """Upload local files into a single-user thread through the service."""
    service.save_uploads(
        ThreadRef.single_user(thread_id),
        [IncomingFile(path.name, io.BytesIO(path.read_bytes())) for path in paths],
    )


def documents_agent(
    base_dir: Path, service: UploadService, model: GenericFakeChatModel, **tools: Any
) -> Any:
    """`file_agent` whose middleware reads the records of `service`."""
    return file_agent(
        model, base_dir, tool_options=tools, middleware_options={"upload_service": service}
    )


def replies_from(
    model: RecordingToolModel, steps: list[Callable[[list[BaseMessage]], AIMessage]]
) -> Iterator[AIMessage]:
    """Feed the fake model replies computed from the messages it has just received."""
    for step in steps:
        yield step(model.received[-1])
