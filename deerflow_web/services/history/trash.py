"""The thread's trash: deleted uploads kept for `trash.days`, then purged.

A delete moves the file and the companions converted from it into
`{thread}/history/trash/{trash_id}/` in the transaction that drops their records, and
keeps those records in the trash entry, so a restore gives back the file as it was. Its
scan verdict comes back only when it is a clean one from the signatures clamd runs now;
else (scanned with older signatures, never scanned, scanning turned on since) the file is
scanned again first, and infected bytes stay in the trash (422). A restore goes through the upload
commit (`UploadService.commit_staged`) with the entry's bytes as its staged file, so the
name it lands on follows the upload rules: `fail` (409 when the name is taken now),
`rename` (the commit's `_N` numbering) or `replace` (the file holding the name becomes a
version, as any replace keeps one).

Expired entries are purged whenever a thread's trash is listed or written, and by
`purge_expired_trash(now)` for a periodic sweeper.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from deerflow_web.errors import InfectedFile
from deerflow_web.errors import InvalidOption
from deerflow_web.errors import TrashEntryNotFound
from deerflow_web.models import OnConflict
from deerflow_web.models import ScanState
from deerflow_web.models import ScanVerdict
from deerflow_web.models import UploadRecord
from deerflow_web.services.history.versions import FileScanner
from deerflow_web.services.history.versions import MovedIn
from deerflow_web.services.uploads.service import SavedFile
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.settings import HistorySettings
from deerflow_web.storage.history import TrashedFile
from deerflow_web.storage.history import delete_trashed
from deerflow_web.storage.history import expired_trash
from deerflow_web.storage.history import insert_trashed
from deerflow_web.storage.history import remove_quietly
from deerflow_web.storage.history import trashed_in
from deerflow_web.storage.history import trashed_one
from deerflow_web.storage.local import AtomicCommit
from deerflow_web.storage.local import staging_path
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.records import RecordsTransaction
from deerflow_web.storage.records import StoredRecord

logger = logging.getLogger(__name__)

DAY = 86400.0
_HEX = frozenset("0123456789abcdef")
# A restore's answer to a name taken meanwhile: the upload commit's own choices.
RESTORE_CONFLICTS = {
    "fail": OnConflict.REJECT,
    "rename": OnConflict.RENAME,
    "replace": OnConflict.REPLACE,
}


def restore_conflict(value: object) -> OnConflict:
    """`on_conflict` of a restore request (`fail` when absent).

    Raises:
        InvalidOption: Not one of fail, rename, replace.
    """
    if value is None:
        return OnConflict.REJECT
    if isinstance(value, str) and value in RESTORE_CONFLICTS:
        return RESTORE_CONFLICTS[value]
    raise InvalidOption("on_conflict must be one of: fail, rename, replace")


class Trash:
    """Move deleted uploads into the thread's trash, list, restore, delete and purge them."""

    def __init__(
        self,
        uploads: UploadService,
        settings: HistorySettings,
        *,
        scanner: FileScanner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.uploads = uploads
        self.settings = settings
        self.scanner = scanner  # None: scanning is off
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self.settings.trash_enabled

    @property
    def lifetime(self) -> float:
        return self.settings.trash_days * DAY

    def expires_at(self, entry: TrashedFile) -> float:
        return entry.deleted_at + self.lifetime

    # --- inside a delete's transaction ----------------------------------------------------

    def trash(
        self,
        txn: RecordsTransaction,
        folders: ThreadFolders,
        commit: AtomicCommit,
        stored: list[StoredRecord],
    ) -> str:
        """Move the files of `stored` (the file first) into a new trash entry; its id."""
        trash_id = secrets.token_hex(16)
        entry_dir = folders.trash_dir() / trash_id
        folders.make_dirs(entry_dir)
        uploads_dir = folders.uploads_dir()
        for one in stored:
            commit.rename(uploads_dir / one.record.filename, entry_dir / one.record.filename)
        main = stored[0].record
        insert_trashed(
            txn.connection,
            folders.scope,
            TrashedFile(
                trash_id,
                main.filename,
                main.sha256,
                sum(one.record.size for one in stored),
                self._clock(),
                folders.ref.user_id or None,
                tuple(one.record for one in stored),
            ),
        )
        return trash_id

    # --- what people see --------------------------------------------------------------------

    def list(self, thread: Thread) -> list[TrashedFile]:
        """The thread's trash, most recently deleted first (expired entries purged first)."""
        folders = self.uploads.folders(thread)
        self.purge_expired(folders)
        with self.uploads.records.engine.connect() as db:
            return trashed_in(db, folders.scope)

    def latest(self, thread: Thread, filename: str) -> TrashedFile | None:
        """The entry a delete of `filename` just made (for an "Undo" right after it)."""
        return next((e for e in self.list(thread) if e.filename == filename), None)

    def restore(
        self, thread: Thread, trash_id: str, on_conflict: OnConflict = OnConflict.REJECT
    ) -> UploadRecord:
        """Put an entry's file (and the companions that went with it) back in uploads/.

        Raises:
            TrashEntryNotFound: No such entry in this thread's trash.
            NameConflict: `fail` and the name is taken now.
        """
        folders = self.uploads.folders(thread)
        self.purge_expired(folders)
        entry = self._entry(folders, trash_id)
        entry_dir = folders.trash_dir() / trash_id
        uploads_dir = folders.uploads_dir()
        folders.make_dirs(uploads_dir)
        origin = entry_dir / entry.filename
        moved = MovedIn(staging_path(uploads_dir), origin)
        try:
            os.rename(origin, moved.path)
        except FileNotFoundError:
            raise TrashEntryNotFound(trash_id) from None
        companions = AtomicCommit()
        main = entry.record
        scope = folders.scope

        def companions_back(txn: RecordsTransaction, saved: list[SavedFile]) -> None:
            restored = saved[0].record
            kept = replace(
                restored,
                original_filename=main.original_filename
                if restored.filename == main.filename
                else restored.original_filename,
                uploaded_at=main.uploaded_at,
                source=main.source,
                conversion_state=main.conversion_state,
                conversion_error=main.conversion_error,
            )
            identity = txn.get(restored.filename)
            if identity is not None:
                txn.put(replace(identity, record=kept))
            for companion in entry.companions:
                self._companion_back(txn, folders, companions, entry_dir, companion, restored)
            delete_trashed(txn.connection, scope, [trash_id])

        try:
            verdict = self._verdict_now(main, moved.path)
            result = self.uploads.commit_staged(
                folders,
                entry.filename,
                moved,
                sha256=main.sha256,
                content_type=main.content_type,
                on_conflict=on_conflict,
                then=companions_back,
                verdict=verdict,
            )
        except BaseException:
            companions.undo()
            moved.discard()
            raise
        companions.forget_backups()
        remove_quietly([entry_dir])
        return result.files[0].record

    def _verdict_now(self, record: UploadRecord, path: Path) -> ScanVerdict | None:
        """The verdict a restored file comes back with: its own when it is clean by the
        signatures clamd runs now, else a new scan of its bytes (issue 28: a restore is an
        upload). Scanning off: the verdict it had.

        Raises:
            InfectedFile: Today's signatures find something; the file stays in the trash.
            ScannerUnavailable, TooLargeToScan: As the scanning policy says.
        """
        kept = ScanVerdict(record.scan_state, record.scan_signatures) if record.scan_state else None
        if self.scanner is None:
            return kept
        if (
            kept is not None
            and kept.state is ScanState.CLEAN
            and kept.signatures is not None
            and kept.signatures == self.scanner.signatures()
        ):
            return kept
        verdict = self.scanner.scan_file(path, record.filename)
        if verdict.state is ScanState.INFECTED:
            raise InfectedFile(record.filename, verdict.found or "unknown")
        return verdict

    def _companion_back(
        self,
        txn: RecordsTransaction,
        folders: ThreadFolders,
        commit: AtomicCommit,
        entry_dir: Path,
        companion: UploadRecord,
        restored: UploadRecord,
    ) -> None:
        """Put one companion back under its name if that is free now; else it stays out
        (conversion can make it again) and goes with the entry."""
        dest = folders.uploads_dir() / companion.filename
        source = entry_dir / companion.filename
        if os.path.lexists(dest) or txn.get(companion.filename) is not None:
            return
        if not os.path.isfile(source) or os.path.islink(source):
            return
        commit.rename(source, dest)
        info = dest.lstat()
        record = replace(companion, converted_from=restored.filename)
        txn.put(StoredRecord(record, info.st_mtime_ns, info.st_ino, info.st_ctime_ns))

    def delete(self, thread: Thread, trash_id: str) -> None:
        """Delete one entry for good.

        Raises:
            TrashEntryNotFound: No such entry in this thread's trash.
        """
        folders = self.uploads.folders(thread)
        self._check_id(trash_id)
        with self.uploads.records.locked(folders.scope) as txn:
            if trashed_one(txn.connection, folders.scope, trash_id) is None:
                raise TrashEntryNotFound(trash_id)
            delete_trashed(txn.connection, folders.scope, [trash_id])
        remove_quietly([folders.trash_dir() / trash_id])
        if not self.purge_expired(folders):
            self.uploads.collect_garbage(folders.scope)

    def empty(self, thread: Thread) -> int:
        """Delete every entry of the thread's trash for good; return how many went."""
        folders = self.uploads.folders(thread)
        with self.uploads.records.locked(folders.scope) as txn:
            entries = trashed_in(txn.connection, folders.scope)
            delete_trashed(txn.connection, folders.scope, [e.trash_id for e in entries])
        remove_quietly([folders.trash_dir() / e.trash_id for e in entries])
        self.uploads.collect_garbage(folders.scope)
        return len(entries)

    # --- expiry -------------------------------------------------------------------------------

    def purge_expired(self, folders: ThreadFolders) -> int:
        """Delete this thread's entries older than `trash.days`; return how many went."""
        before = self._clock() - self.lifetime
        with self.uploads.records.engine.connect() as db:
            expired = [e.trash_id for e in trashed_in(db, folders.scope) if e.deleted_at < before]
        if not expired:
            return 0
        with self.uploads.records.locked(folders.scope) as txn:
            delete_trashed(txn.connection, folders.scope, expired)
        remove_quietly([folders.trash_dir() / trash_id for trash_id in expired])
        self.uploads.collect_garbage(folders.scope)
        return len(expired)

    def purge_expired_trash(self, now: float | None = None) -> int:
        """Purge every thread's expired entries (for a periodic sweeper); how many went."""
        now = self._clock() if now is None else now
        engine = self.uploads.records.engine
        with engine.connect() as db:
            expired = expired_trash(db, now - self.lifetime)
        paths = self.uploads.paths
        removed = 0
        for scope, trash_id in expired:
            # Under the thread's records lock, which bumps its version: the quota's kept
            # sum of the thread, which counts the trash, is read afresh.
            with self.uploads.records.locked(scope) as txn:
                delete_trashed(txn.connection, scope, [trash_id])
            self.uploads.collect_garbage(scope)
            try:
                folder = paths.folders(paths.parse_scope(scope)).trash_dir()
            except (ValueError, OSError) as error:
                logger.warning(
                    "trash entry %s of %s: folder not removed: %s", trash_id, scope, error
                )
                continue
            remove_quietly([folder / trash_id])
            removed += 1
        if removed:
            logger.info("purged %d expired trash entr%s", removed, "y" if removed == 1 else "ies")
        return removed

    def _entry(self, folders: ThreadFolders, trash_id: str) -> TrashedFile:
        self._check_id(trash_id)
        with self.uploads.records.engine.connect() as db:
            entry = trashed_one(db, folders.scope, trash_id)
        if entry is None:
            raise TrashEntryNotFound(trash_id)
        return entry

    @staticmethod
    def _check_id(trash_id: str) -> None:
        if len(trash_id) != 32 or not set(trash_id) <= _HEX:
            raise TrashEntryNotFound(trash_id)
