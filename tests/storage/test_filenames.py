"""Filename normalisation and per-request unique names (SPEC 2.1.1-2.1.2)."""

from __future__ import annotations

import pytest

from deerflow_web.errors import UnsafeFilename
from deerflow_web.storage.filenames import ClaimedNames
from deerflow_web.storage.filenames import companion_name
from deerflow_web.storage.filenames import normalize_filename

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("report.pdf", "report.pdf"),
        ("报告 final (1).pdf", "报告 final (1).pdf"),
        ("../../etc/passwd", "passwd"),
        ("path/to/file.txt", "file.txt"),
        ("dir/", "dir"),
        (".env", ".env"),
        ("CaSe.TXT", "CaSe.TXT"),
        ("a" * 251 + ".txt", "a" * 251 + ".txt"),
    ],
)
def test_normalize_keeps_the_basename(raw: str, expected: str) -> None:
    assert normalize_filename(raw) == expected


@pytest.mark.parametrize(
    "raw", ["", "..", ".", "/", "a/..", "C:\\x\\a.txt", "a\\b.txt", "nul\x00.txt", "é" * 128]
)
def test_normalize_rejects_unsafe_names(raw: str) -> None:
    with pytest.raises(UnsafeFilename):
        normalize_filename(raw)


def test_claims_number_clashes_in_request_order() -> None:
    claimed = ClaimedNames()
    assert [claimed.claim("data.txt") for _ in range(3)] == ["data.txt", "data_1.txt", "data_2.txt"]
    assert claimed.claim("archive.tar.gz") == "archive.tar.gz"
    assert claimed.claim("archive.tar.gz") == "archive.tar_1.gz"
    assert claimed.claim(".env") == ".env"
    assert claimed.claim(".env") == ".env_1"
    assert claimed.claim("noext") == "noext"
    assert claimed.claim("noext") == "noext_1"


def test_claim_skips_names_already_claimed_by_numbering() -> None:
    claimed = ClaimedNames()
    for name in ("data.txt", "data_1.txt", "data_2.txt"):
        claimed.claim(name)
    assert claimed.claim("data.txt") == "data_3.txt"


def test_released_names_can_be_claimed_again() -> None:
    claimed = ClaimedNames()
    claimed.claim("notes.md")
    claimed.release("notes.md")
    assert claimed.claim("notes.md") == "notes.md"


def test_companion_names() -> None:
    assert companion_name("report.pdf") == "report.md"
    assert companion_name("deck.PPTX") == "deck.md"
    assert companion_name("README") == "README.md"
