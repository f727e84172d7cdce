"""Client filenames made safe to store, and unique within one request (SPEC 2.1.1-2.1.2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

from deerflow_web.errors import UnsafeFilename

MAX_NAME_BYTES = 255


def normalize_filename(raw: str) -> str:
    """Return the basename of a client-supplied filename, kept exactly as the user wrote it.

    Unicode, spaces and case are kept (unlike `secure_filename`, which would turn
    `报告.pdf` into `pdf`); only what cannot be stored safely is refused.

    Raises:
        UnsafeFilename: If nothing safe is left.
    """
    if not raw:
        raise UnsafeFilename("Filename is empty")
    name = raw.rstrip("/").rsplit("/", 1)[-1] if raw.strip("/") else ""
    if name in {"", ".", ".."}:
        raise UnsafeFilename("Filename is unsafe")
    if "\\" in name or "\x00" in name:
        raise UnsafeFilename("Filename is unsafe")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise UnsafeFilename("Filename too long")
    return name


def numbered_name(name: str, n: int) -> str:
    """`data.txt` → `data_1.txt`; `.env` → `.env_1`; `archive.tar.gz` → `archive.tar_1.gz`."""
    path = PurePosixPath(name)
    return f"{path.stem}_{n}{path.suffix}"


def companion_name(name: str) -> str:
    """The Markdown companion's provisional name: the last suffix replaced by `.md`.

    The one naming rule (DeerFlow's): conversion starts from it, and a `.md` found on disk
    without a record is taken as a file's companion only when it matches it.
    """
    return str(PurePosixPath(name).with_suffix(".md"))


def is_companion_name(name: str, original: str) -> bool:
    """Whether `name` is what `companion_name` gives for `original` (another file)."""
    return name != original and companion_name(original) == name


def first_free_name(name: str, taken: Callable[[str], bool]) -> str:
    """`name` itself if free, else the first `{stem}_{n}{suffix}` that is not taken."""
    if not taken(name):
        return name
    n = 1
    while taken(candidate := numbered_name(name, n)):
        n += 1
    return candidate


class ClaimedNames:
    """The names claimed by one request; a clash gets the next `_N` name."""

    def __init__(self) -> None:
        self._claimed: set[str] = set()

    def claim(self, name: str, also_taken: Callable[[str], bool] = lambda _: False) -> str:
        """Claim `name` or its first free `_N` variant and return it."""
        claimed = first_free_name(name, lambda n: n in self._claimed or also_taken(n))
        self._claimed.add(claimed)
        return claimed

    def release(self, name: str) -> None:
        """Give a name back, e.g. when the conversion that claimed it produced nothing."""
        self._claimed.discard(name)
