"""What `read_file` and `grep` would return to the model, for the chat preview's tools panel.

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
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.file_access import FileToolFailure
from deerflow_web.services.prompt.file_access import UserDataFiles
from deerflow_web.services.prompt.file_access import run_file_tool
from deerflow_web.services.prompt.file_access import tool_content
from deerflow_web.storage.paths import Thread

TOOLS = ("read_file", "grep")


@dataclass(frozen=True)
class ToolPreview:
    """One simulated tool call: the arguments the model would send and what it gets back."""

    tool: str
    arguments: dict[str, Any]
    content: str
    failed: bool


class ToolPreviewService:
    """Run `read_file` or `grep` for a thread exactly as the agent's tools would."""

    def __init__(self, jobs: ConversionJobs, wait_seconds: float) -> None:
        self._jobs = jobs
        self._wait = wait_seconds

    def _files(self, thread: Thread) -> UserDataFiles:
        uploads = self._jobs.uploads
        folders = uploads.folders(thread)
        documents = DocumentTexts(self._jobs, folders, self._wait)

        def listed_upload(name: str) -> bool:
            return any(r.filename == name for r in uploads.list_uploads(folders))

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

    @staticmethod
    def _run(
        tool: str, arguments: dict[str, Any], verb: str, path: str, action: Any
    ) -> ToolPreview:
        try:
            content = tool_content(run_file_tool(verb, path, action))
        except FileToolFailure as failure:
            return ToolPreview(tool, arguments, str(failure), True)
        return ToolPreview(tool, arguments, content, False)
