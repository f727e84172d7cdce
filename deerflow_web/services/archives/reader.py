"""Open an archive and read its members without trusting anything it says about itself.

An archive is a list of names and sizes written by whoever made it, so every name is
checked before it becomes a path (`safe_member_name`: no absolute names, no `..`, no
backslash tricks, no overlong names), every member type that is not a plain file or folder
is refused (symlinks, hard links, devices, fifos), encrypted members are reported and never
guessed at, and every size is counted as it is really read: a member that inflates past its
declared size, past `max_ratio` times its compressed size, or the archive past
`max_uncompressed_size`, is stopped while it is read. A zip whose entries share their bytes
(the "overlapping" bombs that make a few kilobytes declare terabytes) is refused whole, as
is one with more than `max_members` entries.

Two kinds of refusal: `ArchiveRefused` (the whole archive; nothing of it is used) and
`MemberRefusal` / `ArchiveMemberRefused` (one member; the others stay usable). Each names
its rule in words a person can act on.

Listings are cached per process by the file's identity (inode, size, times), so the upload
block and every tool call can ask for a member count without reading a .tar.gz again.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import struct
import tarfile
import threading
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

from deerflow_web.errors import ArchiveMemberRefused
from deerflow_web.errors import ArchiveRefused
from deerflow_web.errors import NotAnArchive
from deerflow_web.models import archive_suffix
from deerflow_web.settings import ArchiveLimits
from deerflow_web.storage.paths import is_staging_name

CHUNK_SIZE = 1024 * 1024
MAX_SEGMENT_BYTES = 255  # NAME_MAX of every common file system
SHOWN_NAME_CHARS = 120  # a refusal quotes this much of a hostile name, not 100 KB of it
_ZIP_METHODS = frozenset(
    {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
)
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_DRIVE = re.compile(r"[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CACHED_LISTINGS = 256
_READ_ERRORS = (
    zipfile.BadZipFile,
    tarfile.TarError,
    zlib.error,
    gzip.BadGzipFile,
    EOFError,
    NotImplementedError,
    RuntimeError,
    ValueError,
    OSError,
)


def shown(raw: str) -> str:
    """A member name as a refusal quotes it: in quotes, cut when it is very long."""
    text = raw if len(raw) <= SHOWN_NAME_CHARS else raw[:SHOWN_NAME_CHARS] + "…"
    return repr(text)


@dataclass(frozen=True)
class ArchiveMember:
    """One usable member: a safe relative name and what the archive declares about it."""

    name: str  # `/`-separated, no `.` or `..` segments, no leading `/`
    size: int  # declared uncompressed size; checked again while reading
    compressed_size: int | None = None  # zip only: a .tar.gz compresses the whole stream
    is_dir: bool = False


@dataclass(frozen=True)
class MemberRefusal:
    """A member that is not read or written, and the rule that refused it."""

    name: str  # as the archive spells it
    reason: str
    path: str | None = None  # its safe name, when the name itself was fine

    def as_dict(self) -> dict[str, str]:
        """The JSON shape of a refusal in API answers and tool results."""
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class ArchiveListing:
    """What an archive holds: its usable members and the ones refused, in archive order."""

    members: tuple[ArchiveMember, ...]
    refused: tuple[MemberRefusal, ...]

    @cached_property
    def files(self) -> tuple[ArchiveMember, ...]:
        """The members that are files (folders are only structure)."""
        return tuple(member for member in self.members if not member.is_dir)

    @cached_property
    def _by_name(self) -> dict[str, ArchiveMember]:
        return {member.name: member for member in self.files}

    @cached_property
    def _folders(self) -> frozenset[str]:
        folders = {m.name for m in self.members if m.is_dir}
        for member in self.members:
            parts = member.name.split("/")[:-1]
            folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return frozenset(folders)

    def member(self, name: str) -> ArchiveMember | None:
        """The file member of that exact safe name."""
        return self._by_name.get(name)

    def is_folder(self, name: str) -> bool:
        """Whether `name` is a folder of the archive (declared, or implied by a member)."""
        return not name or name in self._folders

    def refusal(self, name: str) -> MemberRefusal | None:
        """The refusal of the member with that safe name, if it was refused."""
        return next((r for r in self.refused if r.path == name), None)


def safe_member_name(raw: str, limits: ArchiveLimits) -> str:
    """The member's name as a safe relative path ("" for the archive's own root folder).

    Raises:
        ArchiveMemberRefused: The name is absolute, leaves the archive, is too long, or
            holds control characters or a reserved (staging) name.
    """
    if _CONTROL.search(raw):
        raise ArchiveMemberRefused(raw, f"member {shown(raw)} has control characters in its name")
    name = raw.replace("\\", "/")  # a Windows separator is a separator, never part of a name
    if name.startswith("/") or _DRIVE.match(name):
        raise ArchiveMemberRefused(raw, f"member {shown(raw)} has an absolute name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ArchiveMemberRefused(raw, f"member {shown(raw)} leaves the archive")
    if len(raw) > limits.max_name_length or any(
        len(part.encode("utf-8", "surrogateescape")) > MAX_SEGMENT_BYTES for part in parts
    ):
        raise ArchiveMemberRefused(
            raw,
            f"member {shown(raw)} has a name longer than {limits.max_name_length} characters "
            f"(or a part longer than {MAX_SEGMENT_BYTES} bytes)",
        )
    if any(is_staging_name(part) for part in parts):
        raise ArchiveMemberRefused(raw, f"member {shown(raw)} has a reserved name")
    return "/".join(parts)


class _Collector:
    """Applies the listing rules to members as an archive names them."""

    def __init__(self, archive: str, limits: ArchiveLimits) -> None:
        self.archive = archive
        self.limits = limits
        self.members: list[ArchiveMember] = []
        self.refused: list[MemberRefusal] = []
        self.count = 0
        self.declared = 0
        self._files: set[str] = set()
        self._folders: set[str] = set()

    def count_one(self) -> None:
        self.count += 1
        if self.count > self.limits.max_members:
            raise ArchiveRefused(
                self.archive, f"too many members (limit {self.limits.max_members})"
            )

    def name_of(self, raw: str) -> str | None:
        """The safe name, or None once the member is refused for its name."""
        try:
            return safe_member_name(raw, self.limits)
        except ArchiveMemberRefused as refusal:
            self.refused.append(MemberRefusal(raw, refusal.reason))
            return None

    def refuse(self, raw: str, reason: str, path: str | None) -> None:
        self.refused.append(MemberRefusal(raw, reason, path))

    def add(self, raw: str, name: str, size: int, compressed: int | None, is_dir: bool) -> None:
        if not name:
            return  # `./` itself
        parents = name.split("/")[:-1]
        ancestors = {"/".join(parents[: i + 1]) for i in range(len(parents))}
        if is_dir:
            if name in self._files:
                self.refuse(raw, f"member {shown(raw)} is both a file and a folder", name)
            else:
                self._folders.add(name)
                self._folders.update(ancestors)
                self.members.append(ArchiveMember(name, 0, compressed, is_dir=True))
            return
        if name in self._files:
            self.refuse(raw, f"member {shown(raw)} appears more than once", name)
            return
        if name in self._folders or ancestors & self._files:
            self.refuse(raw, f"member {shown(raw)} is both a file and a folder", name)
            return
        self.declared += size
        if self.declared > self.limits.max_uncompressed_size:
            raise ArchiveRefused(
                self.archive, f"uncompressed size over {self.limits.max_uncompressed_size} bytes"
            )
        self._files.add(name)
        self._folders.update(ancestors)
        self.members.append(ArchiveMember(name, size, compressed))

    def listing(self) -> ArchiveListing:
        return ArchiveListing(tuple(self.members), tuple(self.refused))


def _open_regular(path: Path) -> BinaryIO:
    """Open a regular file without following a link at its name."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise ArchiveRefused(path.name, "it is not a regular file")
    return handle


def _ratio_exceeded(produced: int, compressed: int, limits: ArchiveLimits) -> bool:
    return produced > limits.ratio_floor and produced > limits.max_ratio * max(compressed, 1)


def _ratio_reason(limits: ArchiveLimits) -> str:
    return f"compression ratio over {limits.max_ratio}"


# --- zip -------------------------------------------------------------------------------


def _check_zip_layout(handle: BinaryIO, archive: zipfile.ZipFile, name: str) -> None:
    """Refuse a zip whose entries share bytes with each other or with its directory.

    Overlapping entries are how a 10 MB zip declares 281 TB (Fifield's bombs): every entry
    points at the same compressed kernel. A real zip lays its entries one after another.
    """
    spans = []
    for info in archive.infolist():
        handle.seek(info.header_offset)
        header = handle.read(_LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
            raise ArchiveRefused(name, f"member {shown(info.filename)} has no local header")
        name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
        data_start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        spans.append((info.header_offset, data_start + info.compress_size, info.filename))
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise ArchiveRefused(
                name,
                f"members {shown(first)} and {shown(second)} overlap (overlapping entries, "
                "a zip bomb)",
            )
    if spans and spans[-1][1] > archive.start_dir:
        raise ArchiveRefused(
            name, f"member {shown(spans[-1][2])} overlaps the zip directory (a zip bomb)"
        )


def _zip_refusal(info: zipfile.ZipInfo, limits: ArchiveLimits) -> str | None:
    """Why one zip entry cannot be used, judged from its directory entry alone."""
    raw = info.filename
    mode = info.external_attr >> 16
    if info.flag_bits & 0x1:
        return f"member {shown(raw)} is encrypted (encrypted member, not read)"
    if info.create_system == 3 and mode:  # Unix attributes: the type bits count
        if stat.S_ISLNK(mode):
            return f"member {shown(raw)} is a symlink (symlink member)"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            return f"member {shown(raw)} is a device file"
    if info.compress_type not in _ZIP_METHODS:
        return f"member {shown(raw)} uses a compression method that is not supported"
    if not info.is_dir() and _ratio_exceeded(info.file_size, info.compress_size, limits):
        return f"member {shown(raw)}: {_ratio_reason(limits)}"
    return None


def _list_zip(handle: BinaryIO, name: str, limits: ArchiveLimits) -> ArchiveListing:
    try:
        archive = zipfile.ZipFile(handle)
    except _READ_ERRORS as error:
        raise ArchiveRefused(name, f"it is not a readable zip archive ({error})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_members:
            raise ArchiveRefused(name, f"too many members (limit {limits.max_members})")
        _check_zip_layout(handle, archive, name)
        collector = _Collector(name, limits)
        for info in infos:
            collector.count_one()
            safe = collector.name_of(info.filename)
            if safe is None:
                continue
            reason = _zip_refusal(info, limits)
            if reason is not None:
                collector.refuse(info.filename, reason, safe)
                continue
            collector.add(info.filename, safe, info.file_size, info.compress_size, info.is_dir())
        return collector.listing()


# --- tar -------------------------------------------------------------------------------


class _CappedStream:
    """The decompressed stream of a tar: counted, and stopped past the archive's caps.

    A .tar.gz compresses headers and data together, so its ratio is judged on the whole
    stream: the bytes the stream has produced against the size of the file on disk.
    """

    def __init__(
        self, raw: BinaryIO, name: str, limits: ArchiveLimits, compressed_size: int | None
    ) -> None:
        self._raw = raw
        self._name = name
        self._limits = limits
        self._compressed = compressed_size
        # Headers and padding: up to three 512-byte blocks a member, plus the end blocks.
        self._cap = limits.max_uncompressed_size + 1536 * limits.max_members + 10240
        self.produced = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(CHUNK_SIZE if size is None or size < 0 else size)
        self.produced += len(data)
        if self.produced > self._cap:
            raise ArchiveRefused(
                self._name, f"uncompressed size over {self._limits.max_uncompressed_size} bytes"
            )
        if self._compressed is not None and _ratio_exceeded(
            self.produced, self._compressed, self._limits
        ):
            raise ArchiveRefused(self._name, _ratio_reason(self._limits))
        return data


@contextmanager
def _tar_stream(handle: BinaryIO, name: str, limits: ArchiveLimits) -> Iterator[tarfile.TarFile]:
    """A tar read front to back (stream mode: nothing is skipped without being counted)."""
    compressed = archive_suffix(name) in {".tar.gz", ".tgz"}
    size = os.fstat(handle.fileno()).st_size
    inner: BinaryIO = gzip.GzipFile(fileobj=handle, mode="rb") if compressed else handle
    stream = _CappedStream(inner, name, limits, size if compressed else None)
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]
    except _READ_ERRORS as error:
        raise ArchiveRefused(name, f"it is not a readable tar archive ({error})") from None
    with tar:
        yield tar


def _tar_refusal(info: tarfile.TarInfo) -> str | None:
    raw = info.name
    if info.issym():
        return f"member {shown(raw)} is a symlink (symlink member)"
    if info.islnk():
        return f"member {shown(raw)} is a hard link (hard-link member)"
    if info.ischr() or info.isblk() or info.isfifo():
        return f"member {shown(raw)} is a device file"
    if info.issparse():
        return f"member {shown(raw)} is a sparse file, which is not supported"
    if not info.isreg() and not info.isdir():
        return f"member {shown(raw)} is of a type that is not supported"
    return None


def _list_tar(handle: BinaryIO, name: str, limits: ArchiveLimits) -> ArchiveListing:
    collector = _Collector(name, limits)
    try:
        with _tar_stream(handle, name, limits) as tar:
            for info in tar:
                collector.count_one()
                safe = collector.name_of(info.name)
                if safe is None:
                    continue
                reason = _tar_refusal(info)
                if reason is not None:
                    collector.refuse(info.name, reason, safe)
                    continue
                collector.add(info.name, safe, info.size, None, info.isdir())
    except _READ_ERRORS as error:
        raise ArchiveRefused(name, f"it is not a readable tar archive ({error})") from None
    return collector.listing()


# --- listing and reading ----------------------------------------------------------------


_cache: OrderedDict[tuple[object, ...], ArchiveListing | ArchiveRefused] = OrderedDict()
_cache_lock = threading.Lock()


def list_archive(path: Path, limits: ArchiveLimits, name: str | None = None) -> ArchiveListing:
    """The members of the archive at `path`, each name and type checked.

    Args:
        path: The archive on the host; a link at its name is refused.
        limits: The caps; a listing under other caps is computed anew.
        name: How refusals name the archive; its file name by default. Its suffix decides
            the format.

    Raises:
        NotAnArchive: The name is not one of an archive format.
        ArchiveRefused: The whole archive is refused, with the rule that refused it.
    """
    shown_name = name or path.name
    if archive_suffix(shown_name) is None:
        raise NotAnArchive(shown_name)
    try:
        handle = _open_regular(path)
    except OSError as error:
        raise ArchiveRefused(shown_name, f"it cannot be opened ({error.strerror})") from None
    with handle:
        info = os.fstat(handle.fileno())
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        key += (archive_suffix(shown_name), limits)
        with _cache_lock:
            cached = _cache.get(key)
            if cached is not None:
                _cache.move_to_end(key)
        if cached is None:
            try:
                cached = _list_open(handle, shown_name, limits)
            except ArchiveRefused as refused:
                cached = refused
            with _cache_lock:
                _cache[key] = cached
                while len(_cache) > _CACHED_LISTINGS:
                    _cache.popitem(last=False)
    if isinstance(cached, ArchiveRefused):
        raise ArchiveRefused(shown_name, cached.reason)
    return cached


def _list_open(handle: BinaryIO, name: str, limits: ArchiveLimits) -> ArchiveListing:
    if archive_suffix(name) == ".zip":
        return _list_zip(handle, name, limits)
    return _list_tar(handle, name, limits)


class MemberStream:
    """One member's bytes as they are read, counted against its own and the archive's caps.

    Raises (from `read`):
        ArchiveMemberRefused: The member produces more than it declared, or more than
            `max_ratio` times its compressed size, or its data is corrupt.
        ArchiveRefused: The archive as a whole produced more than `max_uncompressed_size`.
    """

    def __init__(
        self, raw: BinaryIO, member: ArchiveMember, limits: ArchiveLimits, budget: ReadBudget
    ) -> None:
        self._raw = raw
        self.member = member
        self._limits = limits
        self._budget = budget
        self.produced = 0

    def read(self, size: int = CHUNK_SIZE) -> bytes:
        try:
            data = self._raw.read(size)
        except (ArchiveRefused, ArchiveMemberRefused):
            raise
        except _READ_ERRORS as error:
            raise ArchiveMemberRefused(
                self.member.name, f"member {shown(self.member.name)} is corrupt ({error})"
            ) from None
        self.produced += len(data)
        self._budget.spend(len(data))
        if self.produced > self.member.size:
            raise ArchiveMemberRefused(
                self.member.name,
                f"member {shown(self.member.name)} holds more than its declared size "
                f"({self.member.size} bytes)",
            )
        compressed = self.member.compressed_size
        if compressed is not None and _ratio_exceeded(self.produced, compressed, self._limits):
            raise ArchiveMemberRefused(
                self.member.name, f"member {shown(self.member.name)}: {_ratio_reason(self._limits)}"
            )
        return data


class ReadBudget:
    """The bytes one operation may unpack from one archive, counted as they are read."""

    def __init__(self, archive: str, limits: ArchiveLimits) -> None:
        self._archive = archive
        self._limit = limits.max_uncompressed_size
        self.spent = 0

    def spend(self, count: int) -> None:
        self.spent += count
        if self.spent > self._limit:
            raise ArchiveRefused(self._archive, f"uncompressed size over {self._limit} bytes")


def iter_member_streams(
    path: Path,
    wanted: Iterable[ArchiveMember],
    limits: ArchiveLimits,
    name: str | None = None,
) -> Iterator[MemberStream]:
    """Stream the wanted file members of a listed archive, in archive order.

    Each stream must be read (or dropped) before the next is asked for: a tar is read
    front to back once. Members must come from `list_archive` of the same file.

    Raises:
        ArchiveRefused: The archive changed into something refused, or its caps were hit.
    """
    shown_name = name or path.name
    members = {member.name: member for member in wanted if not member.is_dir}
    if not members:
        return
    budget = ReadBudget(shown_name, limits)
    try:
        handle = _open_regular(path)
    except OSError as error:
        raise ArchiveRefused(shown_name, f"it cannot be opened ({error.strerror})") from None
    with handle:
        if archive_suffix(shown_name) == ".zip":
            yield from _zip_streams(handle, shown_name, members, limits, budget)
        else:
            yield from _tar_streams(handle, shown_name, members, limits, budget)


def _zip_streams(
    handle: BinaryIO,
    name: str,
    members: dict[str, ArchiveMember],
    limits: ArchiveLimits,
    budget: ReadBudget,
) -> Iterator[MemberStream]:
    try:
        archive = zipfile.ZipFile(handle)
    except _READ_ERRORS as error:
        raise ArchiveRefused(name, f"it is not a readable zip archive ({error})") from None
    with archive:
        _check_zip_layout(handle, archive, name)  # the file may have changed since listed
        for info in archive.infolist():
            try:
                safe = safe_member_name(info.filename, limits)
            except ArchiveMemberRefused:
                continue
            member = members.get(safe)
            if member is None or info.is_dir() or _zip_refusal(info, limits) is not None:
                continue
            # Sizes come from this very entry: a listing of an older file must not lend
            # its declared sizes to new bytes.
            member = ArchiveMember(safe, info.file_size, info.compress_size)
            try:
                raw = archive.open(info)
            except _READ_ERRORS as error:
                raise ArchiveMemberRefused(
                    safe, f"member {shown(safe)} cannot be read ({error})"
                ) from None
            with raw:
                yield MemberStream(raw, member, limits, budget)


def _tar_streams(
    handle: BinaryIO,
    name: str,
    members: dict[str, ArchiveMember],
    limits: ArchiveLimits,
    budget: ReadBudget,
) -> Iterator[MemberStream]:
    try:
        with _tar_stream(handle, name, limits) as tar:
            for info in tar:
                try:
                    safe = safe_member_name(info.name, limits)
                except ArchiveMemberRefused:
                    continue
                if safe not in members or not info.isreg() or _tar_refusal(info) is not None:
                    continue
                raw = tar.extractfile(info)
                if raw is None:
                    continue
                with raw:
                    yield MemberStream(raw, ArchiveMember(safe, info.size), limits, budget)
                members.pop(safe)
                if not members:
                    return
    except (ArchiveRefused, ArchiveMemberRefused):
        raise
    except _READ_ERRORS as error:
        raise ArchiveRefused(name, f"it is not a readable tar archive ({error})") from None
