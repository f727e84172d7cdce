"""The threads index: which threads exist, how much they hold, and new thread ids.

Counts and sizes come from the upload records (SPEC D10), the single source of truth for
upload metadata; a thread folder without records (new, or holding only agent outputs) is
still listed, with its folder's time as its last change, so nothing on disk is invisible.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import Area
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.records import UploadRecords


@dataclass(frozen=True)
class ThreadOverview:
    """One row of the threads index."""

    thread_id: str
    file_count: int
    total_size: int
    last_change: float


def _folder_time(paths: ThreadPaths, thread_id: str, user_id: str | None) -> float:
    """The newest mtime among the thread folder and its user-data areas.

    A folder that is a link is left out (never followed), so one planted link does not
    take the whole index down; the thread's own pages refuse it with a clear error.
    """
    folders: list[Callable[[], Path]] = [lambda: paths.thread_dir(thread_id, user_id)]
    folders.extend(partial(paths.area_dir, thread_id, area, user_id) for area in Area)
    times = []
    for folder in folders:
        try:
            times.append(os.stat(folder(), follow_symlinks=False).st_mtime)
        except (OSError, UnsafeFolder):
            continue
    return max(times, default=0.0)


def list_threads(
    paths: ThreadPaths, records: UploadRecords, user_id: str | None = None
) -> list[ThreadOverview]:
    """Every thread with a folder, newest change first (ties by id, for a stable order).

    Records of a thread whose folder was removed behind the app's back are not shown: the
    index lists what exists.
    """
    summaries = {summary.scope: summary for summary in records.summaries()}
    threads = []
    for thread_id in paths.iter_thread_ids(user_id):
        summary = summaries.get(paths.scope(thread_id, user_id))
        folder_time = _folder_time(paths, thread_id, user_id)
        if summary is None:
            threads.append(ThreadOverview(thread_id, 0, 0, folder_time))
        else:
            last = max(summary.last_change, folder_time)
            threads.append(ThreadOverview(thread_id, summary.file_count, summary.total_size, last))
    threads.sort(key=lambda t: t.thread_id)
    threads.sort(key=lambda t: t.last_change, reverse=True)
    return threads


def create_thread(paths: ThreadPaths, user_id: str | None = None) -> str:
    """Make a fresh thread (a UUID, as DeerFlow's ids are) with its folders, and return it.

    The folders are created right away so the new thread shows in the index even before
    the first upload.
    """
    thread_id = str(uuid.uuid4())
    paths.ensure_thread_dirs(thread_id, user_id)
    return thread_id
