"""One streaming SHA-256 for every way a file comes in (storage/digest.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from deerflow_web.storage.digest import HASH_CHUNK
from deerflow_web.storage.digest import ContentDigest
from deerflow_web.storage.digest import file_chunks
from deerflow_web.storage.digest import hash_and_sniff
from deerflow_web.storage.digest import hash_and_sniff_open
from deerflow_web.storage.digest import sha256_of_file
from deerflow_web.storage.local import StagingFile
from deerflow_web.storage.sniff import SNIFF_BYTES

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


PDF = b"%PDF-1.7\n" + os.urandom(HASH_CHUNK + 12345)


@pytest.mark.parametrize("piece", (1, 7, SNIFF_BYTES - 1, SNIFF_BYTES, HASH_CHUNK))
def test_content_digest_is_the_same_however_the_bytes_are_cut(piece: int) -> None:
    digest = ContentDigest()
    view = memoryview(PDF)
    for start in range(0, len(PDF), piece):
        digest.update(view[start : start + piece])
    assert digest.result("x.bin") == (hashlib.sha256(PDF).hexdigest(), "application/pdf")
    assert bytes(digest.head) == PDF[:SNIFF_BYTES]


def test_an_empty_digest() -> None:
    assert ContentDigest().result("a.txt") == (hashlib.sha256(b"").hexdigest(), "text/plain")


def test_a_file_on_disk_gives_the_pair_its_upload_gave(tmp_path: Path) -> None:
    staging = StagingFile(tmp_path)
    try:
        for start in range(0, len(PDF), 100_000):
            staging.write(PDF[start : start + 100_000])
        streamed = staging.finish("doc.pdf")
    finally:
        staging.close()
    path = tmp_path / "doc.pdf"
    path.write_bytes(PDF)
    assert hash_and_sniff(path) == streamed == (hashlib.sha256(PDF).hexdigest(), "application/pdf")
    assert sha256_of_file(path) == streamed[0]


def test_an_open_file_is_read_from_its_start_and_its_offset_kept(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"hello world")
    with open(path, "rb", buffering=0) as handle:
        handle.seek(6)
        assert (
            hash_and_sniff_open(handle.fileno(), "a.txt")[0]
            == hashlib.sha256(b"hello world").hexdigest()
        )
        assert handle.tell() == 6
        assert b"".join(file_chunks(handle.fileno())) == b"hello world"


def test_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    assert sha256_of_file(path) == hashlib.sha256(b"").hexdigest()
    assert hash_and_sniff(path)[0] == hashlib.sha256(b"").hexdigest()


def test_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        sha256_of_file(tmp_path / "nothing")
