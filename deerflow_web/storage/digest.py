"""A file's SHA-256 and sniffed content type, taken as its bytes go by (SPEC D10).

The one home of streaming hashing: an upload hashes its bytes while it writes them
(`ContentDigest`, fed by the staging files of local.py and by resumable uploads), and a
file found on disk is read once in `HASH_CHUNK` pieces (`hash_and_sniff`). Both give the
same pair, so a record never depends on which way its file came in.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from deerflow_web.storage.sniff import SNIFF_BYTES
from deerflow_web.storage.sniff import sniff_content_type

HASH_CHUNK = 1024 * 1024  # large reads: fewer system calls and hash updates per megabyte


class ContentDigest:
    """The SHA-256 of bytes fed in order, and their first `SNIFF_BYTES` for the type.

    `hash` is the hashlib object itself, so a caller may run a large update on another
    thread (`keep_head` then takes the sniffing part of the same bytes).
    """

    __slots__ = ("hash", "head")

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.head = bytearray()

    def update(self, data: bytes | memoryview) -> None:
        self.hash.update(data)
        self.keep_head(data)

    def keep_head(self, data: bytes | memoryview) -> None:
        if len(self.head) < SNIFF_BYTES:
            self.head += data[: SNIFF_BYTES - len(self.head)]

    def hexdigest(self) -> str:
        return self.hash.hexdigest()

    def result(self, filename: str) -> tuple[str, str]:
        """(sha256 hex, content type) of what was fed, the type sniffed as for `filename`."""
        return self.hash.hexdigest(), sniff_content_type(bytes(self.head), filename)


def file_chunks(fd: int) -> Iterator[bytes]:
    """The bytes of the open file `fd` from its start, whatever its offset (left as it was)."""
    offset = 0
    while chunk := os.pread(fd, HASH_CHUNK, offset):
        yield chunk
        offset += len(chunk)


def hash_and_sniff_open(fd: int, name: str) -> tuple[str, str]:
    """SHA-256 and content type of the open file `fd`: the bytes of the very file that was
    checked."""
    digest = ContentDigest()
    for chunk in file_chunks(fd):
        digest.update(chunk)
    return digest.result(name)


def hash_and_sniff(path: Path) -> tuple[str, str]:
    """SHA-256 and content type of a file found on disk (reconciliation, imports, commits
    of finished resumable uploads)."""
    with open(path, "rb", buffering=0) as handle:
        return hash_and_sniff_open(handle.fileno(), path.name)


def sha256_of_file(path: Path) -> str:
    """The SHA-256 (hex) of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        for chunk in file_chunks(handle.fileno()):
            digest.update(chunk)
    return digest.hexdigest()
