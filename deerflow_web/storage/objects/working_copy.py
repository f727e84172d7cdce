"""The data dir as one instance's working copy of a bucket (`storage.backend: s3`).

With the S3 backend several instances on different machines share one database and one
bucket, and nothing else: each has its own data dir, empty at first. The bucket holds the
bytes of every upload the records name, and the records stay the source of truth (what a
thread holds, each file's SHA-256). Everything that reads a file (previews, the agent's
tools, conversion, scans, archives, zip downloads) keeps reading the thread's folders in the
data dir; this module keeps those folders true to the records. A download of an upload this
copy lacks is the exception: it only sends bytes, so it streams them from the bucket
(`lacks`, `open_blob`), keeping them as this copy's file once sent whole (`KeptDownload`).

- **No record without its bytes in the bucket.** Every record write pushes the file it
  describes to the bucket first, in the write's own transaction (`push_written`, called by
  `DatabaseUploadRecords` before each write): if the bucket cannot take it, the write fails
  and rolls back, and the upload answers 503 with nothing changed. An upload's body streams
  into the bucket as it arrives, at an incoming key (`open_incoming`), and becomes the
  thread's blob by a server-side copy once its SHA-256 is known, before its commit takes
  the thread's lock (`store_staged`, `adopt`); a file below one part, or staged elsewhere,
  is pushed there instead (`push`). Other writers of the thread never wait for the copy.
- **Bytes are keyed by their SHA-256 within the thread** (`keys.blob_key`). Replacing a
  file only points its record at other bytes, so what a reader of the bucket sees switches
  atomically with the records, a rename moves no bytes, and the earlier bytes a version or
  the trash keeps are already there. A blob no record or history row names any more is
  removed by `collect_garbage`, under the thread's lock, after every delete for good.
- **A thread's folder is made to match its records before it is read** (`hydrate`, once
  per request or tool call, by `ThreadFolders`; `hydrate_file` for a caller that reads one
  file, or an upload settling the names it writes): a file missing here, or older than its
  record, is fetched from the bucket to a staging name, its SHA-256 checked against the
  record, and renamed into place under the thread's lock only if the record still names
  those bytes; a file the records no longer name (deleted or renamed on another instance)
  is removed. A fetched file gets its record's mtime, so a file here is current when its
  size and mtime are the record's: one `lstat` each, no hashing.

The copies stay within `storage.s3.working_copy_max_bytes` when it is set: the threads
read longest ago let go of their fetched files (`eviction`), fetched again when next read.

The folder is a copy the app alone writes: an edit behind its back is not picked up as
in the local backend (which the records then follow); the next write of that name, or a
fetch after its size or mtime moved, wins.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import NamedTuple

from sqlalchemy.engine import Connection

from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import StorageFailure
from deerflow_web.models import Area
from deerflow_web.models import UploadRecord
from deerflow_web.storage.history import remove_quietly
from deerflow_web.storage.history import trashed_in
from deerflow_web.storage.history import versions_in
from deerflow_web.storage.objects.base import READ_CHUNK
from deerflow_web.storage.objects.base import ObjectFile
from deerflow_web.storage.objects.base import ObjectStore
from deerflow_web.storage.objects.eviction import mark_used
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.keys import blobs_prefix
from deerflow_web.storage.objects.keys import incoming_key
from deerflow_web.storage.objects.keys import incoming_prefix
from deerflow_web.storage.paths import VERSIONS_FOLDER
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.paths import storage_modes
from deerflow_web.storage.sniff import SNIFF_BYTES

if TYPE_CHECKING:
    from deerflow_web.storage.local import StagingFile
    from deerflow_web.storage.objects.s3 import S3ObjectStore
    from deerflow_web.storage.paths import ThreadFolders
    from deerflow_web.storage.records import DatabaseUploadRecords
    from deerflow_web.storage.records import StoredRecord

logger = logging.getLogger(__name__)

# How long a presigned download URL works: enough to start the download, short enough that
# a URL copied out of a browser is of no use to anyone later.
PRESIGNED_SECONDS = 300


class WorkingCopies:
    """Keeps every data dir of an install true to one bucket (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        base_dir: str | os.PathLike[str],
        *,
        presigned_downloads: bool = False,
    ) -> None:
        self.store = store
        self.base_dir = Path(base_dir)
        self.presigned_downloads = presigned_downloads  # `storage.s3.presigned_downloads`
        # Set by the wiring once the records exist (they call `push_written` back).
        self.records: DatabaseUploadRecords | None = None

    # -- into the bucket -------------------------------------------------------------

    def uploads_path(self, scope: str, filename: str) -> Path:
        return self.base_dir / scope / "user-data" / Area.UPLOADS.value / filename

    def push(self, scope: str, path: Path, sha256: str) -> None:
        """Make sure the bucket holds `path`'s bytes as the thread's blob of `sha256`.

        Raises:
            ObjectStoreUnavailable: The bucket cannot be reached (nothing was recorded).
            StorageFailure: The file is gone, or its bytes are not `sha256`'s.
        """
        key = blob_key(scope, sha256)
        if self.store.exists(key):
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise StorageFailure(f"{path.name} cannot be read to store it: {error}") from error
        with os.fdopen(fd, "rb") as source, self.store.open_writer(key) as writer:
            while chunk := source.read(READ_CHUNK):
                writer.write(chunk)
            info = writer.commit()
        if info.sha256 is not None and info.sha256 != sha256:
            self.store.delete(key)
            raise StorageFailure(f"{path.name} changed while it was stored; try again")

    def adopt(self, scope: str, incoming: str, sha256: str) -> None:
        """Make the bytes streamed to the key `incoming` the thread's blob of `sha256`, and
        let the incoming key go.

        A server-side copy: no byte passes through this process. When the thread already
        holds the blob (the same bytes uploaded before), the incoming copy is dropped.
        A crash between the copy and the delete leaves an incoming object nothing names,
        which the stale-upload sweep removes.

        Raises:
            ObjectStoreUnavailable: The bucket cannot be reached.
            StorageFailure: The incoming bytes are gone or are not `sha256`'s.
        """
        key = blob_key(scope, sha256)
        if not self.store.exists(key):
            try:
                info = self.store.copy(incoming, key)
            except ObjectNotFound as error:
                raise StorageFailure(f"the upload streamed to {incoming} is gone") from error
            if info.sha256 is not None and info.sha256 != sha256:
                self.store.delete(key)
                raise StorageFailure("the bytes stored in the bucket are not the ones sent")
        self.store.delete(incoming)

    def open_incoming(self, scope: str) -> IncomingCopy | None:
        """A copy into the bucket of bytes being staged here, sent while they arrive (an
        upload's body: the staging file stays this instance's working copy); None when
        the store sends nothing until a commit (the data dir itself)."""
        from deerflow_web.storage.objects.s3 import S3ObjectStore

        if not isinstance(self.store, S3ObjectStore):
            return None
        return IncomingCopy(self.store, incoming_key(scope, secrets.token_hex(16)))

    def store_staged(
        self, scope: str, path: Path, sha256: str, incoming: IncomingCopy | None = None
    ) -> None:
        """Make sure the bucket holds a staged file's bytes as the thread's blob: the
        bytes streamed beside it (`incoming`) adopted, or else the file pushed.

        Raises:
            ObjectStoreUnavailable: The bucket cannot be reached.
            StorageFailure: The bytes are gone or are not `sha256`'s.
        """
        key = incoming.finish() if incoming is not None else None
        if key is None:
            self.push(scope, path, sha256)
            return
        try:
            self.adopt(scope, key, sha256)
        except BaseException:
            incoming.discard()
            raise
        incoming.adopted()

    def push_written(self, scope: str, written: Iterable[StoredRecord]) -> None:
        """Before records are written: the bytes each describes, into the bucket."""
        for stored in written:
            record = stored.record
            self.push(scope, self.uploads_path(scope, record.filename), record.sha256)

    # -- out of the bucket -----------------------------------------------------------

    def hydrate(self, folders: ThreadFolders) -> None:
        """Make the thread's uploads folder hold what its records say (module docstring).

        Raises:
            ObjectStoreUnavailable: A file had to be fetched and the bucket cannot be
                reached (what was current here stays).
            StorageFailure: The bucket's bytes are not the ones the record names.
        """
        records = self._records()
        scope = folders.scope
        mark_used(folders.thread_dir())  # spared by the eviction while it is read
        stored = records.all(scope)
        folder = folders.user_data_dir() / Area.UPLOADS.value
        here = _regular_files(folder)
        wanted = {s.record.filename: s for s in stored}
        missing = [s for s in stored if not _is_current(here.get(s.record.filename), s)]
        extra = [name for name in here if name not in wanted]
        if not missing and not extra:
            return
        if missing:
            folders.make_dirs(folder)
        fetched: dict[str, Path] = {}
        try:
            for s in missing:
                name = s.record.filename
                fetched[name] = self._fetch(scope, s.record.sha256, folder, name, s.mtime_ns)
            with records.locked_here(scope) as txn:
                # Only what the records still say lands: a commit meanwhile wins.
                now = txn.get_many([*fetched, *extra])
                for name, staging in fetched.items():
                    current = now.get(name)
                    if current is not None and _same_bytes(current, wanted[name]):
                        os.replace(staging, folder / name)
                for name in extra:
                    if now.get(name) is None:
                        (folder / name).unlink(missing_ok=True)
        finally:
            for staging in fetched.values():
                staging.unlink(missing_ok=True)
        folders.forget_records()

    def hydrate_file(self, folders: ThreadFolders, name: str, *, fetch: bool = True) -> None:
        """Bring one upload of the thread up to date with its record, leaving the rest of
        the folder as it is: what reading that one file needs (a preview, a zip, the
        agent), without fetching every file of the thread this copy lacks. Fetched and
        checked as `hydrate` does; a file the records no longer name goes. Without
        `fetch`, only that: a caller that needs the name free of a file deleted elsewhere
        but not the bytes (an upload that will not replace them).

        Raises:
            ObjectStoreUnavailable, StorageFailure: As `hydrate`.
        """
        records = self._records()
        scope = folders.scope
        mark_used(folders.thread_dir())
        folder = folders.user_data_dir() / Area.UPLOADS.value
        path = folder / name
        if is_staging_name(name):
            return  # never an upload: the caller refuses it
        info = _regular_file(path)
        wanted = records.get(scope, name)
        if wanted is None:
            if info is not None:
                with records.locked_here(scope) as txn:
                    if txn.get(name) is None:  # deleted or renamed on another instance
                        path.unlink(missing_ok=True)
            return
        if not fetch or _is_current(info, wanted):
            return
        folders.make_dirs(folder)
        staging = self._fetch(scope, wanted.record.sha256, folder, name)
        try:
            self._land(scope, staging, path, lambda current: _same_bytes(current, wanted))
        finally:
            staging.unlink(missing_ok=True)

    def _land(
        self, scope: str, staging: Path, path: Path, still: Callable[[StoredRecord], bool]
    ) -> bool:
        """Rename fetched bytes into place under the thread's lock, only if its record
        still names them (`still`), with the record's mtime; whether they landed."""
        with self._records().locked_here(scope) as txn:
            current = txn.get(path.name)
            if current is None or not still(current):
                return False
            os.utime(staging, ns=(current.mtime_ns, current.mtime_ns))
            os.replace(staging, path)
            return True

    def lacks(self, folders: ThreadFolders, name: str) -> StoredRecord | None:
        """The record of an upload of the thread this copy does not hold as recorded
        (missing, or older than its record): a download of it streams from the bucket
        (`open_blob`) instead of fetching it here first. None when the copy here is
        current, or the thread has no such upload (the caller then reads the folder,
        which says so)."""
        if is_staging_name(name):
            return None
        folders.uploads_area()  # a linked uploads/ is refused as for any read
        wanted = self._records().get(folders.scope, name)
        if wanted is None:
            return None
        path = folders.area_location(Area.UPLOADS) / name
        return None if _is_current(_regular_file(path), wanted) else wanted

    def open_blob(self, folders: ThreadFolders, record: UploadRecord) -> ObjectFile:
        """The bucket's bytes of an upload as a seekable file, fetched as it is read.

        A read of the whole file from its first byte (a download, not a `Range` of it)
        also leaves it here as this copy's file (`KeptDownload`), so the next download
        is sent from the disk."""
        key = blob_key(folders.scope, record.sha256)
        return ObjectFile(self.store, key, record.size, watcher=KeptDownload(self, folders, record))

    def read_head(self, scope: str, record: UploadRecord) -> bytes:
        """The first bytes of an upload in the bucket, as much as a sniff reads: one ranged
        GET of that much, not a stream of the whole object cut short."""
        with self.store.open_read(blob_key(scope, record.sha256), 0, SNIFF_BYTES) as stream:
            return b"".join(stream)

    def hydrate_history(self, folders: ThreadFolders, kind: str, folder: Path) -> None:
        """Make the thread's versions or trash folder hold what its history rows say: the
        kept bytes of uploads fetched where missing, entries no row names removed.

        A version's or a trashed file's bytes never change under its id, so a file of the
        right size is current. Versions of outputs/ stay this instance's own (that area is
        the agent's, not backed by the bucket).
        """
        records = self._records()
        scope = folders.scope
        mark_used(folders.thread_dir())
        with records.reading() as db:
            wanted, keep = _history_files(db, scope, kind)
        here = _entries(folder)
        missing = [f for f in wanted if not _has_size(folder / f.path, f.size)]
        extra = [name for name in here if name not in keep]
        if not missing and not extra:
            return
        fetched: list[tuple[_HistoryFile, Path]] = []
        try:
            for wanted_file in missing:
                target = folder / wanted_file.path
                folders.make_dirs(target.parent)
                staging = self._fetch(
                    scope, wanted_file.sha256, target.parent, wanted_file.path.rsplit("/")[-1]
                )
                fetched.append((wanted_file, staging))
            with records.locked_here(scope) as txn:
                _, keep_now = _history_files(txn.connection, scope, kind)
                for wanted_file, staging in fetched:
                    if wanted_file.path.split("/", 1)[0] in keep_now:
                        os.replace(staging, folder / wanted_file.path)
                remove_quietly([folder / name for name in extra if name not in keep_now])
        finally:
            for _, staging in fetched:
                staging.unlink(missing_ok=True)

    def _fetch(
        self, scope: str, sha256: str, folder: Path, name: str, mtime_ns: int | None = None
    ) -> Path:
        """The bytes of `sha256` from the bucket in a staging file of `folder`, checked;
        `name` is the file they are for (for errors), `mtime_ns` the mtime to give it."""
        from deerflow_web.storage.local import staging_path

        staging = staging_path(folder)
        digest = hashlib.sha256()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(staging, flags, storage_modes().file)
        try:
            with os.fdopen(fd, "wb") as target:
                try:
                    stream = self.store.open_read(blob_key(scope, sha256))
                except ObjectNotFound as error:
                    raise StorageFailure(
                        f"the stored bytes of {name} are missing from the bucket"
                    ) from error
                with stream:
                    for chunk in stream:
                        digest.update(chunk)
                        target.write(chunk)
            if digest.hexdigest() != sha256:
                raise StorageFailure(f"the stored bytes of {name} do not match their record")
            if mtime_ns is not None:
                os.utime(staging, ns=(mtime_ns, mtime_ns))
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
        return staging

    def download_url(self, scope: str, record: UploadRecord) -> str | None:
        """With `storage.s3.presigned_downloads`, a short-lived URL the bucket serves the
        upload's bytes at as an attachment of its name and type (the caller has checked
        who may have them); None otherwise."""
        if not self.presigned_downloads:
            return None
        return self.store.presigned_url(
            blob_key(scope, record.sha256),
            expires_seconds=PRESIGNED_SECONDS,
            filename=record.filename,
            content_type=record.content_type,
        )

    # -- housekeeping ----------------------------------------------------------------

    def delete_thread(self, scope: str) -> int:
        """Remove everything a deleted thread kept in the bucket: its blobs, the bytes of
        uploads on their way (incoming objects, resumable uploads' tails) and their
        unfinished multipart uploads; return how many objects and uploads went.

        Its rows are gone by now, so whatever is on its way in ends with a failure
        rather than landing in a thread that no longer exists."""
        removed = 0
        for prefix in (blobs_prefix(scope), incoming_prefix(scope)):
            for info in list(self.store.list_keys(prefix)):
                self.store.delete(info.key)
                removed += 1
        for upload in self.store.list_stale_uploads(incoming_prefix(scope)):
            self.store.abort_stale_upload(upload)
            removed += 1
        return removed

    def collect_garbage(self, scope: str, *, grace: float = 0.0) -> int:
        """Remove the thread's blobs that no record or history row names; return how many.

        Run under the thread's lock, so a commit naming one of them again either landed
        first (the blob is kept) or comes after: its own check inside the lock then finds
        the blob gone and pushes it again. `grace` spares blobs younger than that many
        seconds (a periodic sweep: an upload pushed but not committed yet).
        """
        records = self._records()
        cutoff = time.time() - grace
        removed = 0
        with records.locked_here(scope) as txn:
            blobs = list(self.store.list_keys(blobs_prefix(scope)))
            if not blobs:
                return 0
            named = txn.names_by_sha256(info.key.rsplit("/", 1)[-1] for info in blobs)
            kept = set(named)
            kept.update(v.sha256 for v in versions_in(txn.connection, scope))
            kept.update(r.sha256 for e in trashed_in(txn.connection, scope) for r in e.records)
            for info in blobs:
                if info.key.rsplit("/", 1)[-1] in kept:
                    continue
                if grace and (info.modified is None or info.modified > cutoff):
                    continue
                self.store.delete(info.key)
                removed += 1
        return removed

    def _records(self) -> DatabaseUploadRecords:
        if self.records is None:
            raise RuntimeError("WorkingCopies.records is set by the wiring before use")
        return self.records


class KeptDownload:
    """Keeps what a download streams from the bucket as this copy's file.

    Each piece the response reads is written to a staging file beside the file's place
    and hashed beside the loop as an upload's body is (`StagingFile`); when the response
    closes having read every byte in order from the first, and their SHA-256 is the
    record's, they land as `hydrate_file` lands a fetch. Anything else (a `Range`, a
    client gone midway, a full disk, bytes that are not the record's) drops the staging
    file and leaves the folder as it was: keeping is a saving, never a condition of the
    download, whose bytes leave as they arrive either way.
    """

    def __init__(self, copies: WorkingCopies, folders: ThreadFolders, record: UploadRecord):
        self.copies = copies
        self.folders = folders
        self.record = record
        self._staging: StagingFile | None = None
        self._passed = 0  # bytes handed to the response so far, all of them kept
        self._given_up = False

    def passed(self, position: int, piece: memoryview) -> None:
        if self._given_up:
            return
        if position != self._passed:
            self._give_up()  # a seek: this response sends a range, not the file
            return
        try:
            if self._staging is None:
                self._staging = self._start()
            # The piece is a slice of a chunk the bucket sent, never changed after.
            self._staging.write(piece, hash_beside=True)
        except Exception as error:  # a full disk, say: never the download's failure
            logger.warning("not keeping %s here: %s", self.record.filename, error)
            self._give_up()
            return
        self._passed += len(piece)

    def _start(self) -> StagingFile:
        from deerflow_web.storage.local import StagingFile

        folder = self.folders.user_data_dir() / Area.UPLOADS.value
        self.folders.make_dirs(folder)
        mark_used(self.folders.thread_dir())
        return StagingFile(folder)

    def close(self) -> None:
        """Land the bytes if they are the whole file, as recorded; else drop them."""
        name = self.record.filename
        staging = self._staging
        try:
            if self._given_up or self._passed != self.record.size or staging is None:
                return
            sha256, _ = staging.finish(name)
            if sha256 != self.record.sha256:
                logger.warning("not keeping %s here: the bucket's bytes are not its record's", name)
                return
            self.copies._land(
                self.folders.scope,
                staging.path,
                staging.path.with_name(name),
                lambda now: now.record.sha256 == sha256,
            )
        except Exception:  # the download was sent: a copy not kept is only a copy not kept
            logger.warning("not keeping %s here", name, exc_info=True)
        finally:
            self._give_up()

    def _give_up(self) -> None:
        self._given_up = True
        staging, self._staging = self._staging, None
        if staging is not None:
            try:
                staging.discard()  # once landed, only its descriptor is left to close
            except Exception:  # noqa: S110 - reported where it mattered: the copy is dropped
                pass


class IncomingCopy:
    """An upload's bytes on their way into the bucket while its body is read, at an
    incoming key (`keys.incoming_key`) until their SHA-256 is known.

    Fed chunk by chunk beside the staging file (`write`); the S3 writer sends each part
    as it fills, a few at a time, so the body does not wait for the bucket unless the
    bucket is slower. A file below one part never starts an upload: `finish` then drops
    the buffer and says so (None), and the file is pushed with a single PUT at commit
    time. Every way out without a commit (`discard`) aborts the upload, or deletes the
    incoming object once it was completed, so nothing stays in the bucket; a crash
    leaves an unfinished upload or an incoming object to the stale-upload sweep.
    """

    def __init__(self, store: S3ObjectStore, key: str) -> None:
        self.key = key
        self._store = store
        # The staging file hashes the same bytes: S3 checks each part against its own
        # SHA-256, and the record's is the staging file's.
        self._writer = store.open_writer(key, whole_sha256=False)
        self._completed = False
        self._ended = False

    def write(self, chunk: bytes) -> None:
        """Append one chunk of the body (copied: the caller may reuse it at once).

        Raises:
            ObjectStoreUnavailable, StorageFailure: The bucket did not take a part (the
                upload is aborted).
        """
        self._writer.write(chunk)

    def finish(self) -> str | None:
        """Complete the upload; the incoming key, or None for a file below one part
        (nothing was sent: the caller pushes the staged file instead)."""
        if self._ended:
            return self.key if self._completed else None
        if self._writer.upload_id is None:
            self._writer.abort()
            self._ended = True
            return None
        self._writer.commit()  # aborts the upload itself when it fails
        self._completed = self._ended = True
        return self.key

    def adopted(self) -> None:
        """The incoming object became the thread's blob and its key went: nothing is left
        to discard."""
        self._completed = False

    def discard(self) -> None:
        """Leave nothing in the bucket; safe to call twice, and after `finish`."""
        if not self._ended:
            self._ended = True
            self._writer.abort()
        elif self._completed:
            self._completed = False
            try:
                self._store.delete(self.key)
            except Exception:  # noqa: BLE001 - the stale-upload sweep removes it later
                logger.warning("could not delete %s; the sweep will", self.key, exc_info=True)


def _regular_files(folder: Path) -> dict[str, os.stat_result]:
    """The folder's regular files by name (staging files aside); empty when it is missing."""
    found: dict[str, os.stat_result] = {}
    try:
        entries = os.scandir(folder)
    except FileNotFoundError:
        return found
    with entries:
        for entry in entries:
            if is_staging_name(entry.name):
                continue
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                found[entry.name] = info
    return found


def _regular_file(path: Path) -> os.stat_result | None:
    """The `lstat` of a regular file at `path`; None when nothing, or something else, is
    there (a link, a folder)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def _is_current(info: os.stat_result | None, stored: StoredRecord) -> bool:
    return (
        info is not None
        and info.st_size == stored.record.size
        and info.st_mtime_ns == stored.mtime_ns
    )


def _same_bytes(current: StoredRecord, fetched: StoredRecord) -> bool:
    return (current.record.sha256, current.mtime_ns) == (fetched.record.sha256, fetched.mtime_ns)


class _HistoryFile(NamedTuple):
    path: str  # inside the versions or trash folder: `{version_id}`, `{trash_id}/{name}`
    sha256: str
    size: int


def _history_files(db: Connection, scope: str, kind: str) -> tuple[list[_HistoryFile], set[str]]:
    """The files a history folder should hold from the bucket, and every top-level name
    in it a row still names (versions of outputs/ among them)."""
    if kind == VERSIONS_FOLDER:
        versions = versions_in(db, scope)
        wanted = [
            _HistoryFile(v.version_id, v.sha256, v.size)
            for v in versions
            if v.area == Area.UPLOADS.value
        ]
        return wanted, {v.version_id for v in versions}
    entries = trashed_in(db, scope)
    wanted = [
        _HistoryFile(f"{e.trash_id}/{r.filename}", r.sha256, r.size)
        for e in entries
        for r in e.records
    ]
    return wanted, {e.trash_id for e in entries}


def _entries(folder: Path) -> list[str]:
    """The names in a folder (staging files aside); empty when it is missing."""
    try:
        return [name for name in os.listdir(folder) if not is_staging_name(name)]
    except FileNotFoundError:
        return []


def _has_size(path: Path, size: int) -> bool:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == size
