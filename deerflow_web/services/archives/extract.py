"""Extract an uploaded archive into a folder of the thread, member by member, refusals named.

The folder is named after the archive (`reports.zip` → `workspace/reports/`) and follows
the upload conflict rule for that name: `rename` (the default: `reports_1/`), `reject`
(409) or `replace` (the old folder goes only once the new one is in place). Members are
first written into a staging folder in the thread's archive cache, outside user-data, under
the same checks as a read (`reader`), with each file also held to the upload limit for
one file; the staging folder is then renamed into place in one step. So a refused archive,
or one stopped halfway by its caps, leaves nothing in user-data, and no write ever leaves
the thread's folder: every path is built from checked member names below a folder this
module created, opened with O_NOFOLLOW|O_EXCL.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from deerflow_web.concurrency import off_loop
from deerflow_web.errors import ArchiveMemberRefused
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NotAnArchive
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.models import OnConflict
from deerflow_web.models import archive_suffix
from deerflow_web.services.archives.members import CACHE_FOLDER
from deerflow_web.services.archives.reader import MemberRefusal
from deerflow_web.services.archives.reader import iter_member_streams
from deerflow_web.services.archives.reader import list_archive
from deerflow_web.services.archives.reader import shown
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.settings import ArchiveLimits
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import storage_modes

EXTRACT_AREA = Area.WORKSPACE
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class ExtractedFile:
    """One member written out."""

    name: str  # inside the archive
    virtual_path: str
    size: int


@dataclass(frozen=True)
class Extraction:
    """What an extraction wrote, where, and what it refused with each reason."""

    archive: str
    folder: str | None  # virtual path of the folder; None when nothing was written
    files: list[ExtractedFile] = field(default_factory=list)
    refused: list[MemberRefusal] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The JSON answer of the extract route."""
        return {
            "archive": self.archive,
            "folder": self.folder,
            "files": [
                {"name": f.name, "virtual_path": f.virtual_path, "size": f.size} for f in self.files
            ],
            "refused": [refusal.as_dict() for refusal in self.refused],
            "message": (
                f"Extracted {len(self.files)} file(s) from {self.archive}"
                + (f"; refused {len(self.refused)} member(s)" if self.refused else "")
            ),
        }


def folder_name_for(archive: str) -> str:
    """`reports.zip` → `reports`, `data.tar.gz` → `data`."""
    suffix = archive_suffix(archive)
    if suffix is None:
        raise NotAnArchive(archive)
    return archive[: -len(suffix)]


class ArchiveExtractor:
    """Extracts a thread's uploaded archives into folders of the same thread."""

    def __init__(self, uploads: UploadService, limits: ArchiveLimits) -> None:
        self.uploads = uploads
        self.paths = uploads.paths
        self.limits = limits

    def extract(
        self,
        thread: Thread,
        filename: str,
        *,
        on_conflict: OnConflict = OnConflict.RENAME,
    ) -> Extraction:
        """Extract the upload `filename` into `workspace/<its name without suffix>/`.

        Raises:
            UploadNotFound: No such upload.
            NotAnArchive: It is not a .zip, .tar, .tar.gz or .tgz.
            ArchiveRefused: The whole archive is refused (nothing was written).
            NameConflict: `reject` and the folder exists.
        """
        # Decompressing up to `max_uncompressed_size` takes seconds: off the event loop.
        return off_loop(self._extract, self.uploads.folders(thread), filename, on_conflict)

    def _extract(self, thread: ThreadFolders, filename: str, on_conflict: OnConflict) -> Extraction:
        self.uploads.get_upload(thread, filename)  # a listed upload, no stranger
        folder_name = folder_name_for(filename)
        source = thread.uploads_dir() / filename
        if not source.is_file() or source.is_symlink():
            raise UploadNotFound(filename)
        listing = list_archive(source, self.limits, filename)
        refused = list(listing.refused)
        staging = thread.thread_dir() / CACHE_FOLDER / f".extract-{secrets.token_hex(8)}"
        self.paths.make_dirs(staging)
        try:
            written = self._write_members(source, filename, listing.members, staging, refused)
            if not written:
                return Extraction(filename, None, [], refused)
            area = thread.area_location(EXTRACT_AREA)
            self.paths.make_dirs(area)
            target = self._place(staging, area, folder_name, on_conflict)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        virtual_folder = f"{VIRTUAL_PATH_PREFIX}/{EXTRACT_AREA.value}/{target.name}"
        files = [ExtractedFile(name, f"{virtual_folder}/{name}", size) for name, size in written]
        return Extraction(filename, virtual_folder, files, refused)

    def _write_members(
        self,
        source: Path,
        filename: str,
        members: tuple[Any, ...],
        staging: Path,
        refused: list[MemberRefusal],
    ) -> list[tuple[str, int]]:
        """Write the usable members below `staging`; return (name, size) of each file."""
        max_size = self.uploads.limits.max_file_size
        for member in members:
            if member.is_dir:
                self.paths.make_dirs(staging.joinpath(*member.name.split("/")))
        wanted = []
        for member in members:
            if member.is_dir:
                continue
            if member.size > max_size:
                refused.append(MemberRefusal(member.name, _too_large(member.name, max_size)))
                continue
            wanted.append(member)
        written: list[tuple[str, int]] = []
        for stream in iter_member_streams(source, wanted, self.limits, filename):
            name = stream.member.name
            target = staging.joinpath(*name.split("/"))
            self.paths.make_dirs(target.parent)
            fd = os.open(target, _WRITE_FLAGS, storage_modes().file)
            try:
                with os.fdopen(fd, "wb") as out:
                    while chunk := stream.read():
                        if stream.produced > max_size:
                            raise ArchiveMemberRefused(name, _too_large(name, max_size))
                        out.write(chunk)
                    os.fchmod(out.fileno(), storage_modes().file)
            except ArchiveMemberRefused as refusal:
                target.unlink(missing_ok=True)
                refused.append(MemberRefusal(name, refusal.reason))
                continue
            written.append((name, stream.produced))
        return written

    def _place(self, staging: Path, area: Path, name: str, on_conflict: OnConflict) -> Path:
        """Rename the staging folder into the area under `name`, by the conflict rule."""
        target = area / name
        if on_conflict is OnConflict.RENAME:
            number = 0
            while True:
                try:
                    os.mkdir(target, storage_modes().folder)  # claims the name, atomically
                    break
                except FileExistsError:
                    number += 1
                    target = area / f"{name}_{number}"
            os.rename(staging, target)  # onto the empty folder just claimed
        elif on_conflict is OnConflict.REJECT:
            try:
                os.mkdir(target, storage_modes().folder)
            except FileExistsError:
                raise NameConflict(name) from None
            os.rename(staging, target)
        else:
            old = None
            if os.path.lexists(target):
                if target.is_symlink() or not target.is_dir():
                    raise NameConflict(name)
                old = staging.with_name(f".replaced-{secrets.token_hex(8)}")
                os.rename(target, old)
            os.rename(staging, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        os.chmod(target, storage_modes().folder)
        return target


def _too_large(name: str, limit: int) -> str:
    return f"member {shown(name)} is larger than the upload limit of {limit} bytes"
