"""Read-only listings of a thread's outputs/ and workspace/ folders, subfolders included.

What the agent produced should be as visible as what the person uploaded. Only regular
files and real folders are listed: a symlink could point anywhere, and the artifact route
would refuse what it cannot reach, so showing one would only offer a broken link.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import PurePosixPath

from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import NotAFile
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.services.files.kinds import FileKind
from deerflow_web.services.files.kinds import file_kind
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import is_staging_name

BROWSABLE_AREAS = (Area.OUTPUTS, Area.WORKSPACE)


@dataclass(frozen=True)
class AreaEntry:
    """One file or folder inside an area."""

    name: str
    path: str  # relative to the area root, `/`-separated: what browse URLs take
    user_data_path: str  # relative to user-data (`outputs/a/b.txt`): what preview URLs take
    is_dir: bool
    size: int
    modified: float
    kind: FileKind | None


@dataclass(frozen=True)
class AreaListing:
    """The content of one folder of an area, and where that folder is."""

    area: Area
    folder: str  # "" for the area root
    entries: list[AreaEntry]

    @property
    def breadcrumbs(self) -> list[tuple[str, str]]:
        """(name, folder path) for each level below the area root."""
        parts = PurePosixPath(self.folder).parts if self.folder else ()
        return [(part, "/".join(parts[: i + 1])) for i, part in enumerate(parts)]

    @property
    def parent(self) -> str | None:
        """The folder one level up, or None at the area root."""
        if not self.folder:
            return None
        parent = str(PurePosixPath(self.folder).parent)
        return "" if parent == "." else parent


def list_area(thread: ThreadFolders, area: Area, folder: str = "") -> AreaListing:
    """Folders first, then files, each by name; a missing area root is simply empty.

    Raises:
        PathTraversal, UnsafeFolder, ArtifactNotFound (missing subfolder),
        NotAFile (the path names a file).
    """
    area = Area(area)
    folder = folder.strip("/")
    target = thread.resolve_in_area(area, folder)
    shown = f"{VIRTUAL_PATH_PREFIX.lstrip('/')}/{area.value}/{folder}".rstrip("/")
    if not target.exists():
        if folder:
            raise ArtifactNotFound(shown)
        return AreaListing(area, "", [])
    if not target.is_dir():
        raise NotAFile(shown)
    entries = []
    with os.scandir(target) as found:
        for entry in found:
            if is_staging_name(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            relative = f"{folder}/{entry.name}" if folder else entry.name
            entries.append(
                AreaEntry(
                    name=entry.name,
                    path=relative,
                    user_data_path=f"{area.value}/{relative}",
                    is_dir=is_dir,
                    size=0 if is_dir else info.st_size,
                    modified=info.st_mtime,
                    kind=None if is_dir else file_kind(entry.name),
                )
            )
    entries.sort(key=lambda e: (not e.is_dir, e.name.casefold(), e.name))
    return AreaListing(area, folder, entries)
