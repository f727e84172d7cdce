"""The history the upload commit writes into (`UploadService.history`): versions on every
replace, the trash on every delete; built once per app (`make_history`)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Connection

from deerflow_web.models import Area
from deerflow_web.services.history.trash import Trash
from deerflow_web.services.history.versions import FileScanner
from deerflow_web.services.history.versions import FileVersions
from deerflow_web.services.quotas.policy import QuotaPolicy
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.settings import HistorySettings
from deerflow_web.storage.local import AtomicCommit
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.records import RecordsTransaction
from deerflow_web.storage.records import StoredRecord


class ThreadHistory:
    """`FileHistory` for the upload service: the versions and the trash together."""

    def __init__(self, versions: FileVersions, trash: Trash) -> None:
        self.versions = versions
        self.trash_bin = trash

    @property
    def trash_enabled(self) -> bool:
        return self.trash_bin.enabled

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
        return self.versions.keep_version(
            txn,
            folders,
            commit,
            area=area,
            name=name,
            current=current,
            sha256=sha256,
            size=size,
            content_type=content_type,
        )

    def trash(
        self,
        txn: RecordsTransaction,
        folders: ThreadFolders,
        commit: AtomicCommit,
        stored: list[StoredRecord],
    ) -> str:
        return self.trash_bin.trash(txn, folders, commit, stored)

    def renamed(self, txn: RecordsTransaction, folders: ThreadFolders, old: str, new: str) -> None:
        self.versions.renamed(txn, folders, old, new)

    def forget(self, txn: RecordsTransaction, folders: ThreadFolders, name: str) -> list[Path]:
        return self.versions.forget(txn, folders, name)


def make_history(
    uploads: UploadService,
    settings: HistorySettings,
    scanner: FileScanner | None = None,
    quotas: QuotaPolicy | None = None,
) -> ThreadHistory:
    """Build the versions and the trash over the upload service, and hook them into it
    (`scanner`: scans a version, or a file from the trash, again as it is restored;
    `quotas`: versions hold at most `versions.max_quota_share` of their owner's quota)."""

    def versions_quota(db: Connection, owner: str) -> int | None:
        quota = None if quotas is None else quotas.quota_on(db, owner)
        return None if quota is None else int(quota * settings.max_quota_share)

    versions = FileVersions(uploads, settings, scanner=scanner, versions_quota=versions_quota)
    history = ThreadHistory(versions, Trash(uploads, settings, scanner=scanner))
    uploads.history = history
    return history
