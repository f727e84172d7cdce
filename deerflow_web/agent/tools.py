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

Wiring::

    tools = make_file_tools(base_dir=settings.base_dir, upload_service=service)
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
from deerflow_web.agent.runtime import auth_required
from deerflow_web.agent.runtime import required_user_id
from deerflow_web.agent.runtime import resolve_thread_paths
from deerflow_web.agent.runtime import thread_id_from
from deerflow_web.agent.uploads_source import DirectoryUploadLister
from deerflow_web.agent.uploads_source import UploadLister
from deerflow_web.agent.uploads_source import list_records
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
from deerflow_web.storage.paths import ThreadPaths

logger = logging.getLogger(__name__)

Result = TypeVar("Result")

NO_RUNTIME = "No runtime context available."
THREAD_NOT_FOUND = "Thread not found."


class DocumentSource:
    """The conversion jobs the tools read documents through, built on first use.

    Built lazily so that making the tools touches nothing on disk, and from the settings
    (config.yaml, DEER_FLOW_HOME) when the caller gives no jobs, so that
    `make_file_tools(base_dir=...)` alone reads documents like the app converts them.
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
        self._lock = threading.Lock()

    def jobs(self) -> tuple[ConversionJobs, float]:
        """The jobs and the wait budget (`agent.read_conversion_wait_seconds`)."""
        with self._lock:
            if self._jobs is None or self._wait is None:
                from deerflow_web.settings import load_settings  # reads config.yaml: only now

                settings = load_settings(self._paths.base_dir)
                if self._jobs is None:
                    uploads = self._uploads or make_upload_service(
                        self._paths.base_dir, settings.limits
                    )
                    self._jobs = ConversionJobs(uploads, settings.conversion)
                if self._wait is None:
                    self._wait = settings.agent.read_conversion_wait_seconds
            return self._jobs, self._wait

    def for_thread(self, thread_id: str, user_id: str | None) -> DocumentTexts:
        """The documents of one thread."""
        jobs, wait = self.jobs()
        return DocumentTexts(jobs, thread_id, user_id, wait)


def _current_run_names(runtime: Any) -> set[str]:
    """Names in state `uploaded_files` (SPEC 4.6 step 4); unreadable state excludes nothing."""
    try:
        entries = state_value(getattr(runtime, "state", None), "uploaded_files") or []
        return {entry["filename"] for entry in entries if isinstance(entry, dict)}
    except (KeyError, TypeError):
        logger.warning("cannot read uploaded_files from the tool state", exc_info=True)
        return set()


def _user_id(runtime: Any, require_user: bool) -> str | None:
    """The run's user; a tool error (never the flat layout) when accounts need one."""
    try:
        return required_user_id(runtime, require_user)
    except ValueError as error:
        raise ToolException(str(error)) from error


def _user_data(
    paths: ThreadPaths,
    runtime: Any,
    documents: DocumentSource | None,
    lister: UploadLister | None,
    require_user: bool,
) -> UserDataFiles:
    thread_id = thread_id_from(runtime)
    if thread_id is None:
        raise ToolException("No thread is attached to this run, so there are no files to read.")
    user_id = _user_id(runtime, require_user)

    def listed_upload(name: str) -> bool:
        return lister is not None and any(
            record.filename == name for record in list_records(lister, thread_id, user_id)
        )

    try:
        texts = documents.for_thread(thread_id, user_id) if documents is not None else None
        return UserDataFiles(paths, thread_id, user_id, texts, listed_upload)
    except DeerFlowError as error:
        raise ToolException(neutralize(str(error))) from error


def _in_thread(
    paths: ThreadPaths,
    runtime: Any,
    verb: str,
    path: str,
    action: Callable[[UserDataFiles], Result],
    documents: DocumentSource | None = None,
    lister: UploadLister | None = None,
    require_user: bool = False,
) -> Result:
    """Run a file action in the run's thread; failures become messages the model can use."""
    files = _user_data(paths, runtime, documents, lister, require_user)
    try:
        return run_file_tool(verb, path, lambda: action(files))
    except FileToolFailure as error:
        raise ToolException(str(error)) from error


def make_list_uploaded_files_tool(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    upload_service: UploadLister | None = None,
    paths: ThreadPaths | None = None,
    require_user: bool | None = None,
) -> BaseTool:
    """Build `list_uploaded_files` (SPEC 4.6 with D12's `query` and `extensions`).

    Args:
        base_dir: Data root; None uses the app's settings.
        upload_service: Source of upload records; None derives them from the folder.
        paths: A ready `ThreadPaths` (wins over base_dir).
        require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
            follows the app's settings when they are used, else False.
    """
    needs_user = auth_required(require_user, base_dir is None and paths is None)
    thread_paths = resolve_thread_paths(base_dir, paths)
    lister: UploadLister = upload_service or DirectoryUploadLister(thread_paths)

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
        thread_id = thread_id_from(runtime)
        if runtime is None and thread_id is None:
            return {"files": [], "message": NO_RUNTIME}
        if thread_id is None:
            return {"files": [], "message": THREAD_NOT_FOUND}
        user_id = _user_id(runtime, needs_user)
        try:
            uploads_dir = thread_paths.uploads_dir(thread_id, user_id)
        except DeerFlowError as error:
            raise ToolException(neutralize(str(error))) from error
        return list_uploaded_files_result(
            uploads_dir,
            lambda: list_records(lister, thread_id, user_id),
            current_names=_current_run_names(runtime),
            include_outline=include_outline,
            max_results=max_results,
            query=query,
            extensions=extensions,
        )

    list_uploaded_files.handle_tool_error = True
    return list_uploaded_files


def make_read_file_tool(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    paths: ThreadPaths | None = None,
    upload_service: UploadLister | None = None,
    conversion_jobs: ConversionJobs | None = None,
    read_wait_seconds: float | None = None,
    documents: DocumentSource | None = None,
    require_user: bool | None = None,
) -> BaseTool:
    """Build `read_file` over the thread's /mnt/user-data (text files, numbered lines).

    Args:
        base_dir: Data root; None uses the app's settings.
        paths: A ready `ThreadPaths` (wins over base_dir).
        upload_service: The app's `UploadService`, reused for document records.
        conversion_jobs: The app's `ConversionJobs`; None builds them from the settings.
        read_wait_seconds: How long a call waits for a conversion; None uses
            `agent.read_conversion_wait_seconds`.
        documents: A `DocumentSource` shared with `grep` (wins over the three above).
        require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
            follows the app's settings when they are used, else False.
    """
    needs_user = auth_required(require_user, base_dir is None and paths is None)
    thread_paths = resolve_thread_paths(base_dir, paths)
    source = documents or DocumentSource(
        thread_paths,
        upload_service=upload_service,
        conversion_jobs=conversion_jobs,
        wait_seconds=read_wait_seconds,
    )

    @tool(parse_docstring=True)
    def read_file(
        path: str,
        start_line: int | None = None,
        end_line: int | None = None,
        runtime: Annotated[Any, InjectedToolArg] = None,
    ) -> str:
        """Read a file of this conversation, with line numbers.

        PDF, Word, Excel and PowerPoint files are read as their Markdown text; the line
        numbers of a document outline refer to that text, so use them to read one section.
        At most 2000 lines are returned per call.

        Args:
            path: Absolute virtual path, such as /mnt/user-data/uploads/report.md.
            start_line: First line to read (1-based, inclusive); defaults to 1.
            end_line: Last line to read (inclusive); defaults to the end, within the limit.
        """
        return _in_thread(
            thread_paths,
            runtime,
            "read",
            path,
            lambda files: files.read(path, start_line, end_line),
            documents=source,
            lister=upload_service,
            require_user=needs_user,
        )

    read_file.handle_tool_error = True
    return read_file


def make_glob_tool(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    paths: ThreadPaths | None = None,
    upload_service: UploadLister | None = None,
    require_user: bool | None = None,
) -> BaseTool:
    """Build `glob`: find files by name pattern under the thread's /mnt/user-data."""
    needs_user = auth_required(require_user, base_dir is None and paths is None)
    thread_paths = resolve_thread_paths(base_dir, paths)

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
        return _in_thread(
            thread_paths,
            runtime,
            "list",
            path,
            lambda files: files.glob(pattern, path),
            lister=upload_service,
            require_user=needs_user,
        )

    glob.handle_tool_error = True
    return glob


def make_grep_tool(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    paths: ThreadPaths | None = None,
    upload_service: UploadLister | None = None,
    conversion_jobs: ConversionJobs | None = None,
    read_wait_seconds: float | None = None,
    documents: DocumentSource | None = None,
    require_user: bool | None = None,
) -> BaseTool:
    """Build `grep`: search the text of the thread's files with a regular expression.

    Documents are searched through their Markdown text, as `read_file` reads them; the
    arguments are `make_read_file_tool`'s.
    """
    needs_user = auth_required(require_user, base_dir is None and paths is None)
    thread_paths = resolve_thread_paths(base_dir, paths)
    source = documents or DocumentSource(
        thread_paths,
        upload_service=upload_service,
        conversion_jobs=conversion_jobs,
        wait_seconds=read_wait_seconds,
    )

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
        return _in_thread(
            thread_paths,
            runtime,
            "search",
            path,
            lambda files: files.grep(pattern, path, glob, max_results),
            documents=source,
            lister=upload_service,
            require_user=needs_user,
        )

    grep.handle_tool_error = True
    return grep


def make_view_image_tool(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    paths: ThreadPaths | None = None,
    upload_service: UploadLister | None = None,
    image_limits: ImageLimits | None = None,
    require_user: bool | None = None,
) -> BaseTool:
    """Build `view_image`: look at a picture of the thread (offered only with vision on).

    The tool message holds a short text and the picture as an image block, decoded,
    turned upright, shrunk and stripped like the pictures of a message
    (`services/prompt/images.py`); SVG, other files and paths outside the thread are
    refused with a message.

    Args:
        base_dir: Data root; None uses the app's settings.
        paths: A ready `ThreadPaths` (wins over base_dir).
        upload_service: Source of upload records (hard-linked uploads must be listed).
        image_limits: Edge and pixel limits; None uses `agent.image_*` from the app's
            settings when they are used, else the defaults.
        require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
            follows the app's settings when they are used, else False.
    """
    uses_app_settings = base_dir is None and paths is None
    needs_user = auth_required(require_user, uses_app_settings)
    thread_paths = resolve_thread_paths(base_dir, paths)
    limits = image_limits_for(image_limits, uses_app_settings=uses_app_settings)

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
        return _in_thread(
            thread_paths,
            runtime,
            "view",
            path,
            lambda files: files.view_image(path, limits),
            lister=upload_service,
            require_user=needs_user,
        )

    view_image.handle_tool_error = True
    return view_image


def make_file_tools(
    *,
    base_dir: str | os.PathLike[str] | None = None,
    upload_service: UploadLister | None = None,
    paths: ThreadPaths | None = None,
    conversion_jobs: ConversionJobs | None = None,
    read_wait_seconds: float | None = None,
    require_user: bool | None = None,
    vision: bool | None = None,
    model: Any = None,
    image_limits: ImageLimits | None = None,
) -> list[BaseTool]:
    """The four file tools (and `view_image` with vision), sharing one `ThreadPaths` and
    one set of conversion jobs.

    Args:
        base_dir: Data root; None uses the app's settings.
        upload_service: Source of upload records (the app's `UploadService` is also reused
            for document conversions); None derives the listing from the folder.
        paths: A ready `ThreadPaths` (wins over base_dir).
        conversion_jobs: The app's `ConversionJobs`, when the tools run in the app's
            process; None builds them from the settings on first use.
        read_wait_seconds: How long `read_file` and `grep` wait for a conversion; None
            uses `agent.read_conversion_wait_seconds`.
        require_user: Refuse runs without a user id (accounts on, SPEC 7.4); None
            follows the app's settings when they are used, else False.
        vision: True or False offers `view_image` or not; None follows `agent.vision`
            (app settings only), and `auto` asks `model`'s profile.
        model: The chat model, for `auto`.
        image_limits: `view_image`'s limits; None: `agent.image_*` or the defaults.
    """
    uses_app_settings = base_dir is None and paths is None
    needs_user = auth_required(require_user, uses_app_settings)
    thread_paths = resolve_thread_paths(base_dir, paths)
    documents = DocumentSource(
        thread_paths,
        upload_service=upload_service,
        conversion_jobs=conversion_jobs,
        wait_seconds=read_wait_seconds,
    )
    tools = [
        make_list_uploaded_files_tool(
            upload_service=upload_service, paths=thread_paths, require_user=needs_user
        ),
        make_read_file_tool(
            paths=thread_paths,
            upload_service=upload_service,
            documents=documents,
            require_user=needs_user,
        ),
        make_glob_tool(paths=thread_paths, upload_service=upload_service, require_user=needs_user),
        make_grep_tool(
            paths=thread_paths,
            upload_service=upload_service,
            documents=documents,
            require_user=needs_user,
        ),
    ]
    if vision_enabled(vision, model, uses_app_settings=uses_app_settings):
        tools.append(
            make_view_image_tool(
                paths=thread_paths,
                upload_service=upload_service,
                image_limits=image_limits_for(image_limits, uses_app_settings=uses_app_settings),
                require_user=needs_user,
            )
        )
    return tools
