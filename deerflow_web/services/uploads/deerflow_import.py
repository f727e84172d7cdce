"""Adopt an existing DeerFlow data directory, once and offline (`flask import-deerflow DIR`).

Doc C's migration note: no compatibility layer in the request path; history moves over in
one offline step. DeerFlow keeps files under `{DIR}/threads/{id}/user-data/` (its flat
layout) or `{DIR}/users/{uid}/threads/{id}/user-data/` (per user), and no records at all.
This copies (or, with `move`, moves) every regular file of `uploads/`, `outputs/` and
`workspace/` into this server's layout and writes the upload records DeerFlow never had:
SHA-256 and the type sniffed from the bytes for every upload, and `converted_from` for a
`.md` that DeerFlow's naming marks as a conversion companion.

What is never done: a file already here under the same name is never replaced (same bytes:
already adopted; other bytes: a reported collision); links and special files are never
followed or copied; nothing in DIR changes unless `move` is asked for, and then only the
files adopted go. A second run finds everything in place and changes nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import CONVERTIBLE_EXTENSIONS
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import Area
from deerflow_web.models import RecordSource
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadRecord
from deerflow_web.models import validate_thread_id
from deerflow_web.models import validate_user_id
from deerflow_web.storage.filenames import is_companion_name
from deerflow_web.storage.local import HASH_CHUNK
from deerflow_web.storage.local import StagingFile
from deerflow_web.storage.local import facts_of
from deerflow_web.storage.local import hash_and_sniff
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.records import DatabaseUploadRecords
from deerflow_web.storage.records import StoredRecord

AREAS = (Area.UPLOADS, Area.OUTPUTS, Area.WORKSPACE)


@dataclass(frozen=True)
class Source:
    """One DeerFlow thread: its id, its DeerFlow user (None: flat layout), its folder."""

    thread_id: str
    deerflow_user: str | None
    user_data: Path

    @property
    def label(self) -> str:
        owner = "" if self.deerflow_user is None else f"users/{self.deerflow_user}/"
        return f"{owner}threads/{self.thread_id}"


@dataclass
class ImportReport:
    """What a run did. Paths are relative to DIR; `adopted` names where each file went."""

    adopted: list[tuple[str, str]] = field(default_factory=list)  # (source, thread/area/name)
    already: int = 0  # files found here already, with the same bytes
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source, why)
    companions: int = 0
    records_written: int = 0
    threads: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Owners:
    """Who gets DeerFlow's threads: None everywhere in single-user mode (the flat layout)."""

    accounts: bool
    flat_owner: str | None = None  # our user id for DeerFlow's flat-layout threads
    by_deerflow_user: Mapping[str, str] = field(default_factory=dict)  # DeerFlow uid -> ours

    def target(self, source: Source) -> tuple[str | None, str | None]:
        """(our owner, None), or (None, the reason the thread is skipped); the owner is
        `SINGLE_USER` with accounts off."""
        if not self.accounts:
            return SINGLE_USER, None
        if source.deerflow_user is None:
            if self.flat_owner is None:
                return None, "no owner for DeerFlow's flat layout: pass --owner EMAIL"
            return self.flat_owner, None
        mapped = self.by_deerflow_user.get(source.deerflow_user)
        if mapped is None:
            return None, (
                f"DeerFlow user {source.deerflow_user} is not mapped: "
                f"pass --map {source.deerflow_user}=EMAIL"
            )
        return mapped, None


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _relative(path: Path | str, root: Path) -> str:
    return Path(path).relative_to(root).as_posix()


def find_sources(root: Path, report: ImportReport) -> Iterator[Source]:
    """Every DeerFlow thread under `root`, flat layout first, then each user's in order.

    Anything that is not a plain folder with a valid id is reported and left out.
    """
    layouts: list[tuple[str | None, Path]] = [(None, root / "threads")]
    for entry in _entries(root / "users"):
        where = _relative(entry.path, root)
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            report.skipped.append((where, "not a folder (links are never followed)"))
            continue
        try:
            validate_user_id(entry.name)
        except InvalidUserId:
            report.skipped.append((where, "not a valid DeerFlow user id"))
            continue
        layouts.append((entry.name, Path(entry.path) / "threads"))
    for deerflow_user, threads in layouts:
        if threads.is_symlink():
            report.skipped.append((_relative(threads, root), "a link (never followed)"))
            continue
        for entry in _entries(threads):
            where = _relative(entry.path, root)
            if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                report.skipped.append((where, "not a folder (links are never followed)"))
                continue
            try:
                validate_thread_id(entry.name)
            except InvalidThreadId:
                report.skipped.append((where, "not a valid thread id"))
                continue
            user_data = Path(entry.path) / "user-data"
            if user_data.is_symlink():
                report.skipped.append((_relative(user_data, root), "a link (never followed)"))
                continue
            yield Source(entry.name, deerflow_user, user_data)


def _files(folder: Path, root: Path, report: ImportReport, *, nested: bool) -> Iterator[Path]:
    """Regular files of an area; links, special files, staging names reported and left out.

    uploads/ is one folder in DeerFlow, as here; outputs/ and workspace/ may nest.
    """
    if folder.is_symlink():
        report.skipped.append((_relative(folder, root), "a link (never followed)"))
        return
    for entry in _entries(folder):
        path = Path(entry.path)
        where = _relative(path, root)
        try:
            entry.name.encode("utf-8")
        except UnicodeEncodeError:
            report.skipped.append((where, "the name is not valid UTF-8"))
            continue
        if entry.is_symlink():
            report.skipped.append((where, "a symbolic link (never followed)"))
        elif entry.is_dir(follow_symlinks=False):
            if nested:
                yield from _files(path, root, report, nested=True)
            else:
                report.skipped.append((where, "a folder inside uploads/"))
        elif not entry.is_file(follow_symlinks=False):
            report.skipped.append((where, "a special file (FIFO, socket or device)"))
        elif is_staging_name(entry.name):
            report.skipped.append((where, "an unfinished upload's staging file"))
        elif entry.stat(follow_symlinks=False).st_nlink > 1:
            report.skipped.append((where, "a hard link: its bytes may belong to another file"))
        else:
            yield path


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as left, open(b, "rb") as right:
        while True:
            chunk = left.read(HASH_CHUNK)
            if chunk != right.read(HASH_CHUNK):
                return False
            if not chunk:
                return True


def _place(source: Path, destination: Path, move: bool) -> bool:
    """Put a copy (or the file itself) at `destination`; False if that name is taken.

    A link to a staging file, or to the source itself when moving on one file system, puts
    the whole file in place at once and never replaces a file that is there.
    """
    info = source.stat()
    if move:
        try:
            os.link(source, destination, follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
        else:
            source.unlink()
            return True
    staging = StagingFile(destination.parent)
    try:
        with open(source, "rb", buffering=0) as handle:
            while chunk := handle.read(HASH_CHUNK):
                staging.write(chunk)
        staging.finish(destination.name)
        os.utime(staging.path, ns=(info.st_atime_ns, info.st_mtime_ns))  # DeerFlow's time
        try:
            os.link(staging.path, destination)
        except FileExistsError:
            return False
    finally:
        staging.discard()
    if move:
        source.unlink()
    return True


def _companions(uploads: Path, names: list[str]) -> dict[str, str]:
    """companion -> original, where DeerFlow's naming says a `.md` was converted.

    DeerFlow names a document's Markdown by replacing its suffix with `.md` and writes it
    after the document. A `.md` is taken as a companion only when exactly one convertible
    document has that name and the `.md` is not older than it; anything else is the user's
    own file, which a delete must never cascade to.
    """
    found: dict[str, str] = {}
    for name in names:
        if not name.lower().endswith(".md"):
            continue
        originals = [
            other
            for other in names
            if is_companion_name(name, other)
            and Path(other).suffix.lower() in CONVERTIBLE_EXTENSIONS
        ]
        if len(originals) != 1:
            continue
        if (uploads / name).stat().st_mtime_ns >= (uploads / originals[0]).stat().st_mtime_ns:
            found[name] = originals[0]
    return found


def _record_uploads(
    records: DatabaseUploadRecords, scope: str, uploads: Path, names: list[str]
) -> tuple[int, int]:
    """Write a record for each named upload that has none; (written, companions).

    Nothing is locked or written when every name has its record (a rerun).
    """
    names = [name for name in names if records.get(scope, name) is None]
    if not names:
        return 0, 0
    on_disk = sorted(entry.name for entry in _entries(uploads) if entry.is_file())
    companions = _companions(uploads, on_disk)
    written = 0
    with records.locked(scope) as txn:
        hashes = {}
        for name in names:
            if txn.get(name) is None:
                hashes[name] = hash_and_sniff(uploads / name)
        for name, (sha256, content_type) in hashes.items():
            info = (uploads / name).lstat()
            facts = facts_of(info)
            original = companions.get(name)
            source_sha = None
            if original is not None:
                known = txn.get(original)
                if known is not None:
                    source_sha = known.record.sha256
                elif original in hashes:
                    source_sha = hashes[original][0]
                else:
                    source_sha = hash_and_sniff(uploads / original)[0]
            record = UploadRecord(
                filename=name,
                size=info.st_size,
                sha256=sha256,
                content_type=content_type,
                uploaded_at=info.st_mtime_ns / 1e9,
                modified=info.st_mtime_ns / 1e9,
                source=RecordSource.UPLOAD if original is None else RecordSource.CONVERSION,
                converted_from=original,
                source_sha256=source_sha,
            )
            txn.put(StoredRecord(record, facts.mtime_ns, facts.inode, facts.ctime_ns))
            written += 1
    return written, sum(1 for name in hashes if name in companions)


def import_deerflow(
    root: Path,
    paths: ThreadPaths,
    records: DatabaseUploadRecords,
    owners: Owners,
    *,
    move: bool = False,
) -> ImportReport:
    """Adopt every thread of the DeerFlow data directory `root`; see the module docstring."""
    root = root.resolve()
    report = ImportReport()
    taken: dict[tuple[str | None, str], str] = {}  # (our user, thread) -> DeerFlow source
    for source in find_sources(root, report):
        user_id, reason = owners.target(source)
        if reason is not None:
            report.skipped.append((source.label, reason))
            continue
        first = taken.setdefault((user_id, source.thread_id), source.label)
        if first != source.label:
            report.skipped.append(
                (source.label, f"thread {source.thread_id} is already imported from {first}")
            )
            continue
        assert user_id is not None  # a reason was given otherwise
        _adopt_thread(
            root, source, paths, records, ThreadRef(source.thread_id, user_id), report, move
        )
    return report


def _adopt_thread(
    root: Path,
    source: Source,
    paths: ThreadPaths,
    records: DatabaseUploadRecords,
    ref: ThreadRef,
    report: ImportReport,
    move: bool,
) -> None:
    adopted_uploads: list[str] = []
    for area in AREAS:
        here = source.user_data / area.value
        target_area = paths.area_location(ref, area)
        for path in _files(here, root, report, nested=area is not Area.UPLOADS):
            where = _relative(path, root)
            inside = path.relative_to(here)
            destination = target_area / inside
            try:
                paths.make_dirs(destination.parent)
            except UnsafeFolder as error:
                report.skipped.append((where, f"{error.relative} is a link here"))
                continue
            if os.path.lexists(destination):
                if stat.S_ISREG(destination.lstat().st_mode) and _same_bytes(path, destination):
                    report.already += 1
                    if area is Area.UPLOADS:
                        adopted_uploads.append(destination.name)  # its record may be missing
                else:
                    report.skipped.append((where, "name collision: a different file is here"))
                continue
            if not _place(path, destination, move):
                report.skipped.append((where, "name collision: a different file is here"))
                continue
            report.adopted.append((where, f"{source.thread_id}/{area.value}/{inside.as_posix()}"))
            report.threads.add(source.thread_id)
            if area is Area.UPLOADS:
                adopted_uploads.append(destination.name)
    if adopted_uploads:
        uploads = paths.area_location(ref, Area.UPLOADS)
        written, companions = _record_uploads(records, paths.scope(ref), uploads, adopted_uploads)
        report.records_written += written
        report.companions += companions
