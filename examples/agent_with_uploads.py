"""Wire deerflow-web's upload middlewares and file tools into a LangChain v1 agent.

Run it as it is (needs `pip install -e '.[agents]'`): a scripted stand-in model lists the
thread's uploads and reads one, so you can watch exactly what a model receives.
Pass `--model openai:gpt-4.1-mini` (or any `init_chat_model` name whose provider package
and API key you have) to ask a real model instead.

    .venv/bin/python examples/agent_with_uploads.py
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.messages import HumanMessage
from typing_extensions import TypedDict

from deerflow_web.agent import UploadTools
from deerflow_web.agent import make_upload_middleware
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.uploads.service import make_upload_service

THREAD = "example-thread"
REPORT = "# Quarterly report\n\n## Revenue\nRevenue grew 12% in every region.\n\n## Risks\nNone.\n"


class Context(TypedDict, total=False):
    """What the server puts in the runtime context: the model never chooses the thread."""

    thread_id: str


class ScriptedModel(GenericFakeChatModel):
    """A stand-in chat model that replays tool calls; tools are bound as they are."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def scripted_model() -> ScriptedModel:
    def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
        return {"name": name, "args": args, "id": call_id, "type": "tool_call"}

    replies = [
        AIMessage("", tool_calls=[call("list_uploaded_files", "1", include_outline=True)]),
        AIMessage(
            "",
            tool_calls=[
                call(
                    "read_file",
                    "2",
                    path="/mnt/user-data/uploads/report.md",
                    start_line=3,
                    end_line=4,
                )
            ],
        ),
        AIMessage("Revenue grew 12% in every region (report.md, lines 3-4)."),
    ]
    return ScriptedModel(messages=iter(replies))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an init_chat_model name; default: a scripted model")
    parser.add_argument("--data-dir", type=Path, help="data root; default: a temporary folder")
    args = parser.parse_args()

    base = args.data_dir or Path(tempfile.mkdtemp(prefix="deerflow-example-"))
    service = make_upload_service(base)
    thread = ThreadRef.single_user(THREAD)  # accounts off: the single-user layout
    service.save_uploads(thread, [IncomingFile("report.md", io.BytesIO(REPORT.encode()))])
    service.save_uploads(thread, [IncomingFile("notes.txt", io.BytesIO(b"call the auditors\n"))])

    if args.model:
        from langchain.chat_models import init_chat_model

        model = init_chat_model(args.model)
    else:
        model = scripted_model()
    agent = create_agent(
        model,
        tools=UploadTools(base_dir=base, upload_service=service).tools,
        middleware=make_upload_middleware(base_dir=base, upload_service=service),
        context_schema=Context,
    )
    # The client uploaded notes.txt with this message; report.md came in an earlier turn.
    message = HumanMessage(
        "What happened to revenue?",
        additional_kwargs={"files": [{"filename": "notes.txt", "size": 18, "status": "uploaded"}]},
    )
    result = agent.invoke(
        {"messages": [message]},
        context={"thread_id": THREAD},
        config={"configurable": {"thread_id": THREAD}},
    )
    for reply in result["messages"]:
        print(f"--- {type(reply).__name__}")
        print(reply.content if isinstance(reply.content, str) else reply.content)


if __name__ == "__main__":
    main()
