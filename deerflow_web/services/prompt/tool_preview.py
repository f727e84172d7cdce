"""What `read_file`, `grep` and `view_image` would return to the model, for the chat
preview's tools panel.

A person can check, before trusting an agent with a document, what the agent will actually
read. So this runs the tools' own code (`tool_files.UserDataFiles` through `run_file_tool`,
documents through the same conversion jobs and wait budget) and renders the result as the
model's tool message holds it. No Flask and no LangChain: the page calls this service, and
the LangChain tools call the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import ImageLimits
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.file_access import FileToolFailure
from deerflow_web.services.prompt.file_access import UserDataFiles
from deerflow_web.services.prompt.file_access import run_file_tool
from deerflow_web.services.prompt.file_access import tool_content
from deerflow_web.storage.paths import Thread

TOOLS = ("read_file", "grep", "view_image")


@dataclass(frozen=True)
class ToolPreview:
    """One simulated tool call: the arguments the model would send and what it gets back.

    `content` is the tool message's text; for `view_image`, the message's parts as JSON
    with the base64 data elided, and `picture` the `data:` URL of the very bytes sent.
    """

    tool: str
    arguments: dict[str, Any]
    content: str
    failed: bool
    picture: str | None = None


class ToolPreviewService:
    """Run `read_file` or `grep` for a thread exactly as the agent's tools would."""

    def __init__(
        self, jobs: ConversionJobs, wait_seconds: float, image_limits: ImageLimits | None = None
    ) -> None:
        self._jobs = jobs
        self._wait = wait_seconds
        self._image_limits = image_limits or ImageLimits()

    def _files(self, thread: Thread) -> UserDataFiles:
        uploads = self._jobs.uploads
        folders = uploads.folders(thread)
        documents = DocumentTexts(self._jobs, folders, self._wait)

        def listed_upload(name: str) -> bool:
            return any(r.filename == name for r in uploads.records_of(folders))

        return UserDataFiles(folders, documents, listed_upload)

    def read_file(
        self,
        thread: Thread,
        path: str,
        start_line: int | None = None,
        end_line: int | None = None,
    ) -> ToolPreview:
        """What `read_file(path, start_line, end_line)` returns in this thread."""
        arguments: dict[str, Any] = {"path": path}
        if start_line is not None:
            arguments["start_line"] = start_line
        if end_line is not None:
            arguments["end_line"] = end_line
        files = self._files(thread)
        return self._run(
            "read_file", arguments, "read", path, lambda: files.read(path, start_line, end_line)
        )

    def grep(
        self,
        thread: Thread,
        pattern: str,
        path: str = VIRTUAL_UPLOADS_DIR,
    ) -> ToolPreview:
        """What `grep(pattern, path)` returns in this thread (the tool's default limits)."""
        files = self._files(thread)
        arguments = {"pattern": pattern, "path": path}
        return self._run("grep", arguments, "search", path, lambda: files.grep(pattern, path))

    def view_image(self, thread: Thread, path: str) -> ToolPreview:
        """What `view_image(path)` returns in this thread (offered to vision models only)."""
        files = self._files(thread)
        arguments = {"path": path}
        try:
            parts = run_file_tool("view", path, lambda: files.view_image(path, self._image_limits))
        except FileToolFailure as failure:
            return ToolPreview("view_image", arguments, str(failure), True)
        shown: list[dict[str, Any]] = []
        picture = None
        for part in parts:
            if part.get("type") == "image":
                data = str(part.get("base64", ""))
                picture = f"data:{part.get('mime_type')};base64,{data}"
                part = {**part, "base64": f"<{len(data)} characters>"}
            shown.append(part)
        return ToolPreview("view_image", arguments, tool_content(shown), False, picture)

    @staticmethod
    def _run(
        tool: str, arguments: dict[str, Any], verb: str, path: str, action: Any
    ) -> ToolPreview:
        try:
            content = tool_content(run_file_tool(verb, path, action))
        except FileToolFailure as failure:
            return ToolPreview(tool, arguments, str(failure), True)
        return ToolPreview(tool, arguments, content, False)
