"""Several files of a thread as one zip, streamed while it is written.

A person who selects twenty files (or a whole tab) wants one download, not twenty. The
archive is never built first: `zipfile` writes into a sink that is drained after every
chunk, so neither a temporary file of the whole archive nor memory that grows with its size
is needed, and the first bytes leave before the last file is read. Without a seekable
output, `zipfile` writes each entry's sizes and CRC in a data descriptor after its data, and
switches to ZIP64 records for a file of 2 GiB or more (asked for in advance, since the size
is known) and for an archive past 4 GiB. Names keep their exact spelling: `zipfile` sets the
UTF-8 flag (bit 11) on every name outside ASCII, so `报告.pdf` unpacks as `报告.pdf`.

Each file is resolved exactly as its own download would be (`resolve_artifact`: inside the
caller's thread, no links followed, uploads/ only as listed) before the first byte is sent,
so a name that the download would refuse makes the whole request fail with the same error,
and nothing is sent.
"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from deerflow_web.errors import InvalidInput
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.browse import list_area
from deerflow_web.storage.paths import ThreadFolders

CHUNK_BYTES = 1024 * 1024
# Enough for any selection a person makes; a bound so one request cannot hold a worker
# resolving a hundred thousand names before it sends anything.
MAX_MEMBERS = 5000
ZIP64_FROM = 2**31 - 1  # zipfile's own ZIP64 limit for one entry


@dataclass(frozen=True)
class ZipMember:
    """One file of the archive: where it is, and the name it gets inside."""

    arcname: str
    artifact: Artifact


class _Sink:
    """A write-only, non-seekable stream whose bytes are taken out as they come."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._written = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        # zipfile asks where it is to fill in offsets; it never seeks (seekable() is False).
        return self._written

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def members_for_paths(
    resolve: Callable[[str], Artifact], user_data_paths: Iterable[str]
) -> list[ZipMember]:
    """The named files (`uploads/a.txt`, `outputs/x/y.csv`), each resolved as its download
    would be. Inside the zip a file keeps its path below its area when all come from one
    area, else its whole user-data path, so two areas' `a.txt` never collide.

    Raises:
        InvalidInput: No file, too many, or the same file twice.
        ArtifactNotFound, PathTraversal, NotAFile: What `resolve` raises for one of them.
    """
    paths = [path.strip("/") for path in user_data_paths if path and path.strip("/")]
    if not paths:
        raise InvalidInput("Select at least one file to download.", ("query", "paths"))
    if len(paths) > MAX_MEMBERS:
        raise InvalidInput(
            f"At most {MAX_MEMBERS} files can be downloaded at once.", ("query", "paths")
        )
    if len(set(paths)) != len(paths):
        raise InvalidInput("The same file was named twice.", ("query", "paths"))
    areas = {path.partition("/")[0] for path in paths}
    one_area = len(areas) == 1
    members = []
    for path in paths:
        artifact = resolve(f"{VIRTUAL_PATH_PREFIX}/{path}")
        arcname = path.partition("/")[2] if one_area else path
        members.append(ZipMember(arcname, artifact))
    return members


def area_paths(
    thread: ThreadFolders,
    area: Area,
    folder: str,
    upload_names: Callable[[], list[str]],
) -> list[str]:
    """Every file of a tab (uploads as listed; a folder of outputs/workspace with its
    subfolders), as user-data paths."""
    if area is Area.UPLOADS:
        return [f"{Area.UPLOADS.value}/{name}" for name in upload_names()]
    found: list[str] = []
    pending = [folder.strip("/")]
    while pending and len(found) <= MAX_MEMBERS:
        listing = list_area(thread, area, pending.pop())
        for entry in listing.entries:
            if entry.is_dir:
                pending.append(entry.path)
            else:
                found.append(entry.user_data_path)
    return found


def stream_zip(
    members: list[ZipMember], open_member: Callable[[ZipMember], BinaryIO]
) -> Iterator[bytes]:
    """The archive's bytes, in pieces of about a chunk, written as they are read.

    Files are stored as they are (no compression): most of what people attach is already
    compressed (images, PDFs, Office files), and storing keeps a large download at disk
    speed. A file that vanished after the request was checked is left out rather than
    breaking the archive half way.
    """
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for member in members:
            try:
                source = open_member(member)
            except OSError:
                continue
            with source:
                info = zipfile.ZipInfo(member.arcname, _date_time(source))
                info.compress_type = zipfile.ZIP_STORED
                info.external_attr = 0o644 << 16
                large = member.artifact.size >= ZIP64_FROM
                with archive.open(info, "w", force_zip64=large) as entry:
                    while chunk := source.read(CHUNK_BYTES):
                        entry.write(chunk)
                        if data := sink.take():
                            yield data
            if data := sink.take():
                yield data
    if data := sink.take():
        yield data


def _date_time(source: BinaryIO) -> tuple[int, int, int, int, int, int]:
    """The file's modification time as zip stores it (local wall clock, 1980 at the
    earliest, which is zip's epoch)."""

    try:
        mtime = os.fstat(source.fileno()).st_mtime
    except (OSError, AttributeError, ValueError):
        mtime = time.time()
    parts = time.localtime(max(mtime, 315532800 + 86400))
    return (parts.tm_year, parts.tm_mon, parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec)
