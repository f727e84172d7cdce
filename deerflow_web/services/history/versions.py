"""Versions of replaced files: kept on every replace, listed, downloaded and restored.

A replace (a re-upload over a name, a resumable upload finished over it, an artifact
edit, a restore) first gives the current bytes a second name in the thread's hidden
versions folder, a hard link made in the very transaction that writes the new record, so
no byte is copied and nothing is lost if the step fails: the commit is then undone whole
and the current file stays as it was. Thinning (`thinning.py`) then decides which older
versions go; their files are removed once the transaction has committed.

A version belongs to one file (its area and name) of one thread of one user: every read
names all of them, so a version id from elsewhere finds nothing.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from pathlib import PurePosixPath
from typing import Protocol

from sqlalchemy import update
from sqlalchemy.engine import Connection

from deerflow_web.errors import ArtifactPrefixError
from deerflow_web.errors import InfectedFile
from deerflow_web.errors import InvalidPath
from deerflow_web.errors import UploadNotFound
from deerflow_web.errors import VersionNotFound
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.models import OnConflict
from deerflow_web.models import ScanState
from deerflow_web.models import ScanVerdict
from deerflow_web.models import UploadRecord
from deerflow_web.services.history.thinning import Aged
from deerflow_web.services.history.thinning import versions_to_keep
from deerflow_web.services.quotas.usage import owner_scope_prefix
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import all_or_nothing
from deerflow_web.settings import HistorySettings
from deerflow_web.storage.database import file_versions
from deerflow_web.storage.digest import hash_and_sniff
from deerflow_web.storage.history import FileVersion
from deerflow_web.storage.history import delete_versions
from deerflow_web.storage.history import history_bytes
from deerflow_web.storage.history import insert_version
from deerflow_web.storage.history import link_or_copy
from deerflow_web.storage.history import remove_quietly
from deerflow_web.storage.history import version_of
from deerflow_web.storage.history import versions_of
from deerflow_web.storage.local import AtomicCommit
from deerflow_web.storage.local import is_safe_destination
from deerflow_web.storage.local import staging_path
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.records import RecordsTransaction

VERSIONED_AREAS = (Area.UPLOADS, Area.OUTPUTS)  # what a replace can happen in
# Version ids are 32 lower-case hex digits; anything else is refused before a lookup.
_HEX = frozenset("0123456789abcdef")


@dataclass
class MovedIn:
    """History bytes moved to a staging name for a commit (`UploadService.commit_staged`);
    `discard` puts them back where they came from when the commit did not take them."""

    path: Path
    origin: Path

    def close(self) -> None:
        """Nothing is held open."""

    def discard(self) -> None:
        if os.path.lexists(self.path):
            os.replace(self.path, self.origin)


@dataclass(frozen=True)
class VersionedFile:
    """A file that can have versions: its area and its path inside it."""

    area: Area
    name: str

    @property
    def virtual_path(self) -> str:
        return f"{VIRTUAL_PATH_PREFIX}/{self.area.value}/{self.name}"


def versioned_file(virtual_path: str) -> VersionedFile:
    """The area and path a virtual path names, refused unless it lies in uploads/ or outputs/.

    Raises:
        ArtifactPrefixError: Not under /mnt/user-data.
        InvalidPath: Not a file of uploads/ or outputs/ (`..`, an empty segment, ...).
    """
    stripped = virtual_path.strip("/")
    prefix = VIRTUAL_PATH_PREFIX.strip("/")
    if not stripped.startswith(prefix + "/"):
        raise ArtifactPrefixError()
    area_name, _, relative = stripped[len(prefix) + 1 :].partition("/")
    if area_name not in {a.value for a in VERSIONED_AREAS} or not relative:
        raise InvalidPath()
    parts = relative.split("/")
    if any(part in ("", ".", "..") or "\x00" in part for part in parts):
        raise InvalidPath()
    area = Area(area_name)
    if area is Area.UPLOADS and len(parts) != 1:
        raise InvalidPath()  # uploads are flat
    return VersionedFile(area, relative)


def check_version_id(version_id: str) -> None:
    """Refuse what cannot be a version id (and so can never name a file) as not found."""
    if len(version_id) != 32 or not set(version_id) <= _HEX:
        raise VersionNotFound("the file", version_id)


class FileScanner(Protocol):
    """The virus scanner's scan of a whole file (`services/scanning`)."""

    def scan_file(self, path: Path, filename: str) -> ScanVerdict: ...

    def signatures(self, *, fresh: bool = False) -> str | None: ...


class FileVersions:
    """Keep, thin, list, serve and restore versions of a thread's files."""

    def __init__(
        self,
        uploads: UploadService,
        settings: HistorySettings,
        *,
        clock: Callable[[], float] = time.time,
        versions_quota: Callable[[Connection, str], int | None] = lambda _db, _owner: None,
        scanner: FileScanner | None = None,
    ) -> None:
        self.uploads = uploads
        self.scanner = scanner  # None: scanning is off
        self.settings = settings
        self._clock = clock
        # How many bytes all of an owner's versions may hold (their quota x
        # `versions.max_quota_share`), read in the replacing write's transaction. None: no
        # bound but the count and the thinning rule.
        self.versions_quota = versions_quota

    @property
    def enabled(self) -> bool:
        return self.settings.versions_enabled

    # --- inside a commit ---------------------------------------------------------------

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
        """Give the bytes at `current` a name in the versions folder and a row, in `txn`;
        return the version files thinning let go (remove them once `txn` committed)."""
        if not self.enabled:
            return []
        folder = folders.versions_dir()
        folders.make_dirs(folder)
        version_id = secrets.token_hex(16)
        commit.keep_as(current, folder / version_id, link_or_copy)
        insert_version(
            txn.connection,
            folders.scope,
            FileVersion(
                version_id,
                Area(area).value,
                name,
                sha256,
                size,
                content_type,
                self._clock(),
                folders.ref.user_id or None,
            ),
        )
        return self._thin(txn, folders, Area(area), name)

    def _thin(
        self, txn: RecordsTransaction, folders: ThreadFolders, area: Area, name: str
    ) -> list[Path]:
        versions = versions_of(txn.connection, folders.scope, area.value, name)
        keep = versions_to_keep(
            [Aged(v.version_id, v.created_at, v.size) for v in versions],
            self._clock(),
            self.settings.keep_last,
            self._budget(txn.connection, folders, sum(v.size for v in versions)),
        )
        dropped = [v.version_id for v in versions if v.version_id not in keep]
        delete_versions(txn.connection, folders.scope, dropped)
        folder = folders.versions_dir()
        return [folder / version_id for version_id in dropped]

    def _budget(self, db: Connection, folders: ThreadFolders, own_bytes: int) -> int | None:
        """What this file's versions may hold: the owner's versions quota less what their
        other versions (other files, other threads) hold."""
        owner = folders.ref.user_id
        quota = self.versions_quota(db, owner)
        if quota is None:
            return None
        all_versions, _trash = history_bytes(db, owner_scope_prefix(owner))
        return max(quota - (all_versions - own_bytes), 0)

    def renamed(self, txn: RecordsTransaction, folders: ThreadFolders, old: str, new: str) -> None:
        """An upload's versions follow it to its new name; those of a file it replaced
        stay with the name, with the replaced bytes now among them."""
        txn.connection.execute(
            update(file_versions)
            .where(
                file_versions.c.scope == folders.scope,
                file_versions.c.area == Area.UPLOADS.value,
                file_versions.c.filename == old,
            )
            .values(filename=new)
        )

    def forget(self, txn: RecordsTransaction, folders: ThreadFolders, name: str) -> list[Path]:
        """Drop every version of an upload deleted for good; return their files."""
        versions = versions_of(txn.connection, folders.scope, Area.UPLOADS.value, name)
        delete_versions(txn.connection, folders.scope, [v.version_id for v in versions])
        folder = folders.versions_dir()
        return [folder / v.version_id for v in versions]

    # --- what people see ----------------------------------------------------------------

    def list(self, thread: Thread, file: VersionedFile) -> list[FileVersion]:
        """The file's versions, newest first.

        Raises:
            UploadNotFound: The file does not exist (its versions are not shown without it).
        """
        folders = self.uploads.folders(thread)
        self._require_current(folders, file)
        with self.uploads.records.engine.connect() as db:
            return versions_of(db, folders.scope, file.area.value, file.name)

    def get(self, thread: Thread, file: VersionedFile, version_id: str) -> tuple[FileVersion, Path]:
        """One version and the path of its bytes.

        Raises:
            UploadNotFound: No such file. VersionNotFound: No such version of it.
        """
        folders = self.uploads.folders(thread)
        self._require_current(folders, file)
        version = self._version(folders, file, version_id)
        path = folders.versions_dir() / version.version_id
        if not os.path.isfile(path) or os.path.islink(path):
            raise VersionNotFound(file.name, version_id)
        return version, path

    def restore(self, thread: Thread, file: VersionedFile, version_id: str) -> FileVersion:
        """Make a version current again. The current bytes become a version first (so the
        restore can itself be undone); a companion converted from the file is dropped, as
        a replace drops it. Returns the restored version (its bytes are the file's now).

        Raises:
            UploadNotFound, VersionNotFound.
        """
        folders = self.uploads.folders(thread)
        self._require_current(folders, file)
        version = self._version(folders, file, version_id)
        if file.area is Area.UPLOADS:
            self._restore_upload(folders, version)
        else:
            self._restore_output(folders, file, version)
        return version

    def _restore_upload(self, folders: ThreadFolders, version: FileVersion) -> UploadRecord:
        folder = folders.uploads_dir()
        origin = folders.versions_dir() / version.version_id
        moved = MovedIn(staging_path(folder), origin)
        try:
            os.rename(origin, moved.path)
        except FileNotFoundError:
            raise VersionNotFound(version.filename, version.version_id) from None
        scope = folders.scope
        try:
            # Scanned again as it becomes current (today's signatures), as a finished
            # resumable upload is: a verdict for the record, or the restore is refused.
            verdict = None
            if self.scanner is not None:
                verdict = self.scanner.scan_file(moved.path, version.filename)
                if verdict.state is ScanState.INFECTED:
                    raise InfectedFile(version.filename, verdict.found or "unknown")
            result = self.uploads.commit_staged(
                folders,
                version.filename,
                moved,
                sha256=version.sha256,
                content_type=version.content_type or "application/octet-stream",
                on_conflict=OnConflict.REPLACE,
                then=lambda txn, _saved: delete_versions(
                    txn.connection, scope, [version.version_id]
                ),
                verdict=verdict,
            )
        except BaseException:
            moved.discard()
            raise
        return result.files[0].record

    def _restore_output(
        self, folders: ThreadFolders, file: VersionedFile, version: FileVersion
    ) -> None:
        named = self._output_path(folders, file)
        origin = folders.versions_dir() / version.version_id
        commit = AtomicCommit()
        let_go: list[Path] = []
        with all_or_nothing(commit, lambda: file.name, lambda: f"Failed to restore {file.name}"):
            with self.uploads.records.locked(folders.scope) as txn:
                if not os.path.lexists(origin):
                    raise VersionNotFound(file.name, version.version_id)
                if not is_safe_destination(named):
                    raise UploadNotFound(file.name)
                if os.path.lexists(named):
                    sha256, content_type = hash_and_sniff(named)
                    let_go = self.keep_version(
                        txn,
                        folders,
                        commit,
                        area=Area.OUTPUTS,
                        name=file.name,
                        current=named,
                        sha256=sha256,
                        size=named.lstat().st_size,
                        content_type=content_type,
                    )
                staging = staging_path(named.parent)
                commit.rename(origin, staging)
                commit.rename(staging, named)
                delete_versions(txn.connection, folders.scope, [version.version_id])
        remove_quietly(let_go)

    def replace_output(
        self,
        folders: ThreadFolders,
        name: str,
        named: Path,
        staged: Path,
        commit: AtomicCommit,
        *,
        sha256: str,
        size: int,
    ) -> list[Path]:
        """An artifact edit's rename of `staged` over `named` (outputs/`name`), with the
        bytes it replaces kept as a version in the same step; returns the files thinning
        let go, for the caller to remove once its commit holds."""
        with self.uploads.records.locked(folders.scope) as txn:
            let_go = self.keep_version(
                txn,
                folders,
                commit,
                area=Area.OUTPUTS,
                name=name,
                current=named,
                sha256=sha256,
                size=size,
                content_type=None,
            )
            commit.rename(staged, named)
        return let_go

    # --- lookups ------------------------------------------------------------------------

    def _version(self, folders: ThreadFolders, file: VersionedFile, version_id: str) -> FileVersion:
        check_version_id(version_id)
        with self.uploads.records.engine.connect() as db:
            version = version_of(db, folders.scope, file.area.value, file.name, version_id)
        if version is None:
            raise VersionNotFound(file.name, version_id)
        return version

    def _require_current(self, folders: ThreadFolders, file: VersionedFile) -> None:
        if file.area is Area.UPLOADS:
            self.uploads.get_upload(folders, file.name)  # a listed upload, or 404
            return
        named = self._output_path(folders, file)
        if not named.is_file() or named.is_symlink():
            raise UploadNotFound(file.name)

    @staticmethod
    def _output_path(folders: ThreadFolders, file: VersionedFile) -> Path:
        parts = PurePosixPath(file.name).parts
        named = folders.area_dir(Area.OUTPUTS).joinpath(*parts)
        folders.paths.checked(named.parent)  # no folder on the way is a link (403)
        if is_staging_name(named.name):
            raise UploadNotFound(file.name)
        return named
