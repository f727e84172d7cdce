"""Where the agent side gets a thread's upload records (SPEC D10).

In the app, the upload service provides the records (`list_uploads`), kept consistent with
the folder on every change. Without one (unit tests, a bare agent setup) the middleware and
the tool fall back to `DirectoryUploadLister`, which derives the same records from the
folder, so the agent code has one code path either way.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import os
import threading
from pathlib import Path
from typing import Protocol

from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.storage.filenames import is_companion_name
from deerflow_web.storage.local import is_foreign_link
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name

logger = logging.getLogger(__name__)

_HASH_CHUNK = 1024 * 1024
_MAX_CACHED_HASHES = 10_000


class UploadLister(Protocol):
    """The one method of the upload service the agent side needs."""

    def list_uploads(self, thread: ThreadFolders) -> list[UploadRecord]:
        """Return the thread's records; companions carry `converted_from`."""
        ...


class DirectoryUploadLister:
    """Records derived from the uploads folder, for setups without the upload service.

    Regular files only: symlinks and staging files are never listed (SPEC 1.7, 4.6 step 5).
    `X.md` counts as the companion of another file with stem `X` (SPEC 4.6 step 6), since
    the folder alone cannot tell who wrote it. Hashes are cached by file identity so a turn
    does not re-read unchanged files.
    """

    def __init__(self, paths: ThreadPaths) -> None:
        self._paths = paths
        self._hashes: dict[tuple[str, int, int, int], str] = {}
        self._lock = threading.Lock()

    def list_uploads(self, thread: Thread) -> list[UploadRecord]:
        """Return one record per regular file in the thread's uploads folder, by name
        (hard-linked files left out: no record can vouch for them)."""
        folders = thread if isinstance(thread, ThreadFolders) else self._paths.folders(thread)
        uploads_dir = folders.uploads_dir()
        if not uploads_dir.is_dir():
            return []
        entries = [
            entry
            for entry in os.scandir(uploads_dir)
            if entry.is_file(follow_symlinks=False)
            and not is_staging_name(entry.name)
            # without records, every hard-linked file may belong to someone else
            and not is_foreign_link(entry.stat(follow_symlinks=False), None)
        ]
        names = {entry.name for entry in entries}
        records = []
        for entry in sorted(entries, key=lambda item: item.name):
            try:
                records.append(self._record(entry, names))
            except OSError:
                logger.warning("skipping unreadable upload %s", entry.path, exc_info=True)
        return records

    def _record(self, entry: os.DirEntry[str], names: set[str]) -> UploadRecord:
        stat = entry.stat(follow_symlinks=False)
        return UploadRecord(
            filename=entry.name,
            size=stat.st_size,
            sha256=self._sha256(Path(entry.path), stat),
            content_type=mimetypes.guess_type(entry.name)[0] or "application/octet-stream",
            uploaded_at=stat.st_mtime,
            modified=stat.st_mtime,
            source=RecordSource.DISK,  # nothing but the folder vouches for it
            converted_from=_companion_of(entry.name, names),
        )

    def _sha256(self, path: Path, stat: os.stat_result) -> str:
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._hashes.get(key)
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
        value = digest.hexdigest()
        with self._lock:
            if len(self._hashes) >= _MAX_CACHED_HASHES:
                self._hashes.clear()  # a fallback cache; bounded beats clever
            self._hashes[key] = value
        return value


def _companion_of(name: str, names: set[str]) -> str | None:
    """The file whose companion `name` would be, by the stem rule; None if none."""
    originals = sorted(other for other in names if is_companion_name(name, other))
    return originals[0] if originals else None
