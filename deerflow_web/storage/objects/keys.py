"""Object keys: the one spelling of where bytes live, whatever the backend.

Two kinds of key:

- **A file's path** relative to the data dir, `/`-separated:
  `users/{uid}/threads/{tid}/user-data/uploads/{name}` (or `threads/{tid}/...` in the
  single-user layout), exactly as `ThreadPaths` lays the thread out on disk (`area_key`).
- **A thread's blob**: `{scope}/blobs/{sha256}` (`blob_key`), the bytes an upload record
  names when the app serves from a bucket (`working_copy`). Keyed by content within the
  thread: a replace points a record at other bytes (atomic for every reader), a rename
  moves nothing, and deleting a thread is deleting its prefix.
- **An upload on its way**: `{scope}/incoming/{name}` (`incoming_key`), where bytes stream
  while their SHA-256 is not known yet (a large upload, a resumable one); once it is, they
  become the thread's blob (`WorkingCopies.adopt`). Nothing reads an incoming key.

The S3 backend puts `storage.s3.prefix` in front, so a bucket listing reads like the data
dir's tree.

Every key is checked before any backend sees it: a `..`, `.` or empty segment, a leading
`/` or a NUL byte could make the local backend leave the data dir (or the S3 backend
leave its prefix), so such a key is refused, never normalised into something else.
"""

from __future__ import annotations

from deerflow_web.errors import InvalidObjectKey
from deerflow_web.models import Area

# S3 refuses keys longer than 1,024 bytes (UTF-8); the prefix counts too.
MAX_KEY_BYTES = 1024


def check_key(key: str) -> str:
    """`key` unchanged when it names an object inside the store; refused otherwise.

    Unicode and spaces are fine (`uploads/报告 final.pdf`); what is refused is anything
    that could name a place outside the store or two places at once.

    Raises:
        InvalidObjectKey: Empty, absolute, too long, with a NUL byte, or with an empty,
            `.` or `..` segment.
    """
    if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
        raise InvalidObjectKey(str(key))
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidObjectKey(key)
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidObjectKey(key)
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty (everything), or a checked key with an optional trailing
    `/` (a folder).

    Raises:
        InvalidObjectKey: As `check_key`.
    """
    if prefix == "":
        return prefix
    check_key(prefix.removesuffix("/"))
    return prefix


def area_key(scope: str, area: Area | str, name: str) -> str:
    """The key of file `name` in one area of a thread; `scope` is the thread's records key
    (`ThreadPaths.scope`), which is its folder relative to the data dir."""
    return check_key(f"{scope}/user-data/{Area(area).value}/{name}")


BLOBS_FOLDER = "blobs"


def blobs_prefix(scope: str) -> str:
    """The listing prefix of a thread's blobs."""
    return check_prefix(f"{scope}/{BLOBS_FOLDER}/")


def blob_key(scope: str, sha256: str) -> str:
    """The key of the bytes whose SHA-256 is `sha256`, in the thread `scope`.

    Raises:
        InvalidObjectKey: `sha256` is not 64 lowercase hex digits.
    """
    if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
        raise InvalidObjectKey(sha256)
    return check_key(f"{scope}/{BLOBS_FOLDER}/{sha256}")


INCOMING_FOLDER = "incoming"


def incoming_key(scope: str, name: str) -> str:
    """The key bytes stream to before their SHA-256 is known; `name` is unique to the
    upload (a random token, a resumable upload's id).

    Raises:
        InvalidObjectKey: `name` is empty or not one path segment.
    """
    if not name or "/" in name:
        raise InvalidObjectKey(name)
    return check_key(f"{scope}/{INCOMING_FOLDER}/{name}")


def incoming_prefix(scope: str = "") -> str:
    """The listing prefix of a thread's incoming uploads."""
    return check_prefix(f"{scope}/{INCOMING_FOLDER}/")
