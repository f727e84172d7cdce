"""Move the single-user layout's threads into one account (`flask users adopt-threads`).

The first release kept every thread under `{base}/threads/`; switching accounts on puts each
user's threads under `{base}/users/{id}/threads/`. Adopting moves the folders, re-keys
their upload records and their thread rows (title and metadata kept), so nothing is lost
in the switch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ThreadRef
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.storage.records import DatabaseUploadRecords


@dataclass
class AdoptReport:
    """What adopting did: ids moved, and ids left where they were with the reason."""

    moved: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def adopt_flat_threads(
    catalog: ThreadCatalog, records: DatabaseUploadRecords, user_id: str
) -> AdoptReport:
    """Move every flat-layout thread into the user's layout and make it one of theirs.

    A thread id the user already has is left in place and reported rather than merged
    or overwritten. Other users' threads are never in the way: ids are per user.
    """
    paths = catalog.paths
    report = AdoptReport()
    for thread_id in sorted(paths.iter_thread_ids(SINGLE_USER)):
        flat, owned = ThreadRef.single_user(thread_id), ThreadRef(thread_id, user_id)
        if catalog.exists(owned):
            report.skipped.append((thread_id, "the user already has a thread with this id"))
            continue
        target = paths.thread_dir(owned)
        paths.make_dirs(target.parent)
        os.rename(paths.thread_dir(flat), target)
        records.move_scope(paths.scope(flat), paths.scope(owned))
        catalog.adopt_flat(owned)
        report.moved.append(thread_id)
    return report
