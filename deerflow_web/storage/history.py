"""The rows of a thread's history (issue 27): versions of replaced files, the trash.

Plain statements over the `file_versions` and `trashed_files` tables, run on the
connection the caller gives: the upload commit's own transaction when a version is kept
or a file is trashed, so the row and the rename it describes land together or not at all.
The bytes themselves sit in the thread's hidden history folder (`ThreadFolders`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy.engine import Connection

from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import ScanState
from deerflow_web.models import UploadRecord
from deerflow_web.storage.database import file_versions
from deerflow_web.storage.database import trashed_files


@dataclass(frozen=True)
class FileVersion:
    """Earlier bytes of one file: `filename` inside `area` ("uploads" or "outputs")."""

    version_id: str
    area: str
    filename: str
    sha256: str
    size: int
    content_type: str | None
    created_at: float
    created_by: str | None

    def as_dict(self) -> dict[str, Any]:
        """What the API lists for a version."""
        return {
            "version_id": self.version_id,
            "size": self.size,
            "sha256": self.sha256,
            "created_at": self.created_at,
            "created_by": self.created_by,
        }


@dataclass(frozen=True)
class TrashedFile:
    """A deleted upload and the companions that went with it, as their records were."""

    trash_id: str
    filename: str
    sha256: str
    size: int
    deleted_at: float
    deleted_by: str | None
    records: tuple[UploadRecord, ...]  # the file's own first

    @property
    def record(self) -> UploadRecord:
        return self.records[0]

    @property
    def companions(self) -> tuple[UploadRecord, ...]:
        return self.records[1:]

    def as_dict(self, expires_at: float | None) -> dict[str, Any]:
        """What the API lists for an entry of the trash."""
        return {
            "trash_id": self.trash_id,
            "filename": self.filename,
            "sha256": self.sha256,
            "size": self.size,
            "deleted_at": self.deleted_at,
            "deleted_by": self.deleted_by,
            "expires_at": expires_at,
            "companions": [record.filename for record in self.companions],
        }


_VERSION_COLUMNS = (
    file_versions.c.version_id,
    file_versions.c.area,
    file_versions.c.filename,
    file_versions.c.sha256,
    file_versions.c.size,
    file_versions.c.content_type,
    file_versions.c.created_at,
    file_versions.c.created_by,
)
_TRASH_COLUMNS = (
    trashed_files.c.trash_id,
    trashed_files.c.filename,
    trashed_files.c.sha256,
    trashed_files.c.size,
    trashed_files.c.deleted_at,
    trashed_files.c.deleted_by,
    trashed_files.c.records,
)


# Built once with bound parameters: a commit replacing many files runs these per file, and
# building them per call was most of a small replace's cost (as for the records).
_INSERT_VERSION = insert(file_versions).values(
    {column.name: bindparam(column.name) for column in file_versions.columns}
)
_SELECT_VERSIONS = (
    select(*_VERSION_COLUMNS)
    .where(
        file_versions.c.scope == bindparam("scope"),
        file_versions.c.area == bindparam("area"),
        file_versions.c.filename == bindparam("filename"),
    )
    .order_by(file_versions.c.created_at.desc(), file_versions.c.version_id.desc())
)
_DELETE_VERSIONS = delete(file_versions).where(
    file_versions.c.scope == bindparam("scope"),
    file_versions.c.version_id.in_(bindparam("ids", expanding=True)),
)


def insert_version(db: Connection, scope: str, version: FileVersion) -> None:
    db.execute(
        _INSERT_VERSION,
        {
            "scope": scope,
            "version_id": version.version_id,
            "area": version.area,
            "filename": version.filename,
            "sha256": version.sha256,
            "size": version.size,
            "content_type": version.content_type,
            "created_at": version.created_at,
            "created_by": version.created_by,
        },
    )


def versions_of(db: Connection, scope: str, area: str, filename: str) -> list[FileVersion]:
    """The file's versions, newest first."""
    rows = db.execute(_SELECT_VERSIONS, {"scope": scope, "area": area, "filename": filename})
    return [FileVersion(*row) for row in rows]


def versions_in(db: Connection, scope: str) -> list[FileVersion]:
    """Every version the thread keeps, of every file and area."""
    rows = db.execute(select(*_VERSION_COLUMNS).where(file_versions.c.scope == scope))
    return [FileVersion(*row) for row in rows]


def version_of(
    db: Connection, scope: str, area: str, filename: str, version_id: str
) -> FileVersion | None:
    """One version, only when it belongs to that file of that thread."""
    row = db.execute(
        select(*_VERSION_COLUMNS).where(
            file_versions.c.scope == scope,
            file_versions.c.area == area,
            file_versions.c.filename == filename,
            file_versions.c.version_id == version_id,
        )
    ).first()
    return FileVersion(*row) if row else None


def delete_versions(db: Connection, scope: str, version_ids: Iterable[str]) -> None:
    wanted = list(version_ids)
    if wanted:
        db.execute(_DELETE_VERSIONS, {"scope": scope, "ids": wanted})


def delete_scope(db: Connection, scope: str) -> None:
    """Forget the whole history of a thread (the thread is being deleted)."""
    db.execute(delete(file_versions).where(file_versions.c.scope == scope))
    db.execute(delete(trashed_files).where(trashed_files.c.scope == scope))


def record_as_json(record: UploadRecord) -> dict[str, Any]:
    return {
        "filename": record.filename,
        "size": record.size,
        "sha256": record.sha256,
        "content_type": record.content_type,
        "uploaded_at": record.uploaded_at,
        "modified": record.modified,
        "source": record.source.value,
        "original_filename": record.original_filename,
        "converted_from": record.converted_from,
        "conversion_state": record.conversion_state.value if record.conversion_state else None,
        "conversion_error": record.conversion_error,
        "source_sha256": record.source_sha256,
        "scan_state": record.scan_state.value if record.scan_state else None,
        "scan_signatures": record.scan_signatures,
    }


def record_from_json(data: dict[str, Any]) -> UploadRecord:
    state = data.get("conversion_state")
    scan = data.get("scan_state")
    return UploadRecord(
        filename=data["filename"],
        size=int(data["size"]),
        sha256=data["sha256"],
        content_type=data["content_type"],
        uploaded_at=float(data["uploaded_at"]),
        modified=float(data["modified"]),
        source=RecordSource(data.get("source") or RecordSource.UPLOAD.value),
        original_filename=data.get("original_filename"),
        converted_from=data.get("converted_from"),
        # A job that was running when the file was deleted does not run any more.
        conversion_state=(
            ConversionState(state)
            if state in (ConversionState.DONE.value, ConversionState.FAILED.value)
            else None
        ),
        conversion_error=data.get("conversion_error"),
        source_sha256=data.get("source_sha256"),
        scan_state=ScanState(scan) if scan else None,
        scan_signatures=data.get("scan_signatures"),
    )


def insert_trashed(db: Connection, scope: str, entry: TrashedFile) -> None:
    db.execute(
        insert(trashed_files).values(
            scope=scope,
            trash_id=entry.trash_id,
            filename=entry.filename,
            sha256=entry.sha256,
            size=entry.size,
            deleted_at=entry.deleted_at,
            deleted_by=entry.deleted_by,
            records=json.dumps([record_as_json(r) for r in entry.records]),
        )
    )


def _to_trashed(row: Any) -> TrashedFile:
    trash_id, filename, sha256, size, deleted_at, deleted_by, records = row
    return TrashedFile(
        trash_id,
        filename,
        sha256,
        size,
        deleted_at,
        deleted_by,
        tuple(record_from_json(r) for r in json.loads(records)),
    )


def trashed_in(db: Connection, scope: str) -> list[TrashedFile]:
    """The thread's trash, most recently deleted first."""
    rows = db.execute(
        select(*_TRASH_COLUMNS)
        .where(trashed_files.c.scope == scope)
        .order_by(trashed_files.c.deleted_at.desc(), trashed_files.c.trash_id)
    )
    return [_to_trashed(row) for row in rows]


def trashed_one(db: Connection, scope: str, trash_id: str) -> TrashedFile | None:
    row = db.execute(
        select(*_TRASH_COLUMNS).where(
            trashed_files.c.scope == scope, trashed_files.c.trash_id == trash_id
        )
    ).first()
    return _to_trashed(row) if row else None


def delete_trashed(db: Connection, scope: str, trash_ids: Iterable[str]) -> None:
    wanted = list(trash_ids)
    if wanted:
        db.execute(
            delete(trashed_files).where(
                trashed_files.c.scope == scope, trashed_files.c.trash_id.in_(wanted)
            )
        )


def expired_trash(db: Connection, before: float) -> list[tuple[str, str]]:
    """(scope, trash_id) of every entry deleted before `before`, in every thread."""
    rows = db.execute(
        select(trashed_files.c.scope, trashed_files.c.trash_id).where(
            trashed_files.c.deleted_at < before
        )
    )
    return [(scope, trash_id) for scope, trash_id in rows]


def history_bytes(db: Connection, scope_prefix: str) -> tuple[int, int]:
    """(bytes of versions, bytes in the trash) of every thread whose scope starts with
    `scope_prefix` (`users/{id}/threads/` for one user's): what a quota counts."""
    pattern = scope_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    totals = []
    for table in (file_versions, trashed_files):
        total = db.execute(
            select(func.coalesce(func.sum(table.c.size), 0)).where(
                table.c.scope.like(pattern, escape="\\")
            )
        ).scalar_one()
        totals.append(int(total))
    return totals[0], totals[1]


def link_or_copy(source: Path, dest: Path) -> None:
    """Give `source`'s bytes a second name `dest`: a hard link (no byte copied), or a copy
    where a link cannot be made (another file system, a file system without links)."""
    try:
        os.link(source, dest)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(source, dest)


def remove_quietly(paths: Iterable[Path]) -> None:
    """Remove files or folders of history whose rows are gone (a failure leaves an orphan
    that no row names, which nothing ever shows)."""
    for path in paths:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            continue
