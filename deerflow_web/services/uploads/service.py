"""The upload rules: limits, naming, conflicts, atomic commit, records, delete and rename.

`UploadService` is the one place these rules live; the JSON API, the HTML pages and the
agent side all call it with plain values. A request's files are streamed into staging
files first and only renamed into place once every part has arrived within the limits,
so a failed request never leaves a file behind and never costs a replaced file its bytes.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from pathlib import PurePosixPath
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from deerflow_web.concurrency import off_loop
from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import InvalidPath
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NoFilesProvided
from deerflow_web.errors import StorageFailure
from deerflow_web.errors import TooManyFiles
from deerflow_web.errors import TotalTooLarge
from deerflow_web.errors import UnsafeFilename
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import DOCUMENT_EXTENSIONS
from deerflow_web.models import Area
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import RecordSource
from deerflow_web.models import ScanState
from deerflow_web.models import ScanVerdict
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadLimits
from deerflow_web.models import UploadRecord
from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.artifacts import bucket_artifact
from deerflow_web.services.files.artifacts import resolve_artifact
from deerflow_web.services.quotas.policy import QuotaPolicy
from deerflow_web.settings import StorageSettings
from deerflow_web.storage.database import insert_missing_threads
from deerflow_web.storage.database import is_storage_full
from deerflow_web.storage.digest import hash_and_sniff
from deerflow_web.storage.filenames import ClaimedNames
from deerflow_web.storage.filenames import companion_name
from deerflow_web.storage.filenames import first_free_name
from deerflow_web.storage.filenames import is_companion_name
from deerflow_web.storage.filenames import normalize_filename
from deerflow_web.storage.filenames import reported_original
from deerflow_web.storage.history import remove_quietly
from deerflow_web.storage.local import AtomicCommit
from deerflow_web.storage.local import FileFacts
from deerflow_web.storage.local import StagingFile
from deerflow_web.storage.local import is_disk_full
from deerflow_web.storage.local import is_safe_destination
from deerflow_web.storage.local import scan_regular_files
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.objects import make_object_store
from deerflow_web.storage.objects.working_copy import IncomingCopy
from deerflow_web.storage.objects.working_copy import WorkingCopies
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.records import DatabaseUploadRecords
from deerflow_web.storage.records import RecordsTransaction
from deerflow_web.storage.records import StoredRecord
from deerflow_web.storage.records import UploadRecords

logger = logging.getLogger(__name__)

CHUNK_SIZE = 1024 * 1024
# Drift checks (see `UploadService.list_uploads`): a folder whose own change time is this
# recent is scanned anyway (a second change in the same timestamp tick would be invisible),
# and a folder is scanned in full at least this often, for edits in place behind our back.
SETTLED_SECONDS = 2.0
RESCAN_SECONDS = 60.0
VERIFIED_FOLDERS = 4096  # folders whose last clean scan each process remembers


@dataclass(frozen=True)
class SavedFile:
    """One stored file of an upload request, as the response reports it."""

    record: UploadRecord
    duplicate_of: str | None = None


@dataclass(frozen=True)
class RejectedFile:
    """A part that was not stored, as the client named it, and why: a name that can never
    be stored, or content the virus scanner refused (`found` names the signature)."""

    filename: str
    reason: str
    found: str | None = None
    sha256: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class UploadResult:
    """The outcome of one upload request (SPEC 2.1.6).

    `skipped_files` keeps DeerFlow's meaning (a safe name whose destination is a link or
    folder); `rejected_files` lists the names no destination could take, each with its
    reason, so no part of a request goes unmentioned.
    """

    files: list[SavedFile]
    skipped_files: list[str]
    rejected_files: list[RejectedFile] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """False as soon as one part of the request was not stored, for whatever reason."""
        return not self.skipped_files and not self.rejected_files

    @property
    def message(self) -> str:
        """The human summary DeerFlow's clients show."""
        text = f"Successfully uploaded {len(self.files)} file(s)"
        if self.skipped_files:
            text += f"; skipped {len(self.skipped_files)} unsafe file(s)"
        unusable = [r for r in self.rejected_files if r.found is None]
        if unusable:
            text += f"; rejected {len(unusable)} file(s) with an unusable name"
        if infected := len(self.rejected_files) - len(unusable):
            text += f"; refused {infected} infected file(s)"
        return text

    @property
    def infected(self) -> list[RejectedFile]:
        """The parts the virus scanner refused."""
        return [r for r in self.rejected_files if r.found is not None]


# Another write that must land in the commit's transaction, given what was stored.
AlsoInCommit = Callable[[RecordsTransaction, list["SavedFile"]], None]


class ContentScan(Protocol):
    """One file's virus scan while it streams (`services/scanning`)."""

    def feed(self, chunk: bytes | memoryview) -> None: ...
    def finish(self) -> ScanVerdict: ...
    def abort(self) -> None: ...


class ContentScanner(Protocol):
    """Opens a scan per file; None on the service when scanning is off."""

    def open(self, filename: str) -> ContentScan: ...


class FileHistory(Protocol):
    """Versions of replaced files and the trash of deleted ones (`services/history`);
    None on the service: a replace or a delete keeps nothing."""

    @property
    def trash_enabled(self) -> bool: ...

    def keep_version(
        self,
        txn: RecordsTransaction,
        folders: ThreadFolders,
        commit: AtomicCommit,
        *,
        area: Area,
        name: str,
        current: Path,
        sha256: str,
        size: int,
        content_type: str | None,
    ) -> list[Path]:
        """Keep the bytes at `current` as a version of `name`, in the transaction, before
        they are replaced; return the history files thinning let go, to remove once the
        transaction has committed."""
        ...

    def trash(
        self,
        txn: RecordsTransaction,
        folders: ThreadFolders,
        commit: AtomicCommit,
        stored: list[StoredRecord],
    ) -> str:
        """Move the files of `stored` (a file, then its companions) into the trash, in the
        transaction; return the trash entry's id."""
        ...

    def renamed(self, txn: RecordsTransaction, folders: ThreadFolders, old: str, new: str) -> None:
        """The versions of `old` follow the file to its new name."""
        ...

    def forget(self, txn: RecordsTransaction, folders: ThreadFolders, name: str) -> list[Path]:
        """Drop the versions of `name` (deleted for good); return their files to remove."""
        ...


class Staging(Protocol):
    """A staging file the commit renames into place: a multipart part's or a tus upload's."""

    path: Path

    def close(self) -> None: ...
    def discard(self) -> None: ...


@dataclass
class _Staged:
    """One staged part. `name` is where it is meant to go as the request was read; the
    commit decides again, under the records lock, from `requested` (see `_commit`)."""

    name: str
    requested: str
    staging: Staging
    sha256: str = ""
    content_type: str = ""
    client: str | None = None  # the multipart part's own filename, as the client wrote it
    scan: ContentScan | None = None  # fed while the part streams
    verdict: ScanVerdict | None = None  # the scanner's, once the part has ended
    incoming: IncomingCopy | None = None  # on S3: the bytes on their way to the bucket

    @property
    def original_filename(self) -> str | None:
        if self.client is not None:  # numbered, or composed to NFC: the client's own form
            return reported_original(self.client, self.name)
        return self.requested if self.name != self.requested else None


class _UploadBatch:
    """One request's parts: checked, streamed to staging files, then committed together.

    With `incoming` (the S3 backend: a thread's `WorkingCopies.open_incoming`) each part
    also streams into the bucket while it arrives, its upload completed where it ends
    (an incoming object, made the blob at push time); `discard` leaves nothing of them in
    the bucket.
    """

    def __init__(
        self,
        folder: Path,
        limits: UploadLimits,
        on_conflict: OnConflict,
        make_dirs: Callable[[Path], list[Path]],
        scanner: ContentScanner | None = None,
        incoming: Callable[[], IncomingCopy | None] | None = None,
        settle: Callable[[str], None] | None = None,
    ) -> None:
        self.folder = folder
        self.scanner = scanner
        self._open_incoming = incoming
        self._settle = settle
        self._make_dirs = make_dirs
        self.limits = limits
        self.on_conflict = on_conflict
        self.claimed = ClaimedNames()
        self.staged: list[_Staged] = []
        self.skipped: list[str] = []
        self.rejected: list[RejectedFile] = []
        self.count = 0
        self.total = 0
        self._created_dirs: list[Path] | None = None  # None: the folder is not checked yet

    def add(self, incoming: IncomingFile) -> None:
        """Check one part and stream it to a staging file, enforcing the limits as it goes."""
        self.count += 1
        if self.count > self.limits.max_files:
            raise TooManyFiles(self.limits.max_files)
        if not incoming.filename:
            return
        try:
            name = normalize_filename(incoming.filename)
        except UnsafeFilename as error:
            logger.info("rejecting upload %r: %s", incoming.filename, error)
            self.rejected.append(RejectedFile(incoming.filename, str(error)))
            return
        claimed = self.claim(name)
        if claimed is None:
            return
        self._ensure_folder()
        staging = StagingFile(self.folder)
        item = _Staged(claimed, name, staging, client=incoming.filename)
        self.staged.append(item)
        if self.scanner is not None:  # refuses here, unread, when it cannot scan
            item.scan = self.scanner.open(name)
        if self._open_incoming is not None:
            item.incoming = self._open_incoming()
        self._stream(incoming, item, staging)

    def adopt(self, name: str, staging: Staging, sha256: str, content_type: str) -> bool:
        """Take a file already staged and hashed (a finished resumable upload) into the batch.

        Returns False when its destination cannot be replaced.
        """
        self.count += 1
        claimed = self.claim(name)
        if claimed is None:
            return False
        self.staged.append(_Staged(claimed, name, staging, sha256, content_type))
        return True

    def claim(self, name: str) -> str | None:
        """The name a normalized file is meant for, by the `on_conflict` rule; None when
        its destination cannot be replaced (a link, a folder: SPEC 2.1.3).

        Decided before the body streams, so a conflict is refused without reading it; the
        commit decides again under the records lock, where the answer holds
        (`UploadService._commit`). On the S3 backend the name's file here is first made
        to match its record (`settle`), rather than the whole folder.

        Raises:
            NameConflict: `reject` and the name is taken.
        """
        if self._settle is not None:
            self._settle(name)
        exists = os.path.lexists
        if self.on_conflict is OnConflict.REJECT and exists(self.folder / name):
            raise NameConflict(name)
        on_disk = (
            (lambda n: exists(self.folder / n))
            if self.on_conflict is OnConflict.RENAME
            else (lambda _: False)
        )
        claimed = self.claimed.claim(name, also_taken=on_disk)
        if not is_safe_destination(self.folder / claimed):
            self.skipped.append(claimed)
            return None
        return claimed

    def _stream(self, incoming: IncomingFile, item: _Staged, staging: StagingFile) -> None:
        size = 0
        while chunk := incoming.stream.read(CHUNK_SIZE):
            size += len(chunk)
            self.total += len(chunk)
            if size > self.limits.max_file_size:
                raise FileTooLarge(item.name)
            if self.total > self.limits.max_total_size:
                raise TotalTooLarge()
            try:
                staging.write(chunk, hash_beside=incoming.piece_outlives_next_read())
            except OSError as error:
                if is_disk_full(error):
                    raise InsufficientStorage(item.name) from error
                raise StorageFailure(f"Failed to upload {incoming.filename}: {error}") from error
            if item.incoming is not None:
                item.incoming.write(chunk)  # waits only while the bucket is behind
            if item.scan is not None:
                item.scan.feed(chunk)  # scanned while it streams, not after
        item.sha256, item.content_type = staging.finish(item.name)
        if item.incoming is not None:
            # Its last part goes now, not at the commit: the next part of the request
            # streams with no buffer of this one held.
            item.incoming.finish()

    def _ensure_folder(self) -> None:
        """Create the folder (never through a link) once per request, not once per part:
        the walk was a tenth of a small file's cost. A link planted later is refused by
        the commit's own check, under the records lock, before any rename goes through."""
        if self._created_dirs is None:
            self._created_dirs = self._make_dirs(self.folder)  # innermost first, for rollback

    def screen(self) -> None:
        """Wait for each part's scan; take the infected parts out of the commit.

        Raises:
            ScannerUnavailable, TooLargeToScan: A part could not be scanned and the
                policy refuses it: the whole request is refused.
        """
        for item in self.staged:
            if item.scan is not None:
                item.verdict = item.scan.finish()
        for item in [i for i in self.staged if i.verdict and i.verdict.state is ScanState.INFECTED]:
            self.staged.remove(item)
            item.staging.discard()
            if item.incoming is not None:
                item.incoming.discard()
            found = item.verdict.found if item.verdict else None
            self.rejected.append(
                RejectedFile(
                    item.client or item.requested,
                    f"The virus scanner found {found}; the file was not stored",
                    found=found or "unknown",
                    sha256=item.sha256,
                    size=item.staging.size if isinstance(item.staging, StagingFile) else None,
                )
            )

    def discard(self) -> None:
        """Remove every staging file, any folder this request created, and (on S3) what
        the parts sent to the bucket."""
        for item in self.staged:
            if item.scan is not None:
                item.scan.abort()
            if item.incoming is not None:
                item.incoming.discard()
            item.staging.discard()
        for folder in self._created_dirs or ():
            try:
                folder.rmdir()
            except OSError:
                break  # not empty: something else lives there now


def _record_from_disk(
    name: str, facts: FileFacts, sha256: str, content_type: str, previous: UploadRecord | None
) -> UploadRecord:
    modified = facts.mtime_ns / 1e9
    if previous is None:
        return UploadRecord(
            name,
            facts.size,
            sha256,
            content_type,
            uploaded_at=modified,
            modified=modified,
            source=RecordSource.DISK,
        )
    same_bytes = previous.sha256 == sha256  # new bytes have not been scanned
    return replace(
        previous,
        size=facts.size,
        sha256=sha256,
        content_type=content_type,
        modified=modified,
        scan_state=previous.scan_state if same_bytes else None,
        scan_signatures=previous.scan_signatures if same_bytes else None,
    )


def _folder_signature(folder: Path) -> tuple[int, int, int] | None:
    """What changes when a name in the folder is added, removed or renamed; None if absent."""
    try:
        info = folder.stat()
    except OSError:
        return None
    return (info.st_ino, max(info.st_mtime_ns, info.st_ctime_ns), info.st_mtime_ns)


def _in_sync(on_disk: dict[str, FileFacts], stored: list[StoredRecord]) -> bool:
    return len(on_disk) == len(stored) and all(
        on_disk.get(s.record.filename) == _recorded_facts(s, on_disk) for s in stored
    )


def _recorded_facts(stored: StoredRecord, on_disk: dict[str, FileFacts]) -> FileFacts:
    """The facts a record describes; a record without a ctime (an earlier release) takes
    the disk's, so listing it costs no hash (its next use checks it, `files/freshness.py`)."""
    found = on_disk.get(stored.record.filename)
    ctime_ns = stored.ctime_ns if stored.ctime_ns is not None or found is None else found.ctime_ns
    return FileFacts(stored.record.size, stored.mtime_ns, stored.inode, ctime_ns or 0)


class UploadService:
    """Save, list, rename and delete the files of a thread's uploads folder."""

    def __init__(
        self,
        paths: ThreadPaths,
        records: UploadRecords,
        limits: UploadLimits,
        *,
        clock: Callable[[], float] = time.time,
        scanner: ContentScanner | None = None,
        quotas: QuotaPolicy | None = None,
    ) -> None:
        self.paths = paths
        self.records = records
        self.limits = limits
        self.scanner = scanner  # None: scanning is off
        self.history: FileHistory | None = None  # set by the wiring: versions and trash
        self.quotas = quotas  # None: nobody's storage is bounded
        self._clock = clock
        # scope -> (folder signature, monotonic time) of the last scan that matched records
        self._verified: OrderedDict[str, tuple[tuple[int, int, int], float]] = OrderedDict()

    def folders(self, thread: Thread) -> ThreadFolders:
        """The handle's folders: `thread` itself, or a fresh walk for a bare `ThreadRef`."""
        return thread if isinstance(thread, ThreadFolders) else self.paths.folders(thread)

    def uploads_dir(self, thread: Thread) -> Path:
        """The thread's uploads folder (checked, not created)."""
        return self.folders(thread).uploads_dir()

    def save_uploads(
        self,
        thread: Thread,
        files: Iterable[IncomingFile],
        *,
        on_conflict: OnConflict = OnConflict.REPLACE,
    ) -> UploadResult:
        """Store a request's files atomically: all of them, or none and nothing changed.

        Raises:
            InvalidThreadId, TooManyFiles, FileTooLarge, TotalTooLarge, NameConflict,
            InsufficientStorage, NoFilesProvided: nothing was written.
        """
        folders = self.folders(thread)
        copies = self.paths.copies
        batch = _UploadBatch(
            folders.uploads_area(),
            self.limits,
            OnConflict(on_conflict),
            folders.make_dirs,
            self.scanner,
            (lambda: copies.open_incoming(folders.scope)) if copies is not None else None,
            self._settle_name(folders, OnConflict(on_conflict)),
        )
        try:
            for incoming in files:
                batch.add(incoming)
            if batch.count == 0:
                raise NoFilesProvided()
            batch.screen()  # every verdict in before anything is committed
            self._push_staged(folders, batch)
            saved = self._commit(folders, batch)
        except BaseException:
            batch.discard()
            raise
        finally:
            folders.forget_records()
        return UploadResult(saved, batch.skipped, batch.rejected)

    def commit_staged(
        self,
        thread: Thread,
        name: str,
        staging: Staging,
        *,
        sha256: str,
        content_type: str,
        on_conflict: OnConflict = OnConflict.REPLACE,
        then: AlsoInCommit | None = None,
        verdict: ScanVerdict | None = None,
        reserved: int = 0,
    ) -> UploadResult:
        """Commit one file staged elsewhere (a finished resumable upload) exactly as a
        multipart part is committed: the same naming, conflict, record and duplicate rules.

        The staging file must sit in the thread's uploads folder. Renamed into place on
        success; otherwise left where it is, for the caller to discard (a refusal) or to
        commit again later (a failure: a database outage, a full disk). `then` writes in
        the commit's own transaction (where it releases the `reserved` bytes the quota
        held for the file, see `_commit`).

        Raises:
            NameConflict: `reject` and the name exists now.
            UnsafeFilename: The name is reserved or its destination cannot be replaced.
        """
        folders = self.folders(thread)
        batch = _UploadBatch(
            folders.uploads_area(),
            self.limits,
            OnConflict(on_conflict),
            folders.make_dirs,
            settle=self._settle_name(folders, OnConflict(on_conflict)),
        )
        if not batch.adopt(name, staging, sha256, content_type):
            raise UnsafeFilename(f"{name} cannot be stored: a link or a folder has that name")
        batch.staged[-1].verdict = verdict
        self._push_staged(folders, batch)
        try:
            saved = self._commit(folders, batch, then, reserved)
        finally:
            folders.forget_records()
        if not saved:
            raise UnsafeFilename(f"{name} cannot be stored: a link or a folder has that name")
        return UploadResult(saved, [])

    def _settle_name(
        self, folders: ThreadFolders, on_conflict: OnConflict
    ) -> Callable[[str], None] | None:
        """On the S3 backend, what an upload does before it claims a name: that name's file
        here made to match its record (gone if another instance deleted it; fetched when
        a replace is to keep those bytes as a version), so the conflict rule and the
        versions see the records. Only the names the upload touches: a thread of
        thousands of files is not fetched to add one. None on local disk, where the
        folder is the truth."""
        copies = self.paths.copies
        if copies is None:
            return None
        fetch = on_conflict is OnConflict.REPLACE
        return lambda name: copies.hydrate_file(folders, name, fetch=fetch)

    def collect_garbage(self, scope: str) -> None:
        """After bytes were let go for good (a delete, an expiry, a version thinned out):
        on the S3 backend, the blobs nothing names any more leave the bucket."""
        copies = self.paths.copies
        if copies is not None:
            copies.collect_garbage(scope)

    def _push_staged(self, folders: ThreadFolders, batch: _UploadBatch) -> None:
        """On the S3 backend, the staged bytes into the bucket before the commit takes the
        thread's lock: the commit's own check then finds them there (`working_copy`).
        A part that streamed into the bucket as it arrived is adopted (a server-side
        copy); one below a part, or staged elsewhere (a resumable upload), is pushed."""
        copies = self.paths.copies
        if copies is not None:
            for item in batch.staged:
                copies.store_staged(folders.scope, item.staging.path, item.sha256, item.incoming)

    def _commit(
        self,
        folders: ThreadFolders,
        batch: _UploadBatch,
        then: AlsoInCommit | None = None,
        reserved: int = 0,
    ) -> list[SavedFile]:
        """Rename the batch's staging files into place and write their records, as one step.

        The `on_conflict` rule is applied again here, under the records lock (one writer of
        the thread at a time, across processes and instances), against the folder and the
        records as they are now: a name another request committed while this one streamed
        is taken, so `rename` numbers past it, `reject` refuses, and `replace` replaces it
        with this request's bytes and a record of those bytes (`_commit_name`). `then`
        writes in the same transaction, once something was stored. The owner's quota is
        checked last, in the transaction, against what the commit added less what it
        replaced and the `reserved` bytes `then` released. A failure anywhere,
        the transaction's own commit included, moves every file back to its staging name
        and every replaced or removed file back into place, so disk and records stay as
        they were.
        """
        commit = AtomicCommit()
        saved: list[SavedFile] = []
        current = ""
        let_go: list[Path] = []  # history files thinning dropped, removed once committed
        replaced_bytes = False  # bytes some record named before may be named by none now
        with all_or_nothing(commit, lambda: current, lambda: f"Failed to upload {current}"):
            with self.records.locked(folders.scope) as txn:
                # The owner's quota, checked in this transaction once its writes are in
                # (a refusal rolls it back and the renames with it).
                admission = (
                    self.quotas.admit(txn.connection, folders.ref.user_id, folders.scope)
                    if self.quotas is not None
                    else None
                )
                # Streaming took a while: a link planted meanwhile is refused before any
                # rename goes through it.
                folders.recheck(batch.folder)
                # Only the records this batch's names and bytes touch are read, and the
                # new ones are written together: a commit costs the same in a thread of
                # ten files or of ten thousand, and little more per file than the renames.
                seen = txn.names_by_sha256(item.sha256 for item in batch.staged)
                known = txn.get_many(item.name for item in batch.staged)
                written: list[StoredRecord] = []
                committed: set[str] = set()
                released = 0  # bytes the commit frees in the records, for the quota
                for item in batch.staged:
                    item.name = current = _commit_name(txn, batch, item, committed)
                    dest = batch.folder / item.name
                    if not is_safe_destination(dest):  # became a link while we streamed
                        item.staging.discard()
                        batch.skipped.append(item.name)
                        continue
                    previous = known[item.name] if item.name in known else txn.get(item.name)
                    kept_as_version = (
                        self.history is not None
                        and previous is not None
                        and previous.record.sha256 != item.sha256
                        and os.path.lexists(dest)
                    )
                    if kept_as_version:
                        # The bytes being replaced stay reachable as a version: a second
                        # name (a link, no copy) made before the rename, undone with it.
                        # They stay counted; the versions thinning drops are freed.
                        dropped = self.history.keep_version(
                            txn,
                            folders,
                            commit,
                            area=Area.UPLOADS,
                            name=item.name,
                            current=dest,
                            sha256=previous.record.sha256,
                            size=previous.record.size,
                            content_type=previous.record.content_type,
                        )
                        let_go += dropped
                        released += sum(_size_on_disk(path) for path in dropped)
                    elif previous is not None:
                        released += previous.record.size
                    commit.rename(item.staging.path, dest)
                    committed.add(item.name)
                    if previous is not None and previous.record.sha256 != item.sha256:
                        replaced_bytes = True
                        txn.put_many(written)  # a companion may be among them
                        written.clear()
                        freed: list[int] = []
                        dropped = self._drop_companions(txn, batch.folder, item.name, commit, freed)
                        known.update(dict.fromkeys(dropped))
                        released += sum(freed)
                    stored = self._stored_in_place(dest, item)
                    written.append(stored)
                    saved.append(SavedFile(stored.record, seen.get(item.sha256)))
                    seen.setdefault(item.sha256, item.name)
                txn.put_many(written)
                if saved and self.paths.copies is not None:
                    # The thread's row: on the S3 backend no instance's folder marks it.
                    self._make_thread_row(txn, folders.ref)
                if then is not None and saved:
                    then(txn, saved)
                if admission is not None and saved:
                    admission.check(sum(s.record.size for s in saved), released, reserved)
        if admission is not None:
            admission.committed()
        for item in batch.staged:
            item.staging.close()  # held (locked) until the records said so too
        remove_quietly(let_go)
        if replaced_bytes:
            self.collect_garbage(folders.scope)
        return saved

    def _make_thread_row(self, txn: RecordsTransaction, ref: ThreadRef) -> None:
        now = self._clock()
        row = {
            "user_id": ref.user_id,
            "thread_id": ref.thread_id,
            "title": None,
            "metadata": "{}",
            "created_at": now,
            "updated_at": now,
        }
        insert_missing_threads(txn.connection, [row])

    def _stored_in_place(self, dest: Path, item: _Staged) -> StoredRecord:
        """The record of a staged part just renamed to `dest`, with the file's identity."""
        info = dest.lstat()
        record = UploadRecord(
            filename=item.name,
            size=info.st_size,
            sha256=item.sha256,
            content_type=item.content_type,
            uploaded_at=self._clock(),
            modified=info.st_mtime_ns / 1e9,
            original_filename=item.original_filename,
            scan_state=item.verdict.state if item.verdict else None,
            scan_signatures=item.verdict.signatures if item.verdict else None,
        )
        return StoredRecord(record, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)

    def list_uploads(self, thread: Thread) -> list[UploadRecord]:
        """The thread's records in code-point name order, reconciled with the folder first.

        A file added, removed or renamed behind the app's back changes the folder's own
        mtime/ctime, so the folder is scanned (one `stat` per file) only when that signature
        differs from the one seen at the last scan that matched the records, when it is too
        recent to trust, or once every `RESCAN_SECONDS`; otherwise the records are the answer
        as they stand. Every change the app makes goes through a rename or unlink in the
        folder, so it moves the signature too. An edit in place behind the app's back (same
        name, new bytes, the folder untouched) is noticed at the next change of the folder
        or the next periodic scan, whichever comes first.
        """
        folders = self.folders(thread)
        if self.paths.copies is not None:
            # On the S3 backend the folder is a copy of the records, never their source.
            records = [s.record for s in self.records.all(folders.scope)]
            folders.remember_records(records)
            return records
        folder = folders.uploads_dir()
        scope = folders.scope
        signature = _folder_signature(folder)
        now = time.monotonic()
        verified = self._verified.get(scope)
        if (
            signature is not None
            and verified is not None
            and verified[0] == signature
            and now - verified[1] < RESCAN_SECONDS
        ):
            records = [s.record for s in self.records.all(scope)]
            folders.remember_records(records)
            return records
        stored = self.records.all(scope)
        on_disk = scan_regular_files(folder, {s.record.filename: s.inode for s in stored})
        if _in_sync(on_disk, stored):
            records = [s.record for s in stored]
        else:
            records = self._reconcile(scope, folder, on_disk, stored)
        self._remember_scan(scope, signature, now)
        folders.remember_records(records)
        return records

    def records_of(self, thread: Thread) -> list[UploadRecord]:
        """The handle's records: listed (`list_uploads`) on first use, then as the writes
        made through the handle left them, so a request or a tool call lists once. A bare
        `ThreadRef` is listed afresh."""
        folders = self.folders(thread)
        cached = folders.cached_records()
        return cached if cached is not None else self.list_uploads(folders)

    def _remember_scan(
        self, scope: str, signature: tuple[int, int, int] | None, started: float
    ) -> None:
        """Trust `signature` (taken before the scan) once it is older than a timestamp tick."""
        if signature is None or time.time_ns() - signature[1] < SETTLED_SECONDS * 1e9:
            self._verified.pop(scope, None)
            return
        self._verified[scope] = (signature, started)
        self._verified.move_to_end(scope)
        while len(self._verified) > VERIFIED_FOLDERS:
            self._verified.popitem(last=False)

    def _reconcile(
        self, scope: str, folder: Path, on_disk: dict[str, FileFacts], stored: list[StoredRecord]
    ) -> list[UploadRecord]:
        known = {s.record.filename: _recorded_facts(s, on_disk) for s in stored}
        # Hashed outside the lock (a large file must not stall other writers) and off the
        # event loop (a large file must not stall other connections).
        hashed = off_loop(_hash_changed, folder, on_disk, known)
        try:
            with self.records.locked(scope) as txn:
                current = scan_regular_files(
                    folder, {s.record.filename: s.inode for s in txn.all()}
                )
                for s in txn.all():
                    if s.record.filename not in current:
                        txn.delete(s.record.filename)
                for name, (facts, sha256, content_type) in hashed.items():
                    if current.get(name) != facts:
                        continue  # changed again meanwhile; the next listing catches up
                    previous = txn.get(name)
                    record = _record_from_disk(
                        name, facts, sha256, content_type, previous.record if previous else None
                    )
                    txn.put(StoredRecord(record, facts.mtime_ns, facts.inode, facts.ctime_ns))
                return [s.record for s in txn.all()]
        except (DBAPIError, sqlite3.Error) as error:
            if not is_storage_full(error):
                raise
            # A full disk must not stop anyone from seeing their files (nor from deleting
            # some to free space): answer what the folder holds, store it once there is room.
            logger.warning("records of %s not reconciled: storage full", scope)
            return _as_found(stored, on_disk, hashed)

    def presigned_download(self, thread: Thread, virtual_path: str) -> str | None:
        """Where the bucket serves an upload asked for as a download, when
        `storage.s3.presigned_downloads` is on: its URL, else None (the app serves it).
        Only a file of uploads/ itself qualifies (its record names its bytes); the copy
        here is not fetched for it."""
        copies = self.paths.copies
        if copies is None or not copies.presigned_downloads:
            return None
        name = ThreadFolders.upload_named(virtual_path)
        if name is None:
            return None
        folders = self.folders(thread)
        stored = self.records.get(folders.scope, name)
        return None if stored is None else copies.download_url(folders.scope, stored.record)

    def resolve_artifact(
        self, thread: Thread, virtual_path: str, *, from_bucket: bool = False
    ) -> Artifact:
        """A file of the thread's user-data to send, hard links in uploads/ served only when
        the listing includes them (see `resolve_artifact`).

        `from_bucket`: the caller only sends the bytes (a download). On the S3 backend an
        upload this instance's copy lacks is then streamed from the bucket
        (`Artifact.in_bucket`, opened by `freshness.open_artifact`) instead of fetched
        here first: the first byte leaves when the bucket sends it, and a `Range` request
        fetches its range alone.
        """
        folders = self.folders(thread)
        copies = self.paths.copies
        if from_bucket and copies is not None:
            name = folders.upload_named(virtual_path)
            stored = None if name is None else copies.lacks(folders, name)
            if stored is not None:
                record = stored.record
                return bucket_artifact(
                    folders.area_location(Area.UPLOADS) / record.filename,
                    record,
                    lambda: copies.read_head(folders.scope, record),
                )
        return resolve_artifact(
            folders,
            virtual_path,
            lambda name: any(r.filename == name for r in self.records_of(folders)),
        )

    def get_upload(self, thread: Thread, filename: str) -> UploadRecord:
        """One upload's record.

        Raises:
            UploadNotFound: No regular file of that name.
        """
        for record in self.records_of(thread):
            if record.filename == filename:
                return record
        raise UploadNotFound(filename)

    def delete_upload(self, thread: Thread, filename: str, *, permanent: bool = False) -> list[str]:
        """Delete one upload and the companion conversion made from it; return what went.

        With the trash on (and not `permanent`) both are moved into the thread's trash,
        from where they can be restored; otherwise (and on a full disk, where a delete is
        how space is freed) they are deleted for good, with the file's versions. A symlink
        is never followed (SPEC D7): it is reported as not found. A `.md` the user uploaded
        is never removed by the cascade (D8).
        """
        _check_single_segment(filename)
        folders = self.folders(thread)
        folder = folders.uploads_dir()
        self._require_regular_file(folder / filename, filename)
        self.list_uploads(folders)  # fresh records: the cascade relies on them
        if self.history is not None and self.history.trash_enabled and not permanent:
            try:
                return self._trash_upload(folders, filename)
            except (InsufficientStorage, DBAPIError, sqlite3.Error) as error:
                if not isinstance(error, InsufficientStorage) and not is_storage_full(error):
                    raise
                # Nothing was moved (the step was undone). On a full disk deleting is how
                # space is freed, and the trash cannot take the file without room for its
                # row: the delete goes for good, as it did before there was a trash.
                logger.warning("storage full: %s deleted for good, not into the trash", filename)
        let_go: list[Path] = []
        # The bytes go first: on a full disk, deleting is how space is freed, and the
        # records' write then has room (a record left behind is dropped by the next
        # listing's reconciliation).
        folders.forget_records()
        with self.records.locked(folders.scope) as txn:
            try:
                (folder / filename).unlink()
            except FileNotFoundError as error:
                raise UploadNotFound(filename) from error
            except OSError as error:
                raise StorageFailure(f"Failed to delete {filename}: {error}") from error
            txn.delete(filename)
            if self.history is not None:
                let_go = self.history.forget(txn, folders, filename)
            gone = [filename, *self._drop_companions(txn, folder, filename)]
        remove_quietly(let_go)
        self.collect_garbage(folders.scope)
        return gone

    def _trash_upload(self, folders: ThreadFolders, filename: str) -> list[str]:
        """Move an upload and its companions into the trash, records and all, in one step."""
        assert self.history is not None
        folder = folders.uploads_dir()
        folders.forget_records()
        commit = AtomicCommit()
        with all_or_nothing(commit, lambda: filename, lambda: f"Failed to delete {filename}"):
            with self.records.locked(folders.scope) as txn:
                stored = txn.get(filename)
                if stored is None or not os.path.lexists(folder / filename):
                    raise UploadNotFound(filename)
                companions = self._companions(txn, filename)
                # A companion whose name became a link or a folder loses its record only,
                # as a delete's cascade does (`_drop_companions`).
                moved = [c for c in companions if _is_present_file(folder / c.record.filename)]
                self.history.trash(txn, folders, commit, [stored, *moved])
                names = [filename, *(c.record.filename for c in companions)]
                for name in names:
                    txn.delete(name)
        return names

    def quarantine_upload(
        self, thread: Thread, filename: str, sha256: str, destination: Path
    ) -> bool:
        """Move an upload (and the companions made from it) out of the thread, to
        `destination`, if its record still describes the bytes that were scanned
        (`sha256`); False when it changed or went meanwhile. `destination` must be on the
        data dir's file system (a rename)."""
        folders = self.folders(thread)
        folder = folders.uploads_dir()
        with self.records.locked(folders.scope) as txn:
            stored = txn.get(filename)
            if stored is None or stored.record.sha256 != sha256:
                return False
            try:
                os.replace(folder / filename, destination)
            except FileNotFoundError:
                return False
            txn.delete(filename)
            self._drop_companions(txn, folder, filename)
        self.collect_garbage(folders.scope)  # infected bytes leave the bucket at once
        return True

    def _drop_companions(
        self,
        txn: RecordsTransaction,
        folder: Path,
        original: str,
        commit: AtomicCommit | None = None,
        sizes: list[int] | None = None,
    ) -> list[str]:
        """Delete the `.md` files converted from `original`; return their names (and add
        their sizes to `sizes`). With `commit`, each is only set aside until the commit
        holds (`AtomicCommit.remove`)."""
        dropped = []
        for stored in self._companions(txn, original):
            record = stored.record
            path = folder / record.filename
            if is_safe_destination(path) and path.exists():
                if commit is None:
                    path.unlink()
                else:
                    commit.remove(path)
            txn.delete(record.filename)
            dropped.append(record.filename)
            if sizes is not None:
                sizes.append(record.size)
        return dropped

    @staticmethod
    def _companions(txn: RecordsTransaction, original: str) -> list[StoredRecord]:
        """The records of the `.md` files converted from `original` (D8)."""
        return [
            stored
            for stored in txn.companion_candidates(original, companion_name(original))
            if stored.record.filename != original and _is_companion_of(stored.record, original)
        ]

    def rename_upload(
        self,
        thread: Thread,
        filename: str,
        new_name: str,
        *,
        on_conflict: OnConflict = OnConflict.REJECT,
    ) -> UploadRecord:
        """Rename an upload, keeping its record; a companion's link follows it.

        The new name follows the upload rules; an existing name is replaced, numbered
        (`_N`) or refused as `on_conflict` says (rename refuses by default).
        """
        _check_single_segment(filename)
        if "/" in new_name:  # a new name is a name; an upload's client path is cut, not this
            raise UnsafeFilename("A new name cannot contain /")
        target = normalize_filename(new_name)
        folders = self.folders(thread)
        folder = folders.uploads_dir()
        self._require_regular_file(folder / filename, filename)
        self.list_uploads(folders)
        if target == filename:
            return self.get_upload(folders, filename)
        # The records step can fail after the disk step (the database out of reach, a
        # journal that cannot grow on a full disk): `commit` then moves the file back and
        # whatever it replaced back into place, so disk and records stay as they were.
        commit = AtomicCommit()
        let_go: list[Path] = []
        folders.forget_records()
        with all_or_nothing(commit, lambda: target, lambda: f"Failed to rename {filename}"):
            with self.records.locked(folders.scope) as txn:
                stored = txn.get(filename)
                if stored is None:  # not listed, e.g. a hard link to a file outside the thread
                    raise UploadNotFound(filename)
                target = self._rename_target(txn, folder, target, OnConflict(on_conflict))
                if (replaced := txn.get(target)) is not None:
                    self._drop_companions(txn, folder, target, commit)
                    txn.delete(target)
                    if self.history is not None and os.path.lexists(folder / target):
                        let_go += self.history.keep_version(
                            txn,
                            folders,
                            commit,
                            area=Area.UPLOADS,
                            name=target,
                            current=folder / target,
                            sha256=replaced.record.sha256,
                            size=replaced.record.size,
                            content_type=replaced.record.content_type,
                        )
                if self.history is not None:
                    self.history.renamed(txn, folders, filename, target)
                commit.rename(folder / filename, folder / target)
                txn.delete(filename)
                info = (folder / target).lstat()
                record = replace(stored.record, filename=target, original_filename=None)
                txn.put(StoredRecord(record, info.st_mtime_ns, info.st_ino, info.st_ctime_ns))
                for other in txn.companion_candidates(filename, companion_name(filename)):
                    if other.record.converted_from == filename:
                        companion = replace(other.record, converted_from=target)
                        txn.put(replace(other, record=companion))
        remove_quietly(let_go)
        return record

    @staticmethod
    def _rename_target(
        txn: RecordsTransaction, folder: Path, target: str, on_conflict: OnConflict
    ) -> str:
        """The name a rename lands on, decided under the records lock against the folder
        and the records (an upload committed meanwhile holds its name)."""

        def taken(name: str) -> bool:
            return os.path.lexists(folder / name) or txn.get(name) is not None

        if not taken(target):
            return target
        if on_conflict is OnConflict.REJECT:
            raise NameConflict(target)
        if on_conflict is OnConflict.RENAME:
            return first_free_name(target, taken)
        if not is_safe_destination(folder / target):
            raise UnsafeFilename(f"{target} is a link or a folder and cannot be replaced")
        return target

    @staticmethod
    def _require_regular_file(path: Path, filename: str) -> None:
        try:
            info = path.lstat()
        except (FileNotFoundError, NotADirectoryError) as error:
            raise UploadNotFound(filename) from error
        if not stat.S_ISREG(info.st_mode):
            raise UploadNotFound(filename)


@contextmanager
def all_or_nothing(
    commit: AtomicCommit, name: Callable[[], str], failure: Callable[[], str]
) -> Iterator[None]:
    """Keep the block's renames only if all of it succeeds, the records' transaction too.

    On any failure every file goes back where it was (`AtomicCommit.undo`) and an OSError
    becomes the domain error (`InsufficientStorage` of `name()` on a full disk, else
    `StorageFailure` starting with `failure()`); both are read when the failure happens,
    so they name the file the block had reached. On success the backups are dropped.
    """
    try:
        yield
    except OSError as error:
        commit.undo()
        if is_disk_full(error):
            raise InsufficientStorage(name()) from error
        raise StorageFailure(f"{failure()}: {error}") from error
    except BaseException:
        commit.undo()
        raise
    commit.forget_backups()


def _size_on_disk(path: Path) -> int:
    """The bytes a history file holds (0 when it is gone already)."""
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def _commit_name(
    txn: RecordsTransaction, batch: _UploadBatch, item: _Staged, committed: set[str]
) -> str:
    """Where a staged part goes by its `on_conflict` rule, decided under the records lock.

    A name is taken when the folder or the records hold it, or this commit already used
    it. `rename` takes the first free name from the one the client asked for; `reject`
    refuses a taken name; `replace` keeps its name.

    Raises:
        NameConflict: `reject` and the name is taken now.
    """

    def taken(name: str) -> bool:
        return (
            name in committed or os.path.lexists(batch.folder / name) or txn.get(name) is not None
        )

    if batch.on_conflict is OnConflict.RENAME:
        return first_free_name(item.requested, taken)
    if batch.on_conflict is OnConflict.REJECT and taken(item.name):
        raise NameConflict(item.name)
    return item.name


def _hash_changed(
    folder: Path, on_disk: dict[str, FileFacts], known: dict[str, FileFacts]
) -> dict[str, tuple[FileFacts, str, str]]:
    """SHA-256 and content type of the files whose facts differ from their records."""
    hashed: dict[str, tuple[FileFacts, str, str]] = {}
    for name, facts in on_disk.items():
        if known.get(name) != facts:
            try:
                hashed[name] = (facts, *hash_and_sniff(folder / name))
            except OSError:
                continue  # removed or unreadable meanwhile; the next listing looks again
    return hashed


def _as_found(
    stored: list[StoredRecord],
    on_disk: dict[str, FileFacts],
    hashed: dict[str, tuple[FileFacts, str, str]],
) -> list[UploadRecord]:
    """The records a reconciliation would have written, in code-point name order."""
    found = {s.record.filename: s.record for s in stored if s.record.filename in on_disk}
    for name, (facts, sha256, content_type) in hashed.items():
        found[name] = _record_from_disk(name, facts, sha256, content_type, found.get(name))
    return [found[name] for name in sorted(found)]


def _is_companion_of(record: UploadRecord, original: str) -> bool:
    """Recorded conversions always; a `.md` found on disk only by DeerFlow's naming rule."""
    if record.converted_from is not None:
        return record.converted_from == original
    return (
        record.source is RecordSource.DISK
        # DeerFlow's own converter makes Markdown of documents only, never of images
        and PurePosixPath(original).suffix.lower() in DOCUMENT_EXTENSIONS
        and is_companion_name(record.filename, original)
    )


def _is_present_file(path: Path) -> bool:
    return os.path.lexists(path) and is_safe_destination(path)


def _check_single_segment(filename: str) -> None:
    if not filename or "/" in filename or "\x00" in filename or filename in {".", ".."}:
        raise InvalidPath()


def make_upload_service(
    base_dir: Path,
    limits: UploadLimits | None = None,
    engine: Engine | None = None,
    scanner: ContentScanner | None = None,
    quotas: QuotaPolicy | None = None,
    storage: StorageSettings | None = None,
    database_url: str | None = None,
) -> UploadService:
    """Build the service over a data dir: the one place storage objects are assembled.

    `engine` is the process's shared database; without one, `database_url`'s (by default
    the data dir's embedded SQLite file) is opened (and migrated). With `storage.backend:
    s3` the data dir becomes this process's working copy of the bucket
    (`storage/objects/working_copy.py`).
    """
    paths = ThreadPaths(base_dir)
    records = DatabaseUploadRecords(engine or open_database(paths.base_dir, database_url))
    if storage is not None and storage.backend == "s3":
        copies = WorkingCopies(
            make_object_store(storage, paths.base_dir),
            paths.base_dir,
            presigned_downloads=storage.s3.presigned_downloads,
        )
        records.before_write = copies.push_written
        copies.records = records
        paths.copies = copies
    return UploadService(paths, records, limits or UploadLimits(), scanner=scanner, quotas=quotas)
