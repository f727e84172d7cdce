"""Archives built in the tests: ordinary ones, and every hostile kind the reader must refuse.

Each maker returns the archive's bytes. The hostile ones are built small: a bomb's point is
its ratio, its nesting or its overlapping entries, not its size on the test machine.
"""

from __future__ import annotations

import io
import stat
import struct
import tarfile
import zipfile
from collections.abc import Iterable
from collections.abc import Mapping

ZEROS = 5 * 1024 * 1024  # deflates about 1000:1: far above any sane ratio cap


def make_zip(members: Mapping[str, bytes], *, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A plain zip holding `members` (names written exactly as given, `../` included)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data, method)
    return buffer.getvalue()


def make_zip_with_modes(members: Iterable[tuple[str, bytes, int]]) -> bytes:
    """A zip whose entries carry Unix mode bits (a symlink, a device, a fifo...)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.create_system = 3
            info.external_attr = mode << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def make_tar(
    members: Iterable[tarfile.TarInfo | tuple[str, bytes]], *, gzip: bool = False
) -> bytes:
    """A tar (or .tar.gz) of regular files given as (name, bytes), or ready `TarInfo`s."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:gz" if gzip else "w", format=tarfile.GNU_FORMAT
    ) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tar_entry(name: str, kind: bytes, *, link: str = "", size: int = 0) -> tarfile.TarInfo:
    """A tar header of any type: SYMTYPE, LNKTYPE, CHRTYPE, BLKTYPE, FIFOTYPE..."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = size
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    return info


def make_encrypted_zip(name: str = "secret.txt", data: bytes = b"hidden words") -> bytes:
    """A zip whose one member is marked encrypted (zipfile cannot write encryption, so the
    flag bit is set in both headers; the reader must report it, never try to read it)."""
    raw = bytearray(make_zip({name: data, "open.txt": b"plain words"}))
    local = raw.find(b"PK\x03\x04")
    central = raw.find(b"PK\x01\x02")
    for offset in (local + 6, central + 8):
        (flags,) = struct.unpack_from("<H", raw, offset)
        struct.pack_into("<H", raw, offset, flags | 0x1)
    return bytes(raw)


def make_overlapping_zip() -> bytes:
    """Two directory entries that share one member's bytes: the shape of Fifield's
    non-recursive bombs (`zbsm.zip`), where every entry points at the same kernel."""
    raw = bytearray(make_zip({"a.txt": b"A" * 1000, "b.txt": b"B" * 1000}))
    first = raw.find(b"PK\x01\x02")
    second = raw.find(b"PK\x01\x02", first + 4)
    struct.pack_into("<I", raw, second + 42, 0)  # b.txt's local header offset: a.txt's
    return bytes(raw)


def make_nested_bomb(levels: int = 5, copies: int = 4) -> bytes:
    """A small 42.zip: each level holds `copies` of the level below; the bottom holds
    megabytes of zeros that compress a thousandfold."""
    inner = make_zip({"zeros.txt": b"\x00" * ZEROS})
    for level in range(levels):
        inner = make_zip({f"level{level}-{copy}.zip": inner for copy in range(copies)})
    return inner


def make_nested(depth: int, leaf: bytes = b"deep text\n") -> bytes:
    """`l1.zip/l2.zip/.../leaf.txt`, `depth` archives deep counting the outer one."""
    data = make_zip({"leaf.txt": leaf})
    for level in range(depth - 1, 0, -1):
        data = make_zip({f"l{level + 1}.zip": data})
    return data


SYMLINK_MODE = stat.S_IFLNK | 0o777
CHAR_DEVICE_MODE = stat.S_IFCHR | 0o600
FIFO_MODE = stat.S_IFIFO | 0o600
FILE_MODE = stat.S_IFREG | 0o644
