"""LangChain tools over the thread's files: `list_uploaded_files`, `read_file`, `glob`, `grep`,
and `view_image` for a model that accepts pictures (`agent/vision.py`).

The model never chooses the thread. Each tool takes a `runtime` argument that is hidden
from the model's schema (`InjectedToolArg`); LangChain's `ToolNode` fills it with a
`ToolRuntime` (context, state, config) because of its name. Without one, the ambient run
config's `configurable.thread_id` is used. Tool errors are raised as `ToolException` with
`handle_tool_error=True`, so the model reads the message instead of the run failing.

`read_file` and `grep` read an uploaded document (PDF, Word, Excel, PowerPoint) as its
Markdown text, converting it on demand through the same background jobs as the Convert
button (SPEC D17). Given only a base dir, the tools build those jobs from the settings.

One component owns the four tools: `UploadTools(...)` is built once with everything they
share (the data dir, the upload records, the conversion jobs, the auth mode), and its
`tools` attribute is what an agent gets. Each tool call makes the thread's handle once,
from the runtime context (`UploadTools.thread`), and works through it.

Wiring::

    tools = UploadTools(base_dir=settings.base_dir, upload_service=service).tools
    agent = create_agent(model, tools=tools, middleware=make_upload_middleware(...))
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Annotated
from typing import Any
from typing import TypeVar

from langchain_core.tools import BaseTool
from langchain_core.tools import InjectedToolArg
from langchain_core.tools import ToolException
from langchain_core.tools import tool

from deerflow_web.agent.messages import state_value
from deerflow_web.agent.runtime import app_database
from deerflow_web.agent.runtime import auth_required
from deerflow_web.agent.runtime import resolve_thread_paths
from deerflow_web.agent.runtime import thread_id_from
from deerflow_web.agent.runtime import thread_ref_from
from deerflow_web.agent.uploads_source import DirectoryUploadLister
from deerflow_web.agent.uploads_source import UploadLister
from deerflow_web.agent.uploads_source import usable_records
from deerflow_web.agent.vision import image_limits_for
from deerflow_web.agent.vision import vision_enabled
from deerflow_web.errors import DeerFlowError
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import VIRTUAL_UPLOADS_DIR
from deerflow_web.models import ImageLimits
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.prompt.document_text import DocumentTexts
from deerflow_web.services.prompt.file_access import FileToolFailure
from deerflow_web.services.prompt.file_access import UserDataFiles
from deerflow_web.services.prompt.file_access import run_file_tool
from deerflow_web.services.prompt.tool_listing import list_uploaded_files_result
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags as neutralize
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ArchiveLimits
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import ThreadPaths

logger = logging.getLogger(__name__)

Result = TypeVar("Result")

NO_RUNTIME = "No runtime context available."
THREAD_NOT_FOUND = "Thread not found."


class DocumentSource:
    """The conversion jobs the tools read documents through, built on first use.

    Built lazily so that making the tools touches nothing on disk, and from the settings
    (config.yaml, DEER_FLOW_HOME) when the caller gives no jobs, so that
    `UploadTools(base_dir=...)` alone reads documents like the app converts them.
    """

    def __init__(
        self,
        paths: ThreadPaths,
        *,
        upload_service: UploadLister | None = None,
        conversion_jobs: ConversionJobs | None = None,
        wait_seconds: float | None = None,
    ) -> None:
        self._paths = paths
        self._uploads = upload_service if isinstance(upload_service, UploadService) else None
        self._jobs = conversion_jobs
        self._wait = wait_seconds
        self._archives: ArchiveLimits | None = None
        self._lock = threading.Lock()

    def jobs(self) -> tuple[ConversionJobs, float]:
        """The jobs and the wait budget (`agent.read_conversion_wait_seconds`)."""
        with self._lock:
            if self._jobs is None or self._wait is None or self._archives is None:
                from deerflow_web.settings import load_settings  # reads config.yaml: only now

                settings = load_settings(self._paths.base_dir)
                self._archives = settings.archives
                if self._jobs is None:
                    # The app's database (`DATABASE_URL`): the jobs and records it keeps.
                    uploads = self._uploads or make_upload_service(
                        self._paths.base_dir,
                        settings.limits,
                        app_database(self._paths.base_dir, settings.database_url),
                        storage=settings.storage,
                    )
                    self._jobs = ConversionJobs(
                        uploads, settings.conversion, runs_jobs=settings.jobs.run_in_web
                    )
                if self._wait is None:
                    self._wait = settings.agent.read_conversion_wait_seconds
            return self._jobs, self._wait

    def for_thread(self, thread: ThreadFolders) -> DocumentTexts:
        """The documents of one thread."""
        jobs, wait = self.jobs()
        return DocumentTexts(jobs, thread, wait, self._archives or ArchiveLimits())


def _current_run_names(runtime: Any) -> set[str]:
    """Names in state `uploaded_files` (SPEC 4.6 step 4); unreadable state excludes nothing."""
    try:
        entries = state_value(getattr(runtime, "state", None), "uploaded_files") or []
        return {entry["filename"] for entry in entries if isinstance(entry, dict)}
    except (KeyError, TypeError):
        logger.warning("cannot read uploaded_files from the tool state", exc_info=True)
        return set()


class UploadTools:
    """`list_uploaded_files`, `read_file`, `glob` and `grep` over one data dir, and
    `view_image` when the model accepts pictures.

    Attributes:
        tools: The four tools, in that order (then `view_image` with vision), for
            `create_agent(tools=...)`.
        vision: Whether `view_image` is offered.
    """

    def __init__(
        self,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        paths: ThreadPaths | None = None,
        upload_service: UploadLister | None = None,
        conversion_jobs: ConversionJobs | None = None,
        read_wait_seconds: float | None = None,
        require_user: bool | None = None,
        vision: bool | None = None,
        model: Any = None,
        image_limits: ImageLimits | None = None,
    ) -> None:
        """Configure the tools.

        Args:
            base_dir: Data root; None uses the app's settings (as `paths` does when given:
                the app's own `ThreadPaths`).
            paths: A ready `ThreadPaths`, shared with the rest of the app, instead of
                `base_dir`; giving both is an error.
            upload_service: Source of upload records (the app's `UploadService` is also
                reused for document conversions); None derives the listing from the folder
                and reads no hard-linked file.
            conversion_jobs: The app's `ConversionJobs`, when the tools run in the app's
                process; None builds them from the settings on first use.
            read_wait_seconds: How long `read_file` and `grep` wait for a conversion; None
                uses `agent.read_conversion_wait_seconds`.
            require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
                follows the app's settings when they are used, else False.
            vision: True or False offers `view_image` or not; None follows `agent.vision`
                (app settings only), and `auto` asks `model`'s profile.
            model: The chat model, for `auto`.
            image_limits: `view_image`'s edge and pixel limits; None uses `agent.image_*`
                from the app's settings when they are used, else the defaults.

        Raises:
            ValueError: Both `base_dir` and `paths`.
        """
        if base_dir is not None and paths is not None:
            raise ValueError("give base_dir or paths, not both")
        uses_app_settings = base_dir is None and paths is None
        self.require_user = auth_required(require_user, uses_app_settings)
        self.vision = vision_enabled(vision, model, uses_app_settings=uses_app_settings)
        self.image_limits = image_limits_for(image_limits, uses_app_settings=uses_app_settings)
        self.paths = resolve_thread_paths(base_dir, paths)
        self.upload_service = upload_service
        self._lister: UploadLister = upload_service or DirectoryUploadLister(self.paths)
        self.documents = DocumentSource(
            self.paths,
            upload_service=upload_service,
            conversion_jobs=conversion_jobs,
            wait_seconds=read_wait_seconds,
        )
        self.tools: list[BaseTool] = [
            self._list_uploaded_files_tool(),
            self._read_file_tool(),
            self._glob_tool(),
            self._grep_tool(),
        ]
        if self.vision:
            self.tools.append(self._view_image_tool())

    def by_name(self) -> dict[str, BaseTool]:
        """The tools by their names."""
        return {t.name: t for t in self.tools}

    def thread(self, runtime: Any) -> ThreadFolders | None:
        """The run's thread for one tool call: validated once, its folders walked once;
        None when the run names no thread.

        Raises:
            ToolException: The mode needs a user id and the run has none, or an id is
                malformed.
        """
        try:
            ref = thread_ref_from(runtime, self.require_user)
        except DeerFlowError as error:
            raise ToolException(neutralize(str(error))) from error
        except ValueError as error:
            raise ToolException(str(error)) from error
        return None if ref is None else self.paths.folders(ref)

    def _files(self, runtime: Any, documents: bool) -> UserDataFiles:
        thread = self.thread(runtime)
        if thread is None:
            raise ToolException("No thread is attached to this run, so there are no files to read.")
        lister = self.upload_service

        def listed_upload(name: str) -> bool:
            return lister is not None and any(
                record.filename == name for record in lister.list_uploads(thread)
            )

        def withheld(name: str) -> str | None:  # virus scanning: only clean files are read
            if lister is None:
                return None
            return (usable_records(lister, thread)[1] or {}).get(name)

        try:
            texts = self.documents.for_thread(thread) if documents else None
            return UserDataFiles(thread, texts, listed_upload, withheld=withheld)
        except DeerFlowError as error:
            raise ToolException(neutralize(str(error))) from error

    def _in_thread(
        self,
        runtime: Any,
        verb: str,
        path: str,
        action: Callable[[UserDataFiles], Result],
        *,
        documents: bool = False,
    ) -> Result:
        """Run a file action in the run's thread; failures become messages the model can use."""
        files = self._files(runtime, documents)
        try:
            return run_file_tool(verb, path, lambda: action(files))
        except FileToolFailure as error:
            raise ToolException(str(error)) from error

    def _list_uploaded_files_tool(self) -> BaseTool:
        lister = self._lister
        thread_of = self.thread

        @tool(parse_docstring=True)
        def list_uploaded_files(
            include_outline: bool | list[str] = False,
            max_results: int = 20,
            query: str | None = None,
            extensions: list[str] | str | None = None,
            runtime: Annotated[Any, InjectedToolArg] = None,
        ) -> dict[str, Any]:
            """List files uploaded to this conversation in earlier turns, newest first.

            Files attached to the current message are already described in the upload block
            of that message and are not listed again.

            Args:
                include_outline: True to add the heading outline (or first lines) of every
                    listed document that has a Markdown version, or a list of exact filenames
                    that should get one.
                max_results: Maximum number of files to return, from 1 to 100.
                query: Case-insensitive part of a filename to look for.
                extensions: File extensions to keep, such as ["pdf", ".xlsx"].
            """
            if runtime is None and thread_id_from(runtime) is None:
                return {"files": [], "message": NO_RUNTIME}
            thread = thread_of(runtime)
            if thread is None:
                return {"files": [], "message": THREAD_NOT_FOUND}
            try:
                uploads_dir = thread.uploads_dir()
            except DeerFlowError as error:
                raise ToolException(neutralize(str(error))) from error
            withheld: dict[str, str] = {}

            def load_records() -> list[Any]:
                usable, held = usable_records(lister, thread)
                withheld.update(held or {})
                return usable

            result = list_uploaded_files_result(
                uploads_dir,
                load_records,
                current_names=_current_run_names(runtime),
                include_outline=include_outline,
                max_results=max_results,
                query=query,
                extensions=extensions,
            )
            if withheld:  # said why, so the model can tell the person
                result["withheld"] = [
                    {"filename": neutralize(name), "reason": reason}
                    for name, reason in withheld.items()
                ]
            return result

        list_uploaded_files.handle_tool_error = True
        return list_uploaded_files

    def _read_file_tool(self) -> BaseTool:
        in_thread = self._in_thread

        @tool(parse_docstring=True)
        def read_file(
            path: str,
            start_line: int | None = None,
            end_line: int | None = None,
            runtime: Annotated[Any, InjectedToolArg] = None,
        ) -> str:
            """Read a file of this conversation, with line numbers.

            PDF, Word, Excel and PowerPoint files are read as their Markdown text; the line
            numbers of a document outline refer to that text, so use them to read one
            section. At most 2000 lines are returned per call.

            Args:
                path: Absolute virtual path, such as /mnt/user-data/uploads/report.md.
                start_line: First line to read (1-based, inclusive); defaults to 1.
                end_line: Last line to read (inclusive); defaults to the end, within the limit.
            """
            return in_thread(
                runtime,
                "read",
                path,
                lambda files: files.read(path, start_line, end_line),
                documents=True,
            )

        read_file.handle_tool_error = True
        return read_file

    def _glob_tool(self) -> BaseTool:
        in_thread = self._in_thread

        @tool(parse_docstring=True)
        def glob(
            pattern: str,
            path: str = VIRTUAL_PATH_PREFIX,
            runtime: Annotated[Any, InjectedToolArg] = None,
        ) -> dict[str, Any]:
            """Find files by name pattern, such as '**/*.md' or '*.pdf'.

            `*` matches within one folder, `**` matches any number of folders.

            Args:
                pattern: Pattern relative to `path`.
                path: Folder to search, such as /mnt/user-data/uploads.
            """
            return in_thread(runtime, "list", path, lambda files: files.glob(pattern, path))

        glob.handle_tool_error = True
        return glob

    def _grep_tool(self) -> BaseTool:
        in_thread = self._in_thread

        @tool(parse_docstring=True)
        def grep(
            pattern: str,
            path: str = VIRTUAL_UPLOADS_DIR,
            glob: str | None = None,
            max_results: int = 50,
            runtime: Annotated[Any, InjectedToolArg] = None,
        ) -> dict[str, Any]:
            """Search file contents for a regular expression and return matching lines.

            PDF, Word, Excel and PowerPoint files are searched through their Markdown text.
            Documents whose text is not ready are listed under "skipped".

            Args:
                pattern: Python regular expression, such as 'revenue|income'.
                path: File or folder to search, such as /mnt/user-data/uploads.
                glob: Only search files whose name matches this pattern, such as '*.md'.
                max_results: Maximum number of matching lines to return, from 1 to 200.
            """
            return in_thread(
                runtime,
                "search",
                path,
                lambda files: files.grep(pattern, path, glob, max_results),
                documents=True,
            )

        grep.handle_tool_error = True
        return grep

    def _view_image_tool(self) -> BaseTool:
        """`view_image`: the tool message holds a short text and the picture as an image
        block, decoded, turned upright, shrunk and stripped like the pictures of a message
        (`services/prompt/images.py`); SVG, other files and paths outside the thread are
        refused with a message."""
        in_thread = self._in_thread
        limits = self.image_limits

        @tool(parse_docstring=True)
        def view_image(
            path: str,
            runtime: Annotated[Any, InjectedToolArg] = None,
        ) -> list[dict[str, Any]]:
            """Look at a picture of this conversation, such as one uploaded in an earlier turn.

            Pictures attached to the current message are already shown with it.

            Args:
                path: Absolute virtual path, such as /mnt/user-data/uploads/photo.jpg.
            """
            return in_thread(runtime, "view", path, lambda files: files.view_image(path, limits))

        view_image.handle_tool_error = True
        return view_image


def make_file_tools(**options: Any) -> list[BaseTool]:
    """`UploadTools(**options).tools`: the four tools (and `view_image` with vision), for a
    one-line `create_agent`."""
    return UploadTools(**options).tools
