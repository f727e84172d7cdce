"""Move the single-user layout's threads into one account (`flask users adopt-threads`).

The first release kept every thread under `{base}/threads/`; switching accounts on puts each
user's threads under `{base}/users/{id}/threads/`. Adopting moves the folders, re-keys
their upload records and records the ownership, so nothing is lost in the switch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.services.accounts.owners import ThreadOwners
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.records import DatabaseUploadRecords


@dataclass
class AdoptReport:
    """What adopting did: ids moved, and ids left where they were with the reason."""

    moved: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def adopt_flat_threads(
    paths: ThreadPaths, records: DatabaseUploadRecords, owners: ThreadOwners, user_id: str
) -> AdoptReport:
    """Move every flat-layout thread into the user's layout and make the user its owner.

    A thread id owned by someone else, or already present in the user's layout, is left
    in place and reported rather than merged or overwritten.
    """
    report = AdoptReport()
    for thread_id in sorted(paths.iter_thread_ids(None)):
        owner = owners.owner(thread_id)
        if owner is not None and owner != user_id:
            report.skipped.append((thread_id, "owned by another user"))
            continue
        target = paths.thread_dir(thread_id, user_id)
        if target.exists():
            report.skipped.append((thread_id, "already in the user's layout"))
            continue
        owners.claim(thread_id, user_id)
        paths.make_dirs(target.parent)
        os.rename(paths.thread_dir(thread_id), target)
        records.move_scope(paths.scope(thread_id), paths.scope(thread_id, user_id))
        report.moved.append(thread_id)
    return report
