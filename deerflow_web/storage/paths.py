"""Where a thread's files live on disk, and how virtual /mnt/user-data paths map onto them.

Every component (API, pages, middlewares, tools) computes folders through `ThreadPaths`, so
the layout of SPEC D1 is decided in exactly one place, and so is the rule that no folder
between the data dir and a thread's files may be a symbolic link: every accessor checks
each component from the data dir down without following links, and folders are created
the same way, so a link planted at any level (by an agent's sandbox, say) is refused
instead of leading the app outside the data dir.
"""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from deerflow_web.errors import ArtifactPrefixError
from deerflow_web.errors import ConfigError
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import PathTraversal
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.models import is_archive_name

THREAD_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
USER_ID_RE = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE_USER_CHARS = re.compile(r"[^A-Za-z0-9_-]")

DEFAULT_USER_ID = "default"

logger = logging.getLogger(__name__)

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StorageModes(NamedTuple):
    """The permission bits of everything the app creates in the data dir.

    The data dir holds password hashes, emails, session keys and every user's files, so
    nothing in it is ever readable by other users of the machine, let alone writable. The
    modes are set explicitly (at creation and again with fchmod), never left to the umask:
    a service started with umask 000 creates the same modes as one with 077.
    """

    folder: int  # the data dir and every folder below it, the thread areas included
    file: int  # uploads, tus uploads, conversion companions, their staging files


# The service's own user only. The database and the secret key are `SECRET_FILE_MODE`
# whatever `storage_modes()` says: no sandbox has any business reading them.
PRIVATE_MODES = StorageModes(folder=0o700, file=0o600)
# With `storage.group`: readable by that group (a sandbox running as another user in it).
# The setgid bit makes everything created below the data dir belong to the group.
GROUP_MODES = StorageModes(folder=0o2750, file=0o640)
SECRET_FILE_MODE = 0o600
_modes = PRIVATE_MODES
_group: int | None = None


def storage_modes() -> StorageModes:
    """The modes this process creates folders and files with."""
    return _modes


def use_storage_group(group: str | int | None) -> None:
    """Create everything private (None), or readable by `group` (a name or a gid).

    A process-wide choice, as the umask is: made once at start-up from `storage.group`,
    by the web app and by the agent side, so every writer in the process agrees.

    Raises:
        ConfigError: No such group.
    """
    global _modes, _group
    if group is None or group == "":
        _modes, _group = PRIVATE_MODES, None
        return
    try:
        gid = int(group) if str(group).isdigit() else grp.getgrnam(str(group)).gr_gid
    except KeyError as error:
        raise ConfigError(f"storage.group: there is no group named {group!r}") from error
    _modes, _group = GROUP_MODES, gid


def make_dirs_with_mode(path: Path) -> None:
    """Create `path` and any missing parents with the folder mode (an existing folder is
    left as it is: it may be someone else's, like /srv)."""
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, storage_modes().folder)
        except FileExistsError:
            continue  # created by another process meanwhile; its creator set the mode
        os.chmod(folder, storage_modes().folder)  # mkdir's mode passes through the umask


def secure_data_dir(base_dir: Path) -> None:
    """Create the data dir with the folder mode, or tighten an existing one at start-up.

    Only the data dir itself is changed (its secret files are tightened by their owners,
    `tighten_secret_file`): it is the gate to everything below, since a folder others
    cannot enter hides what it holds whatever their modes, and walking every file of a
    large data dir at each start would cost minutes.
    """
    make_dirs_with_mode(base_dir)
    info = os.stat(base_dir)
    if _group is not None and info.st_gid != _group:
        try:
            os.chown(base_dir, -1, _group)
        except PermissionError as error:
            raise ConfigError(
                f"storage.group: cannot give {base_dir} to group {_group}; the service's "
                "user must own the data dir and be a member of the group"
            ) from error
    if stat.S_IMODE(info.st_mode) != storage_modes().folder or _group is not None:
        _chmod_own(base_dir, storage_modes().folder)  # after chown, which clears setgid


def tighten_secret_file(path: Path) -> None:
    """`SECRET_FILE_MODE` for a file holding secrets, if it exists (the database and its
    journals, the session key): an earlier release wrote them 0644."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != SECRET_FILE_MODE:
        _chmod_own(path, SECRET_FILE_MODE)


def _chmod_own(path: Path, mode: int) -> None:
    """chmod, or a warning when the path belongs to another user (a volume mounted by
    root, say): the app still starts, and the warning says what to fix."""
    try:
        os.chmod(path, mode)
    except PermissionError:
        logger.warning(
            "%s is %o and belongs to another user: it cannot be made %o; fix it by hand",
            path,
            stat.S_IMODE(os.stat(path).st_mode),
            mode,
        )


def validate_thread_id(thread_id: object) -> str:
    """Return the id unchanged, or raise InvalidThreadId (SPEC 1.4)."""
    if not isinstance(thread_id, str) or THREAD_ID_RE.fullmatch(thread_id) is None:
        raise InvalidThreadId(thread_id)
    return thread_id


def validate_user_id(user_id: object) -> str:
    """Return the id unchanged, or raise InvalidUserId (SPEC 1.5)."""
    if not isinstance(user_id, str) or USER_ID_RE.fullmatch(user_id) is None:
        raise InvalidUserId(user_id)
    return user_id


def safe_user_id(raw: str) -> str:
    """Map an external identity onto a directory-safe bucket name (SPEC 1.5).

    Unsafe characters become `-` and a hash suffix keeps `a.b` and `a/b` apart.
    """
    if not raw:
        raise InvalidUserId("user id must be non-empty")
    if USER_ID_RE.fullmatch(raw):
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return f"{_UNSAFE_USER_CHARS.sub('-', raw)}-{digest}"


def resolve_base_dir(
    explicit: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Return the data root: argument > DEER_FLOW_HOME > {project root or cwd}/.deer-flow."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return Path(explicit).resolve()
    if env.get("DEER_FLOW_HOME"):
        return Path(env["DEER_FLOW_HOME"]).resolve()
    root_value = env.get("DEER_FLOW_PROJECT_ROOT")
    if root_value:
        root = Path(root_value).resolve()
        if not root.exists():
            raise ConfigError(
                f"DEER_FLOW_PROJECT_ROOT is set to '{root_value}', but the resolved path "
                f"'{root}' does not exist"
            )
        if not root.is_dir():
            raise ConfigError(
                f"DEER_FLOW_PROJECT_ROOT is set to '{root_value}', but the resolved path "
                f"'{root}' is not a directory"
            )
        return root / ".deer-flow"
    return Path.cwd().resolve() / ".deer-flow"


# Half-written files (uploads, conversions) are `.upload-*.part` (SPEC 1.7): never listed,
# never served, removed at start-up.
STAGING_PREFIX = ".upload-"
STAGING_SUFFIX = ".part"


def is_staging_name(name: str) -> bool:
    """Whether `name` is a staging file (SPEC 1.7): `.upload-*.part`."""
    return name.startswith(STAGING_PREFIX) and name.endswith(STAGING_SUFFIX)


class ThreadPaths:
    """Computes thread folders under one base dir; never creates anything unless asked.

    Every folder returned has been checked: each of its components below the base dir
    that exists is a real folder, not a link (a missing tail is fine: it is not created).
    """

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        self.base_dir = Path(base_dir).resolve()

    def _thread_dir(self, thread_id: str, user_id: str | None) -> Path:
        validate_thread_id(thread_id)
        if user_id is None:
            return self.base_dir / "threads" / thread_id
        return self.base_dir / "users" / validate_user_id(user_id) / "threads" / thread_id

    def checked(self, path: Path) -> Path:
        """`path` itself, once each existing component below the base dir is a real folder.

        Each level is opened relative to the one above with O_NOFOLLOW, so a link is seen
        as what it is wherever it sits.

        Raises:
            UnsafeFolder: A component is a symlink or not a folder.
        """
        self._walk(path, create=False)
        return path

    def make_dirs(self, path: Path, mode: int | None = None) -> list[Path]:
        """Create `path` and its missing parents below the base dir, never through a link.

        Returns the folders created, innermost first, so a rollback can remove them in
        order. Every folder created gets `storage_modes().folder`; `mode` is applied to
        `path` itself even when it existed (through its descriptor, not its name).

        Raises:
            UnsafeFolder: A component is a symlink or not a folder; nothing is created
                through it.
        """
        make_dirs_with_mode(self.base_dir)
        return self._walk(path, create=True, mode=mode)

    def _walk(self, path: Path, *, create: bool, mode: int | None = None) -> list[Path]:
        """Open each level relative to the one above with O_NOFOLLOW, creating it first
        when asked; an open descriptor per level is also the cheapest way to look."""
        parts = path.relative_to(self.base_dir).parts
        created: list[Path] = []
        try:
            fd = os.open(self.base_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return created
        try:
            folder_mode = storage_modes().folder
            for depth, part in enumerate(parts, start=1):
                made = False
                if create:
                    try:
                        os.mkdir(part, folder_mode, dir_fd=fd)  # never follows a final link
                        created.append(self.base_dir.joinpath(*parts[:depth]))
                        made = True
                    except FileExistsError:
                        pass
                try:
                    child = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    return created  # the rest does not exist: nothing to follow
                except OSError as error:  # ELOOP for a link, ENOTDIR for a file
                    raise UnsafeFolder("/".join(parts[:depth])) from error
                os.close(fd)
                fd = child
                if made:
                    os.fchmod(fd, folder_mode)  # mkdir's mode passes through the umask
            if mode is not None:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        created.reverse()
        return created

    def thread_dir(self, thread_id: str, user_id: str | None = None) -> Path:
        """Flat layout without a user, per-user layout with one (SPEC D1)."""
        return self.checked(self._thread_dir(thread_id, user_id))

    def scope(self, thread_id: str, user_id: str | None = None) -> str:
        """The thread's key in the upload records: its folder relative to the base dir."""
        return self._thread_dir(thread_id, user_id).relative_to(self.base_dir).as_posix()

    def parse_scope(self, scope: str) -> tuple[str, str | None]:
        """(thread id, user id) of a records key made by `scope`.

        Raises:
            ValueError: Not a key `scope` makes.
        """
        parts = scope.split("/")
        if len(parts) == 2 and parts[0] == "threads":
            return validate_thread_id(parts[1]), None
        if len(parts) == 4 and parts[0] == "users" and parts[2] == "threads":
            return validate_thread_id(parts[3]), validate_user_id(parts[1])
        raise ValueError(f"not a thread scope: {scope!r}")

    def user_data_dir(self, thread_id: str, user_id: str | None = None) -> Path:
        """The folder agents see as /mnt/user-data."""
        return self.checked(self._thread_dir(thread_id, user_id) / "user-data")

    def area_dir(self, thread_id: str, area: Area, user_id: str | None = None) -> Path:
        """One of uploads/, workspace/, outputs/."""
        return self.checked(self.area_location(thread_id, area, user_id))

    def area_location(self, thread_id: str, area: Area, user_id: str | None = None) -> Path:
        """Where an area belongs, unchecked: only to tell a sandbox where to look, never for
        the app's own reads or writes (use `area_dir` for those)."""
        return self._thread_dir(thread_id, user_id) / "user-data" / Area(area).value

    def uploads_dir(self, thread_id: str, user_id: str | None = None) -> Path:
        """The thread's uploads folder (not created)."""
        return self.area_dir(thread_id, Area.UPLOADS, user_id)

    def ensure_thread_dirs(self, thread_id: str, user_id: str | None = None) -> None:
        """Create workspace/, uploads/ and outputs/ with the folder mode (an existing area
        left more open by an earlier release is tightened on the way)."""
        user_data = self._thread_dir(thread_id, user_id) / "user-data"
        for area in Area:
            self.make_dirs(user_data / area.value, mode=storage_modes().folder)

    def delete_thread_dir(self, thread_id: str, user_id: str | None = None) -> None:
        """Remove the thread's whole folder; a missing one is fine."""
        shutil.rmtree(self.thread_dir(thread_id, user_id), ignore_errors=True)

    def resolve_virtual_path(
        self, thread_id: str, virtual_path: str, user_id: str | None = None
    ) -> Path:
        """Map /mnt/user-data/... onto the host, refusing anything that leaves user-data.

        The result may not exist and may be a directory (SPEC 1.9).
        """
        stripped = virtual_path.lstrip("/")
        prefix = VIRTUAL_PATH_PREFIX.lstrip("/")
        if stripped != prefix and not stripped.startswith(prefix + "/"):
            raise ArtifactPrefixError()
        relative = stripped[len(prefix) :].lstrip("/")
        base = self.user_data_dir(thread_id, user_id)
        area = relative.split("/", 1)[0]
        if area in {a.value for a in Area}:
            self.checked(base / area)  # a linked area is refused even when it stays inside
        actual = (base / relative).resolve()
        if not actual.is_relative_to(base):
            raise PathTraversal()
        return actual

    def split_archive_path(self, resolved: Path, user_data: Path) -> tuple[Path, str] | None:
        """(archive, member path) when a resolved virtual path runs through an archive.

        `uploads/reports.zip/q3/summary.docx` does not exist on disk: its first component
        that is not a folder is `reports.zip`, a regular file named like an archive, so the
        rest names a member inside it (read by `services/archives`). Anything else on the
        way (a link, a plain file, a missing folder) means there is no such member.
        """
        try:
            parts = resolved.relative_to(user_data).parts
        except ValueError:
            return None
        current = user_data
        for index, part in enumerate(parts[:-1]):
            current = current / part
            try:
                info = os.lstat(current)
            except OSError:
                return None
            if stat.S_ISDIR(info.st_mode):
                continue
            if stat.S_ISREG(info.st_mode) and is_archive_name(part):
                return current, "/".join(parts[index + 1 :])
            return None
        return None

    def iter_uploads_dirs(self) -> Iterator[Path]:
        """Every existing uploads folder in both layouts, for start-up sweeps and indexes.

        A folder reached through a link at any level is left out.
        """
        for pattern in ("threads/*/user-data/uploads", "users/*/threads/*/user-data/uploads"):
            for folder in self.base_dir.glob(pattern):
                try:
                    self.checked(folder)
                except UnsafeFolder:
                    continue
                if folder.is_dir():
                    yield folder

    def iter_thread_ids(self, user_id: str | None = None) -> Iterator[str]:
        """Ids of the threads that have a folder in the given layout."""
        root = self.checked(
            self.base_dir / "threads"
            if user_id is None
            else (self.base_dir / "users" / validate_user_id(user_id) / "threads")
        )
        if not root.is_dir():
            return
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False) and THREAD_ID_RE.fullmatch(entry.name):
                yield entry.name
