"""Client filenames made safe to store, and unique within one request (SPEC 2.1.1-2.1.2)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from pathlib import PurePosixPath

from deerflow_web.errors import UnsafeFilename
from deerflow_web.storage.paths import is_staging_name

MAX_NAME_BYTES = 255


def _code(char: str) -> str:
    return f"U+{ord(char):04X}"


# Each class of character a name may not hold, with why: a name is placed into prompt
# blocks, tool results, JSON, logs and pages, and none of these characters may change the
# structure of that text or disguise what the name says.
_REFUSED_CHARACTERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile("[\x00-\x1f]"),
        "contains the control character {code}, which could start a new line or hide text "
        "wherever the name is shown",
    ),
    (re.compile("\x7f"), "contains the control character {code} (delete)"),
    (
        re.compile("[\x80-\x9f]"),
        "contains the C1 control character {code}, which some programs read as a line break",
    ),
    (
        re.compile("[\u2028\u2029]"),
        "contains the Unicode line or paragraph separator {code}, which starts a new line",
    ),
    (
        re.compile("[\u202a-\u202e\u2066-\u2069]"),
        "contains the bidirectional control {code}, which can make the name display "
        "differently from what it is (such as a disguised extension)",
    ),
    (
        re.compile("[\U000e0000-\U000e007f]"),
        "contains the tag character {code}, an invisible copy of a letter that a model "
        "reads while a person sees nothing",
    ),
)


def refusal_reason(name: str) -> str | None:
    """Why `name` (a basename) can never be stored, or None when it can.

    This is the one list of what a stored name must not be, shared by uploads, renames
    and resumable-upload creation, so the rule cannot drift between them.
    """
    if name in {"", ".", ".."}:
        return "Filename is empty or names a folder"
    for pattern, reason in _REFUSED_CHARACTERS:
        if (match := pattern.search(name)) is not None:
            return "Filename " + reason.format(code=_code(match.group(0)))
    if not name.strip(". "):
        return "Filename is made only of dots and spaces, which names no file on many systems"
    if "\\" in name:
        return "Filename contains a backslash, which is a folder separator on Windows"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"Filename too long: more than {MAX_NAME_BYTES} bytes in UTF-8"
    if is_staging_name(name):
        return f"Filename {name} is reserved for uploads in progress"
    return None


def _last_component(raw: str) -> str:
    """The last `/`-separated component of a client's name, as the client wrote it."""
    return raw.rstrip("/").rsplit("/", 1)[-1] if raw.strip("/") else ""


def normalize_filename(raw: str) -> str:
    """Return the basename of a client-supplied filename, in Unicode's composed form (NFC).

    Unicode, spaces and case are kept (unlike `secure_filename`, which would turn
    `报告.pdf` into `pdf`); only what cannot be stored safely is refused, for the reason
    `refusal_reason` gives. Every way a name reaches the uploads folder (upload request,
    rename, creation of a resumable upload) goes through here.

    A name is stored composed: `é` as one code point, never `e` and a combining accent
    (NFD, what macOS file systems and some browsers send). The two forms look the same
    everywhere, so keeping both would put two files of one visible name side by side; in
    NFC a second upload of the name replaces the first, or follows `on_conflict`.
    `reported_original` tells the client when its form was changed.

    Raises:
        UnsafeFilename: If nothing safe is left.
    """
    if not raw:
        raise UnsafeFilename("Filename is empty")
    name = unicodedata.normalize("NFC", _last_component(raw))
    if (reason := refusal_reason(name)) is not None:
        raise UnsafeFilename(reason)
    return name


def reported_original(raw: str, stored: str) -> str | None:
    """An upload's `original_filename`: the client's own basename when stored as another.

    That is when the name was numbered (`data_1.txt`) or composed to NFC; a name only cut
    to its last path component is not reported.
    """
    client = _last_component(raw)
    return client if client != stored else None


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
