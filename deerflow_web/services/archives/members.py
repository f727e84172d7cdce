"""Archive members as files the agent's tools can read, and their text cached in the thread.

A member is named by the archive's virtual path followed by its name inside
(`/mnt/user-data/uploads/reports.zip/q3/summary.docx`); a member that is itself an archive
is a folder too (`.../bundle.zip/inner.tar/notes.txt`), down to `max_depth` levels.

A member is read out of its archive under the caps of `reader` into the thread's archive
cache, `{thread}/archive-cache/`: beside `user-data`, so it is inside the thread's folder
(deleted with it, under its modes) yet outside what agents and sandboxes see as
/mnt/user-data. Entries are keyed by the archive's SHA-256 and the member's name, so an
archive replaced by new bytes never serves its old members, and identical archives share
nothing across threads. A document or image member is converted by the same isolated
converter, with the same limits, as an uploaded document (`conversion.runner`); its
Markdown, or the reason it has none, is kept beside its bytes, so a member is converted
once however often it is read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from pathlib import PurePosixPath

from deerflow_web.errors import ArchiveMemberNotFound
from deerflow_web.errors import ArchiveMemberRefused
from deerflow_web.errors import ArchiveRefused
from deerflow_web.errors import ConversionError
from deerflow_web.errors import DeerFlowError
from deerflow_web.models import CONVERTIBLE_EXTENSIONS
from deerflow_web.models import is_archive_name
from deerflow_web.models import suffix_of
from deerflow_web.services.archives.reader import ArchiveListing
from deerflow_web.services.archives.reader import ArchiveMember
from deerflow_web.services.archives.reader import iter_member_streams
from deerflow_web.services.archives.reader import list_archive
from deerflow_web.services.archives.reader import shown
from deerflow_web.settings import ArchiveLimits
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.paths import STAGING_PREFIX
from deerflow_web.storage.paths import STAGING_SUFFIX
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import storage_modes

logger = logging.getLogger(__name__)

CACHE_FOLDER = "archive-cache"
_TEXT_NAME = "text.md"
_SOURCE_NAME = "source"
_ARCHIVE_FOLDER = re.compile(r"[0-9a-f]{64}")
_FAILED_NAME = "failed.txt"
_HASH_CHUNK = 1024 * 1024
_KNOWN_HASHES = 1024
# Member conversions started and not finished in one process, waiting ones included: a
# grep over an archive of a thousand documents starts this many, and says of the others
# that their text is not ready yet, instead of queueing a thousand threads.
MAX_PENDING_CONVERSIONS = 16


class TextStillConverting(DeerFlowError):
    """A member's conversion runs longer than the caller waits; calling again finds it."""


def is_convertible_name(name: str) -> bool:
    """Whether a member is read through the converter (documents, and whatever else the
    converter takes, images among them once it reads them)."""
    return suffix_of(PurePosixPath(name).name).lower() in CONVERTIBLE_EXTENSIONS


_hashes: OrderedDict[tuple[int, int, int, int, int], str] = OrderedDict()
_hashes_lock = threading.Lock()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, remembered per process by its identity (inode, size, times)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        with _hashes_lock:
            known = _hashes.get(key)
        if known is not None:
            return known
        digest = hashlib.sha256()
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    with _hashes_lock:
        _hashes[key] = value
        while len(_hashes) > _KNOWN_HASHES:
            _hashes.popitem(last=False)
    return value


@dataclass(frozen=True)
class ArchiveAt:
    """One archive being read: the outermost upload, or a member of one, cached."""

    path: Path  # on the host: the upload itself, or the cached copy of a nested member
    name: str  # its own file name, which says its format
    virtual_path: str  # where the agent sees it
    depth: int = 1  # 1 for an archive in user-data, 2 for a member of it, ...


@dataclass(frozen=True)
class MemberConverter:
    """The converter and limits documents are converted with (`ConversionJobs`')."""

    convert: Callable[..., object]
    settings: ConversionSettings


class _Conversions:
    """The member conversions of this process: one per destination, and at most
    `conversion.workers` converter processes at once (more wait their turn), as many as
    the upload conversion jobs may run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Path, threading.Thread] = {}
        self._slots: threading.Semaphore | None = None

    def pending(self) -> int:
        """Conversions started and not finished (running or waiting for a slot)."""
        with self._lock:
            return sum(thread.is_alive() for thread in self._running.values())

    def start(self, key: Path, work: Callable[[], None], workers: int) -> threading.Thread:
        with self._lock:
            running = self._running.get(key)
            if running is not None and running.is_alive():
                return running
            if self._slots is None:
                self._slots = threading.BoundedSemaphore(max(workers, 1))
            slots = self._slots

            def run() -> None:
                try:
                    with slots:
                        work()
                finally:
                    with self._lock:
                        self._running.pop(key, None)

            thread = threading.Thread(target=run, name="archive-member-conversion", daemon=True)
            self._running[key] = thread
            thread.start()
            return thread


_conversions = _Conversions()


class ArchiveMembers:
    """One thread's archives opened as folders of members, for the agent's tools."""

    def __init__(
        self,
        thread: ThreadFolders,
        limits: ArchiveLimits,
        converter: MemberConverter | None = None,
    ) -> None:
        self._thread = thread
        self._paths = thread.paths
        self.limits = limits
        self.converter = converter

    @property
    def cache_dir(self) -> Path:
        """Where member bytes and texts are kept (not created until something is)."""
        return self._thread.thread_dir() / CACHE_FOLDER

    def listing(self, archive: ArchiveAt) -> ArchiveListing:
        """The archive's members (refusals included); raises `ArchiveRefused`."""
        return list_archive(archive.path, self.limits, archive.name)

    def locate(self, archive: ArchiveAt, member_path: str) -> tuple[ArchiveAt, str]:
        """The innermost archive `member_path` reaches into, and the rest of the path.

        `bundle.zip` + `inner.tar/notes.txt` gives (the cached inner.tar, `notes.txt`) when
        `inner.tar` is a member of bundle.zip; a path that names a member, a folder or a
        refused member of this archive stops here.

        Raises:
            ArchiveRefused: An archive on the way is refused, or the path goes deeper
                than `max_depth` archives.
        """
        current, rest = archive, member_path.strip("/")
        while rest:
            listing = self.listing(current)
            if listing.member(rest) or listing.is_folder(rest) or listing.refusal(rest):
                break
            parts = rest.split("/")
            inner = None
            for cut in range(1, len(parts)):
                head = "/".join(parts[:cut])
                found = listing.member(head)
                if found is not None and is_archive_name(parts[cut - 1]):
                    inner = (found, "/".join(parts[cut:]))
                    break
                refused = listing.refusal(head)
                if refused is not None:  # a path through a refused member: say why
                    raise ArchiveMemberRefused(refused.name, refused.reason)
            if inner is None:
                break
            member, rest = inner
            current = self.nested(current, member)
        return current, rest

    def nested(self, archive: ArchiveAt, member: ArchiveMember) -> ArchiveAt:
        """A member that is an archive, opened as one (its bytes cached).

        Raises:
            ArchiveRefused: It would be more than `max_depth` archives deep.
        """
        if archive.depth + 1 > self.limits.max_depth:
            raise ArchiveRefused(
                f"{archive.name}/{member.name}",
                f"nesting deeper than {self.limits.max_depth} archives",
            )
        return ArchiveAt(
            self.member_file(archive, member),
            PurePosixPath(member.name).name,
            f"{archive.virtual_path}/{member.name}",
            archive.depth + 1,
        )

    def member(self, archive: ArchiveAt, name: str) -> ArchiveMember:
        """The file member `name` of the archive.

        Raises:
            ArchiveMemberRefused: The member is refused (its reason says why).
            ArchiveMemberNotFound: No such member.
        """
        listing = self.listing(archive)
        found = listing.member(name)
        if found is not None:
            return found
        refusal = listing.refusal(name)
        if refusal is not None:
            raise ArchiveMemberRefused(refusal.name, refusal.reason)
        raise ArchiveMemberNotFound(archive.name, name)

    def _entry(self, archive: ArchiveAt, member: str, archive_sha: str | None = None) -> Path:
        digest = hashlib.sha256(member.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return self.cache_dir / (archive_sha or file_sha256(archive.path)) / digest

    def _claim_archive_folder(self, archive: ArchiveAt) -> None:
        """Create the cache folder of an archive's bytes, first dropping the folders of
        archives that are gone or were replaced (each folder names its archive's path in
        `source`), so a thread's cache holds what its archives hold now, not every
        version ever read."""
        folder = self.cache_dir / file_sha256(archive.path)
        if folder.is_dir():
            return
        self._paths.make_dirs(folder)
        _write_atomically(folder / _SOURCE_NAME, str(archive.path))
        for other in self.cache_dir.iterdir():
            if other == folder or not _ARCHIVE_FOLDER.fullmatch(other.name):
                continue
            try:
                source = Path((other / _SOURCE_NAME).read_text(encoding="utf-8"))
                current = source.is_file() and file_sha256(source) == other.name
            except (OSError, ValueError):
                current = False
            if not current:
                shutil.rmtree(other, ignore_errors=True)

    def member_file(self, archive: ArchiveAt, member: ArchiveMember) -> Path:
        """The member's bytes in the cache, read out of the archive if not there yet."""
        found = self.member_files(archive, [member])[member.name]
        if isinstance(found, DeerFlowError):
            raise found
        return found

    def member_files(
        self, archive: ArchiveAt, members: Iterable[ArchiveMember]
    ) -> dict[str, Path | ArchiveMemberRefused]:
        """The bytes of several members, read in one pass over the archive (a .tar.gz is
        only read front to back); a member refused while read maps to its refusal."""
        found: dict[str, Path | ArchiveMemberRefused] = {}
        missing: list[ArchiveMember] = []
        archive_sha = file_sha256(archive.path)  # once: an archive of 10,000 members
        for member in members:
            entry = self._entry(archive, member.name, archive_sha)
            path = entry / "member" / PurePosixPath(member.name).name
            if path.is_file():
                found[member.name] = path
            else:
                missing.append(member)
        if not missing:
            return found
        self._claim_archive_folder(archive)
        for stream in iter_member_streams(archive.path, missing, self.limits, archive.name):
            folder = self._entry(archive, stream.member.name, archive_sha) / "member"
            self._paths.make_dirs(folder)
            target = folder / PurePosixPath(stream.member.name).name
            staging = folder / f"{STAGING_PREFIX}{secrets.token_hex(8)}{STAGING_SUFFIX}"
            try:
                fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    while chunk := stream.read():
                        out.write(chunk)
                    os.fchmod(out.fileno(), storage_modes().file)
                os.replace(staging, target)
                found[stream.member.name] = target
            except ArchiveMemberRefused as refusal:
                found[stream.member.name] = refusal
            finally:
                staging.unlink(missing_ok=True)
        for member in missing:  # changed since it was listed: gone from the archive
            found.setdefault(
                member.name,
                ArchiveMemberRefused(member.name, f"member {shown(member.name)} cannot be read"),
            )
        return found

    def start_text(self, archive: ArchiveAt, member: ArchiveMember) -> threading.Thread | None:
        """Start converting a document member unless its text (or failure) is known."""
        return self._text(archive, member, start_only=True)[1]

    def text(self, archive: ArchiveAt, member: ArchiveMember, wait: float) -> Path:
        """The Markdown of a document member, converting it (waiting up to `wait` s).

        Raises:
            TextStillConverting: The conversion is still running.
            ConversionError: It failed; the same bytes are not converted again.
            ArchiveMemberRefused, ArchiveRefused: The member cannot be read out.
        """
        path, thread = self._text(archive, member, start_only=False)
        if path is not None:
            return path
        assert thread is not None
        thread.join(max(wait, 0.0))
        return self._known_text(self._entry(archive, member.name), member.name, waiting=True)

    def _text(
        self, archive: ArchiveAt, member: ArchiveMember, *, start_only: bool
    ) -> tuple[Path | None, threading.Thread | None]:
        if self.converter is None:
            raise ConversionError(
                f"{member.name} is a document; its text is read through conversion, which "
                "is not set up here."
            )
        entry = self._entry(archive, member.name)
        known = self._known(entry)
        if known is not None:
            return (None, None) if start_only else (self._known_text(entry, member.name), None)
        if _conversions.pending() >= MAX_PENDING_CONVERSIONS:
            raise TextStillConverting(
                f"{member.name} waits for a converter: {MAX_PENDING_CONVERSIONS} archive "
                "members are being converted"
            )
        source = self.member_file(archive, member)
        return None, self._start(source, entry)

    def file_text(self, source: Path, wait: float) -> Path:
        """The Markdown of a document that is a plain file outside uploads/ (an extracted
        member, say), converted into the cache by its SHA-256."""
        if self.converter is None:
            raise ConversionError(
                f"{source.name} is a document; its text is read through conversion, which "
                "is not set up here."
            )
        entry = self.cache_dir / "files" / file_sha256(source)
        if self._known(entry) is None:
            if _conversions.pending() >= MAX_PENDING_CONVERSIONS:
                raise TextStillConverting(f"{source.name} waits for a converter")
            self._start(source, entry).join(max(wait, 0.0))
        return self._known_text(entry, source.name, waiting=True)

    def _start(self, source: Path, entry: Path) -> threading.Thread:
        converter = self.converter
        assert converter is not None
        self._paths.make_dirs(entry)

        def convert() -> None:
            settings = converter.settings
            try:
                converter.convert(
                    source,
                    entry / _TEXT_NAME,
                    timeout_seconds=settings.timeout_seconds,
                    memory_limit_mb=settings.memory_limit_mb,
                    max_output_bytes=settings.max_output_bytes,
                    cpu_limit_seconds=settings.cpu_limit_seconds,
                )
            except ConversionError as error:
                _write_atomically(entry / _FAILED_NAME, str(error))
            except Exception:  # never lose a thread's failure silently
                logger.exception("conversion of archive member %s failed", source.name)
                _write_atomically(entry / _FAILED_NAME, f"Conversion of {source.name} failed")

        return _conversions.start(entry, convert, converter.settings.workers)

    @staticmethod
    def _known(entry: Path) -> Path | None:
        for name in (_TEXT_NAME, _FAILED_NAME):
            if (entry / name).is_file():
                return entry / name
        return None

    def _known_text(self, entry: Path, name: str, *, waiting: bool = False) -> Path:
        known = self._known(entry)
        if known is None:
            raise TextStillConverting(f"{name} is still converting")
        if known.name == _FAILED_NAME:
            raise ConversionError(known.read_text(encoding="utf-8", errors="replace"))
        return known


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f"{STAGING_PREFIX}{secrets.token_hex(8)}{STAGING_SUFFIX}")
    try:
        staging.write_text(text, encoding="utf-8")
        os.chmod(staging, storage_modes().file)
        os.replace(staging, path)
    except OSError:
        logger.warning("cannot record the conversion failure at %s", path, exc_info=True)
        staging.unlink(missing_ok=True)
