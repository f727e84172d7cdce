"""A thread's files under real paths, for an agent sandbox that cannot call our tools.

A sandbox that runs the agent's own shell or code mounts `/mnt/user-data` from a folder on
its machine. On the local backend that folder is the thread's own, always current. On the
S3 backend it is this machine's working copy of the bucket (`storage/objects/working_copy.py`),
current as of the moment it was last brought up to date: `materialise` does that and says
when, so a sandbox that ran for a while knows to ask again before it trusts what it reads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from deerflow_web.models import Area
from deerflow_web.models import ThreadRef
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name


@dataclass(frozen=True)
class SandboxFolder:
    """Where a thread's `/mnt/user-data` is on this machine, and how fresh it is."""

    path: Path  # the folder to mount as /mnt/user-data
    live: bool  # the thread's own folder (local backend): every change shows at once
    as_of: float  # seconds since the epoch: when uploads/ last matched the records
    uploads: int  # files in uploads/ at that moment


def materialise(thread: ThreadRef, paths: ThreadPaths) -> SandboxFolder:
    """Bring the thread's folder up to date with its records (fetching what this machine
    lacks on the S3 backend; nothing to do on the local one) and say where it is.

    `paths`: the folders as the app keeps them, resolved once and kept by the caller
    (`agent.runtime.resolve_thread_paths()` builds them from the app's settings, with the
    database and the bucket on S3).

    Raises:
        InvalidThreadId, UnsafeFolder: As any access to the thread's folders.
        ObjectStoreUnavailable: A file had to be fetched and the bucket cannot be reached.
    """
    folders = paths.folders(thread)
    uploads = folders.area_dir(Area.UPLOADS)  # fetched up to date first, on S3
    as_of = time.time()
    folders.make_dirs(uploads)  # a sandbox mounts a folder that exists, even empty
    with os.scandir(uploads) as entries:
        count = sum(
            1
            for entry in entries
            if entry.is_file(follow_symlinks=False) and not is_staging_name(entry.name)
        )
    return SandboxFolder(folders.user_data_dir(), paths.copies is None, as_of, count)
