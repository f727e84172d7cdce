"""Editing a text artifact in place: `PUT` on its artifact URL (SPEC 2.6, DeerFlow's editor).

Only UTF-8 text files under `outputs/` (what agents write) may be edited, and only by a
client that names the SHA-256 of the version it opened: a file that changed in between is
refused with 412, so an agent's newer output is never overwritten unseen. The new bytes go
through the same staging file and atomic rename as uploads (storage/local.py): a reader
sees the old file or the new one, never a mix, and a link at the name is never written
through. The replaced file keeps its mode, and its bytes are kept as a version
(`services/history`) in the same step.

A 409 "a run is active" exists in DeerFlow, whose gateway runs the agent; this app runs no
agent runs, so it never answers it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from deerflow_web.errors import ArtifactChanged
from deerflow_web.errors import ArtifactEditTooLarge
from deerflow_web.errors import ArtifactEditUnsupported
from deerflow_web.errors import ArtifactError
from deerflow_web.errors import ArtifactNotEditable
from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import NotAFile
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.services.quotas.policy import QuotaPolicy
from deerflow_web.storage.history import remove_quietly
from deerflow_web.storage.local import AtomicCommit
from deerflow_web.storage.local import StagingFile
from deerflow_web.storage.local import is_disk_full
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.paths import is_staging_name

MAX_EDITABLE_BYTES = 2 * 1024 * 1024  # DeerFlow's limit, for the file and for its new text
EDITABLE_PREFIX = f"{VIRTUAL_PATH_PREFIX.lstrip('/')}/{Area.OUTPUTS.value}/"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Two saves of one file at once: the second waits this long for the first, then is told
# the file changed. A blocking lock could stall a gevent worker's every other request.
LOCK_WAIT_SECONDS = 2.0
LOCK_POLL_SECONDS = 0.01


class OutputVersions(Protocol):
    """Keeps the bytes an edit replaces as a version (`FileVersions.replace_output`)."""

    def replace_output(
        self,
        folders: ThreadFolders,
        name: str,
        named: Path,
        staged: Path,
        commit: AtomicCommit,
        *,
        sha256: str,
        size: int,
    ) -> list[Path]: ...


@dataclass(frozen=True)
class EditedArtifact:
    """The file as saved: its virtual path, the SHA-256 and size of the new bytes."""

    virtual_path: str
    sha256: str
    size: int

    def as_dict(self) -> dict[str, object]:
        """DeerFlow's answer to a successful edit."""
        return {"path": self.virtual_path, "sha256": self.sha256, "size": self.size}


def parse_edit(body: object) -> tuple[str, str]:
    """`content` and `expected_sha256` of a request body, or 400 naming what is wrong."""
    if not isinstance(body, dict):
        raise ArtifactNotEditable(
            'The body must be a JSON object {"content": ..., "expected_sha256": ...}'
        )
    content, expected = body.get("content"), body.get("expected_sha256")
    if not isinstance(content, str):
        raise ArtifactNotEditable("content must be a string: the new text of the file")
    if not isinstance(expected, str) or SHA256_HEX.fullmatch(expected) is None:
        raise ArtifactNotEditable(
            "expected_sha256 must be the 64 lower-case hex digits of the SHA-256 of the "
            "file as it was opened"
        )
    return content, expected


def _editable_path(thread: ThreadFolders, virtual_path: str) -> tuple[str, Path]:
    """The host path the virtual path names (not followed), checked to lie in outputs/."""
    shown = virtual_path.lstrip("/")
    if not shown.startswith(EDITABLE_PREFIX):
        raise ArtifactNotEditable("Only files in /mnt/user-data/outputs can be edited")
    if ".skill/" in shown or shown.endswith(".skill"):
        raise ArtifactEditUnsupported("Skill archives cannot be edited")
    thread.resolve_virtual_path(virtual_path)  # prefix and traversal rules
    relative = shown.removeprefix(EDITABLE_PREFIX)
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ArtifactNotEditable("Only files in /mnt/user-data/outputs can be edited")
    named = thread.area_dir(Area.OUTPUTS).joinpath(*parts)
    thread.paths.checked(named.parent)  # no folder on the way is a link (403 otherwise)
    if is_staging_name(named.name):
        raise ArtifactNotFound(shown)
    return shown, named


def _open_current(named: Path, shown: str) -> int:
    """A descriptor of the file itself, never of what a link at its name points to."""
    try:
        return os.open(named, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ArtifactNotFound(shown) from None
    except NotADirectoryError:
        raise ArtifactNotFound(shown) from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ArtifactEditUnsupported("Symlinked artifacts cannot be edited") from None
        raise


def _read_text(fd: int, info: os.stat_result, shown: str) -> bytes:
    """The file's bytes, refused unless they are UTF-8 text within the limit."""
    if not stat.S_ISREG(info.st_mode):
        raise NotAFile(shown)
    if info.st_size > MAX_EDITABLE_BYTES:
        raise ArtifactEditTooLarge()
    chunks = []
    remaining = MAX_EDITABLE_BYTES + 1  # a file that grew since fstat is still caught
    while remaining > 0 and (chunk := os.read(fd, remaining)):
        chunks.append(chunk)
        remaining -= len(chunk)
    current = b"".join(chunks)
    if len(current) > MAX_EDITABLE_BYTES:
        raise ArtifactEditTooLarge()
    if b"\0" in current:
        raise ArtifactEditUnsupported("Binary artifacts cannot be edited")
    try:
        current.decode("utf-8")
    except UnicodeDecodeError:
        raise ArtifactEditUnsupported("Only UTF-8 text artifacts can be edited") from None
    return current


def _encode(content: str) -> bytes:
    """The new text as UTF-8, refused when it is too large or not text."""
    try:
        new = content.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from a JSON escape such as \ud800
        raise ArtifactEditUnsupported("Only UTF-8 text can be saved as an artifact") from None
    if len(new) > MAX_EDITABLE_BYTES:
        raise ArtifactEditTooLarge()
    if b"\0" in new:
        raise ArtifactEditUnsupported("Binary content cannot be saved as an artifact")
    return new


def _lock(fd: int, sleep: Callable[[float], None]) -> None:
    """Hold the opened file's lock, or answer 412 when another save keeps it too long."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ArtifactChanged() from None
            sleep(LOCK_POLL_SECONDS)


def _still_the_same(named: Path, info: os.stat_result) -> bool:
    """Whether the name still holds the very file that was read (not a replacement)."""
    try:
        now = named.lstat()
    except FileNotFoundError:
        return False
    return (now.st_ino, now.st_dev, now.st_mtime_ns, now.st_size) == (
        info.st_ino,
        info.st_dev,
        info.st_mtime_ns,
        info.st_size,
    )


@dataclass(frozen=True)
class EditableText:
    """A file the editor may open: its text exactly, and the SHA-256 a save must name."""

    text: str
    sha256: str


def open_for_edit(thread: ThreadFolders, virtual_path: str) -> EditableText | None:
    """The text of a file a `PUT` would accept, or None when it would refuse the file.

    A text with a carriage return is left out too: a browser's textarea turns CRLF into
    LF, so saving it unchanged would still rewrite every line ending.
    """
    try:
        shown, named = _editable_path(thread, virtual_path)
        fd = _open_current(named, shown)
    except (ArtifactError, UnsafeFolder):
        return None
    try:
        current = _read_text(fd, os.fstat(fd), shown)
    except ArtifactError:
        return None
    finally:
        os.close(fd)
    text = current.decode("utf-8")
    if "\r" in text:
        return None
    return EditableText(text, hashlib.sha256(current).hexdigest())


def edit_artifact(
    thread: ThreadFolders,
    virtual_path: str,
    content: str,
    expected_sha256: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    versions: OutputVersions | None = None,
    quotas: QuotaPolicy | None = None,
) -> EditedArtifact:
    """Replace a text file under outputs/ with `content`, if it is still the opened version.

    With `quotas`, an edit that makes the file larger is refused when the growth would
    not fit in the owner's quota (outputs/ is the agent's and not counted as usage, so
    there is nothing to reserve: the check is the owner's usage now plus the growth).

    Raises:
        ArtifactPrefixError, PathTraversal, UnsafeFolder, ArtifactNotEditable (not under
        outputs/), ArtifactNotFound, NotAFile, ArtifactEditUnsupported (skill archive,
        symlink, binary or non-UTF-8), ArtifactEditTooLarge, ArtifactChanged,
        InsufficientStorage, QuotaExceeded (nothing written).
    """
    shown, named = _editable_path(thread, virtual_path)
    fd = _open_current(named, shown)
    try:
        info = os.fstat(fd)
        current = _read_text(fd, info, shown)
        new = _encode(content)
        # Serialised per file: of two saves of the same version, one wins and one is 412.
        _lock(fd, sleep)
        if hashlib.sha256(current).hexdigest() != expected_sha256 or not _still_the_same(
            named, info
        ):
            raise ArtifactChanged()
        keep = None
        if versions is not None:
            name = shown.removeprefix(EDITABLE_PREFIX)

            def keep(staged: Path, commit: AtomicCommit) -> list[Path]:
                return versions.replace_output(
                    thread, name, named, staged, commit, sha256=expected_sha256, size=len(current)
                )

        if quotas is not None:
            quotas.refuse_early(thread.ref.user_id, len(new) - info.st_size)
        sha256 = _replace(named, new, stat.S_IMODE(info.st_mode), keep)
    finally:
        os.close(fd)
    return EditedArtifact(f"/{shown}", sha256, len(new))


def _replace(
    named: Path,
    new: bytes,
    mode: int,
    keep: Callable[[Path, AtomicCommit], list[Path]] | None = None,
) -> str:
    """Write `new` beside the file and rename it over the file atomically; its SHA-256.

    `keep` makes that rename itself, keeping the old bytes as a version in the same step."""
    try:
        staging = StagingFile(named.parent)
    except OSError as error:
        if is_disk_full(error):
            raise InsufficientStorage(named.name) from error
        raise
    commit = AtomicCommit()
    let_go: list[Path] = []
    try:
        staging.write(new)
        sha256, _ = staging.finish(named.name)
        os.chmod(staging.path, mode)  # the edited file keeps its permissions
        if keep is None:
            commit.rename(staging.path, named)
        else:
            let_go = keep(staging.path, commit)
    except OSError as error:
        staging.discard()
        commit.undo()
        if is_disk_full(error):
            raise InsufficientStorage(named.name) from error
        raise
    except BaseException:
        staging.discard()
        commit.undo()
        raise
    commit.forget_backups()
    staging.close()
    remove_quietly(let_go)
    return sha256
