"""Moving a local install's bytes into a bucket: `flask --app app storage migrate --to s3`.

What the S3 backend serves is named by the database: every upload record, and every row
of the history (the earlier bytes of a replaced file, `file_versions`; a deleted file and
its companions, `trashed_files`). Each names bytes by SHA-256, which the bucket keeps as
the thread's blob (`keys.blob_key`). Moving an install is therefore copying, for every one
of those rows, its local file to its blob, and nothing else: the rows stay as they are.

- **Verified on the way.** The file is hashed as it streams into the store's writer; bytes
  that are not the row's (a file changed or damaged behind the app's back), or a file that
  is missing, are reported (path, expected, found) and the writer is aborted before its
  commit, so nothing of them is ever stored. The writer's own SHA-256 of what it sent
  (which S3 checked part by part) is compared again after the commit.
- **Rerunnable.** A blob the bucket already holds (with the row's size, and its SHA-256
  where the store keeps one) is not copied again: a second run copies nothing, and a run
  cut off (Ctrl-C, SIGKILL) is finished by the next. A writer is invisible until its
  commit, so a cut-off copy leaves no partial object, only an unfinished multipart upload,
  which `sweep_stale_uploads` (run here for the blobs, past `STALE_UPLOAD_SECONDS`) aborts.
- **Streaming.** One read buffer and the writer's part buffer per file, whatever its size.

The switch itself (`install_storage.mark_moved`) is the caller's, once a run ends with no
failure.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy import select
from sqlalchemy import tuple_

from deerflow_web.errors import InvalidObjectKey
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import THREAD_ID_RE
from deerflow_web.models import USER_ID_RE
from deerflow_web.models import ThreadRef
from deerflow_web.storage.database import file_versions
from deerflow_web.storage.database import insert_missing_threads
from deerflow_web.storage.database import trashed_files
from deerflow_web.storage.database import uploads
from deerflow_web.storage.database import write_transaction
from deerflow_web.storage.objects.base import READ_CHUNK
from deerflow_web.storage.objects.base import ObjectStore
from deerflow_web.storage.objects.keys import BLOBS_FOLDER
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import ThreadPaths

PAGE = 500  # rows read per query: the tables are walked in key order, a page at a time
# An unfinished multipart upload of a blob older than this is a dead copy (or a dead
# upload: no upload runs this long) and is aborted at the start of a run.
STALE_UPLOAD_SECONDS = 3600.0
MISSING = "missing"
USER_ID_LENGTH = 36  # threads.user_id: a folder of a longer name was never an account's
FOLDERS_KEPT = 1000  # threads whose checked folders a run remembers at once


@dataclass(frozen=True)
class LocalFile:
    """One file a row names: where it is here, and the bytes it must hold."""

    scope: str
    kind: str  # "upload", "version" or "trash"
    relative: str  # its path relative to the data dir, for the report
    sha256: str
    size: int
    path: Path | None  # None: the row names no place the data dir can hold (see `problem`)
    problem: str | None = None


@dataclass(frozen=True)
class MoveFailure:
    """A file that was not copied, and why: `found` is the SHA-256 of its bytes, or what
    stands in their way ("missing", "a link", ...)."""

    relative: str
    expected: str
    found: str
    key: str | None = None  # the blob it was meant for

    def describe(self) -> str:
        return f"{self.relative}: expected sha256 {self.expected}, found {self.found}"


@dataclass
class MoveReport:
    """What one run did: every row's file copied, found in the bucket already, or failed."""

    copied: int = 0
    skipped: int = 0  # the bucket held the bytes already
    bytes_copied: int = 0
    swept: int = 0  # unfinished uploads of earlier runs, aborted
    threads: int = 0  # threads given their row (or found with one)
    failures: list[MoveFailure] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    elapsed: float = 0.0

    @property
    def files(self) -> int:
        return self.copied + self.skipped + len(self.failures)

    @property
    def complete(self) -> bool:
        return not self.failures

    def megabytes_per_second(self) -> float:
        seconds = self.elapsed or (time.monotonic() - self.started)
        return self.bytes_copied / 1e6 / seconds if seconds > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{self.files} file(s): {self.copied} copied, {self.skipped} skipped (already in "
            f"the bucket), {self.bytes_copied} bytes at {self.megabytes_per_second():.1f} MB/s, "
            f"{len(self.failures)} failure(s)"
        )


Progress = Callable[[MoveReport, LocalFile], None]


class InstallMover:
    """Copies every file the database names from the data dir into `store`."""

    def __init__(self, engine: Engine, base_dir: str | os.PathLike[str], store: ObjectStore):
        self.engine = engine
        # The data dir as the local backend lays it out: never a working copy (nothing
        # here may fetch from the bucket it is filling).
        self.paths = ThreadPaths(base_dir)
        self.store = store
        self._folders: dict[str, ThreadFolders] = {}
        self._done: set[str] = set()  # blob keys this run copied or found

    # -- the run ---------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> MoveReport:
        report = MoveReport()
        report.swept = self.sweep()
        for local in self.files():
            self._move(local, report)
            if progress is not None:
                progress(report, local)
        # Bytes one file lacked, another of the same SHA-256 in the thread may have given:
        # those are in the bucket after all.
        given = [f for f in report.failures if f.key is not None and f.key in self._done]
        report.failures = [f for f in report.failures if f not in given]
        report.skipped += len(given)
        report.threads = self.record_threads()
        report.elapsed = time.monotonic() - report.started
        return report

    def record_threads(self) -> int:
        """Give every thread of the install its row in `threads`, as a listing on the local
        backend does for a folder without one: on the S3 backend a folder is one
        instance's copy, and the rows alone say which threads exist. Every thread a row
        names and every thread folder here counts; a row already there stays as it is.
        Returns how many threads the install has."""
        refs: dict[tuple[str, str], ThreadRef] = {}
        for scope in self._scopes():
            try:
                ref = self.paths.parse_scope(scope)
            except ValueError:
                continue  # reported with its files
            refs[(ref.user_id, ref.thread_id)] = ref
        for ref in self._thread_folders():
            refs.setdefault((ref.user_id, ref.thread_id), ref)
        refs = {key: ref for key, ref in refs.items() if len(ref.user_id) <= USER_ID_LENGTH}
        now = time.time()
        rows = []
        for ref in refs.values():
            try:
                stamp = os.stat(self.paths.thread_dir(ref), follow_symlinks=False).st_mtime
            except (OSError, UnsafeFolder):
                stamp = now  # no folder here (history rows only), or not one to trust
            rows.append(
                {
                    "user_id": ref.user_id,
                    "thread_id": ref.thread_id,
                    "title": None,
                    "metadata": "{}",
                    "created_at": stamp,
                    "updated_at": stamp,
                }
            )
        for start in range(0, len(rows), PAGE):
            with write_transaction(self.engine) as db:
                insert_missing_threads(db, rows[start : start + PAGE])
        return len(refs)

    def _scopes(self) -> set[str]:
        found: set[str] = set()
        with self.engine.connect() as db:
            for table in (uploads, file_versions, trashed_files):
                found.update(scope for (scope,) in db.execute(select(table.c.scope).distinct()))
        return found

    def _thread_folders(self) -> Iterator[ThreadRef]:
        """The thread folders of both layouts (a link is never followed)."""
        for thread_id in self._ids(self.paths.base_dir / "threads"):
            yield ThreadRef.single_user(thread_id)
        users = self.paths.base_dir / "users"
        if users.is_dir() and not users.is_symlink():
            for entry in os.scandir(users):
                if entry.is_dir(follow_symlinks=False) and USER_ID_RE.fullmatch(entry.name):
                    for thread_id in self._ids(Path(entry.path) / "threads"):
                        yield ThreadRef(thread_id, entry.name)

    @staticmethod
    def _ids(root: Path) -> Iterator[str]:
        if not root.is_dir() or root.is_symlink():
            return
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False) and THREAD_ID_RE.fullmatch(entry.name):
                yield entry.name

    def sweep(self, older_than: float = STALE_UPLOAD_SECONDS) -> int:
        """Abort the unfinished uploads of blobs that earlier runs (or dead instances) left."""
        swept = 0
        for upload in self.store.list_stale_uploads("", older_than):
            if f"/{BLOBS_FOLDER}/" in f"/{upload.key}":
                self.store.abort_stale_upload(upload)
                swept += 1
        return swept

    def _move(self, local: LocalFile, report: MoveReport) -> None:
        try:
            key = blob_key(local.scope, local.sha256)
        except InvalidObjectKey:
            report.failures.append(MoveFailure(local.relative, local.sha256, "not a SHA-256"))
            return
        if key in self._done or self._in_bucket(key, local):
            self._done.add(key)
            report.skipped += 1
            return
        if local.path is None:
            report.failures.append(
                MoveFailure(local.relative, local.sha256, local.problem or MISSING, key)
            )
            return
        failure = self._copy(local, key)
        if failure is not None:
            report.failures.append(replace(failure, key=key))
            return
        self._done.add(key)
        report.copied += 1
        report.bytes_copied += local.size

    def _in_bucket(self, key: str, local: LocalFile) -> bool:
        try:
            info = self.store.head(key)
        except ObjectNotFound:
            return False
        return info.size == local.size and info.sha256 in (None, local.sha256)

    def _copy(self, local: LocalFile, key: str) -> MoveFailure | None:
        """Stream the file into `key`, committed only if its bytes are the row's."""
        assert local.path is not None
        try:
            fd = os.open(local.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return MoveFailure(local.relative, local.sha256, MISSING)
        except OSError as error:
            found = "a link" if error.errno == errno.ELOOP else f"unreadable ({error.strerror})"
            return MoveFailure(local.relative, local.sha256, found)
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                return MoveFailure(local.relative, local.sha256, "not a regular file")
            with self.store.open_writer(key) as writer:
                while chunk := source.read(READ_CHUNK):
                    digest.update(chunk)
                    writer.write(chunk)
                if digest.hexdigest() != local.sha256:
                    return MoveFailure(local.relative, local.sha256, digest.hexdigest())
                stored = writer.commit()
        if stored.sha256 is not None and stored.sha256 != local.sha256:
            self.store.delete(key)  # what S3 took is not what was read: never kept
            return MoveFailure(local.relative, local.sha256, f"{stored.sha256} once stored")
        return None

    # -- what the database names -------------------------------------------------------

    def files(self) -> Iterator[LocalFile]:
        """Every file of every row: uploads, then versions, then the trash."""
        yield from self._uploads()
        yield from self._versions()
        yield from self._trash()

    def _uploads(self) -> Iterator[LocalFile]:
        columns = (uploads.c.scope, uploads.c.filename, uploads.c.sha256, uploads.c.size)
        key = (uploads.c.scope, uploads.c.filename)
        for scope, filename, sha256, size in _pages(self.engine, columns, key):
            yield self._local(scope, "upload", ("uploads",), filename, sha256, size)

    def _versions(self) -> Iterator[LocalFile]:
        columns = (
            file_versions.c.version_id,
            file_versions.c.scope,
            file_versions.c.sha256,
            file_versions.c.size,
        )
        for version_id, scope, sha256, size in _pages(
            self.engine, columns, (file_versions.c.version_id,)
        ):
            yield self._local(scope, "version", ("versions",), version_id, sha256, size)

    def _trash(self) -> Iterator[LocalFile]:
        columns = (trashed_files.c.trash_id, trashed_files.c.scope, trashed_files.c.records)
        for trash_id, scope, records in _pages(self.engine, columns, (trashed_files.c.trash_id,)):
            for record in json.loads(records):  # the file's own first, then its companions
                yield self._local(
                    scope,
                    "trash",
                    ("trash", trash_id),
                    record["filename"],
                    record["sha256"],
                    int(record["size"]),
                )

    def _local(
        self, scope: str, kind: str, within: tuple[str, ...], name: str, sha256: str, size: int
    ) -> LocalFile:
        """Where the row's file sits: the folder its kind lives in, found by the checked
        walk of `ThreadFolders` (no link followed), and the name as one path below it."""
        area, *rest = within
        relative = "/".join((scope, *_layout(area), *rest, name))

        def refused(problem: str) -> LocalFile:
            return LocalFile(scope, kind, relative, sha256, size, None, problem)

        parts = name.split("/")
        if any(part in ("", ".", "..") for part in parts) or "\0" in name:
            return refused("not a name inside its folder")
        try:
            folders = self._folders_of(scope)
            if area == "uploads":
                folder = folders.uploads_dir()
            elif area == "versions":
                folder = folders.versions_dir()
            else:
                folder = folders.trash_dir()
            path = folder.joinpath(*rest, *parts)
            self.paths.checked(path.parent)
        except ValueError:
            return refused("not a thread's records key")
        except UnsafeFolder as error:
            return refused(f"a link or a file where a folder belongs ({error})")
        return LocalFile(scope, kind, relative, sha256, size, path)

    def _folders_of(self, scope: str) -> ThreadFolders:
        """One walk per thread (a bounded number of threads remembered at a time)."""
        folders = self._folders.get(scope)
        if folders is None:
            if len(self._folders) >= FOLDERS_KEPT:
                self._folders.clear()
            folders = self._folders[scope] = self.paths.folders(self.paths.parse_scope(scope))
        return folders


def _layout(area: str) -> tuple[str, ...]:
    """The folders between a thread's own and a file of `area`, for the report's paths."""
    from deerflow_web.storage.paths import HISTORY_FOLDER
    from deerflow_web.storage.paths import TRASH_FOLDER
    from deerflow_web.storage.paths import VERSIONS_FOLDER

    if area == "uploads":
        return ("user-data", "uploads")
    return (HISTORY_FOLDER, VERSIONS_FOLDER if area == "versions" else TRASH_FOLDER)


def _pages(engine: Engine, columns: tuple, key: tuple) -> Iterator[tuple]:
    """The rows of `columns` in the order of `key` (their table's primary key, which
    `columns` starts with), a page per short read: no transaction stays open while files
    are copied."""
    after: tuple | None = None
    while True:
        query = select(*columns).order_by(*key).limit(PAGE)
        if after is not None:
            query = query.where(tuple_(*key) > tuple_(*after))
        with engine.connect() as db:
            rows = [tuple(row) for row in db.execute(query)]
        yield from rows
        if len(rows) < PAGE:
            return
        after = rows[-1][: len(key)]
