"""The threads index: each thread of the user with its title, how much it holds, and when
it last changed.

Counts and sizes come from the upload records (SPEC D10), the single source of truth for
upload metadata; a thread without records (new, or holding only agent outputs) is still
listed, with its folder's time as its last change, so nothing on disk is invisible.
"""

from __future__ import annotations

from dataclasses import dataclass

from deerflow_web.models import ThreadRef
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.threads.catalog import folder_time
from deerflow_web.storage.records import UploadRecords


@dataclass(frozen=True)
class ThreadOverview:
    """One row of the threads index."""

    thread_id: str
    title: str | None
    file_count: int
    total_size: int
    last_change: float


def list_threads(
    catalog: ThreadCatalog,
    records: UploadRecords,
    user_id: str,
    *,
    query: str = "",
) -> list[ThreadOverview]:
    """The user's threads whose title or id contains `query`, newest change first (ties
    by id, for a stable order)."""
    summaries = {summary.scope: summary for summary in records.summaries()}
    paths = catalog.paths
    threads = []
    for thread in catalog.search(user_id, query=query, limit=None):
        ref = ThreadRef(thread.thread_id, user_id)
        on_disk = folder_time(paths, ref)
        summary = summaries.get(paths.scope(ref)) if on_disk else None
        last = max(on_disk, thread.updated_at)
        count, size = (0, 0)
        if summary is not None:  # records of a folder removed behind the app's back: none
            count, size = summary.file_count, summary.total_size
            last = max(last, summary.last_change)
        threads.append(ThreadOverview(thread.thread_id, thread.title, count, size, last))
    threads.sort(key=lambda t: t.thread_id)
    threads.sort(key=lambda t: t.last_change, reverse=True)
    return threads
