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
from pathlib import PurePosixPath
from typing import TYPE_CHECKING
from typing import NamedTuple

from deerflow_web.errors import ArtifactPrefixError
from deerflow_web.errors import ConfigError
from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import PathTraversal
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import THREAD_ID_RE
from deerflow_web.models import USER_ID_RE
from deerflow_web.models import VIRTUAL_PATH_PREFIX
from deerflow_web.models import Area
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadRecord
from deerflow_web.models import is_archive_name
from deerflow_web.models import validate_thread_id
from deerflow_web.models import validate_user_id

_UNSAFE_USER_CHARS = re.compile(r"[^A-Za-z0-9_-]")

DEFAULT_USER_ID = "default"

if TYPE_CHECKING:
    from deerflow_web.storage.objects.working_copy import WorkingCopies

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


def _user_data_relative(virtual_path: str) -> str:
    """The part of a virtual path below /mnt/user-data (unchecked beyond that).

    Raises:
        ArtifactPrefixError: Not under /mnt/user-data.
    """
    stripped = virtual_path.lstrip("/")
    prefix = VIRTUAL_PATH_PREFIX.lstrip("/")
    if stripped != prefix and not stripped.startswith(prefix + "/"):
        raise ArtifactPrefixError()
    return stripped[len(prefix) :].lstrip("/")


def _is_one_name(relative: str) -> bool:
    """Whether a path inside an area is one plain name (a file of the area itself)."""
    return relative not in ("", ".", "..") and "/" not in relative


def is_staging_name(name: str) -> bool:
    """Whether `name` is a staging file (SPEC 1.7): `.upload-*.part`."""
    return name.startswith(STAGING_PREFIX) and name.endswith(STAGING_SUFFIX)


# A thread's history (issue 27): the earlier bytes of replaced files and deleted files
# waiting in the trash. Beside user-data, as the archive cache is: inside the thread's
# folder (on its file system, so keeping a version is a rename or a link, never a copy;
# removed with the thread) yet outside /mnt/user-data, so no listing, artifact route, zip,
# share link, agent tool or sandbox can reach it by any path.
HISTORY_FOLDER = "history"
VERSIONS_FOLDER = "versions"
TRASH_FOLDER = "trash"


class ThreadPaths:
    """Computes thread folders under one base dir; never creates anything unless asked.

    Every folder returned has been checked: each of its components below the base dir
    that exists is a real folder, not a link (a missing tail is fine: it is not created).
    A request or a tool call works through `folders(ref)`, which walks once.
    """

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        self.base_dir = Path(base_dir).resolve()
        # With `storage.backend: s3`, what keeps the folders true to the bucket before
        # they are read (`storage/objects/working_copy.py`); None on the local backend.
        self.copies: WorkingCopies | None = None

    def _thread_dir(self, ref: ThreadRef) -> Path:
        if ref.is_single_user:
            return self.base_dir / "threads" / ref.thread_id
        return self.base_dir / "users" / ref.user_id / "threads" / ref.thread_id

    def folders(self, ref: ThreadRef) -> ThreadFolders:
        """The thread's folders for one request or tool call (walked on first use, once)."""
        return ThreadFolders(self, ref)

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

    def thread_dir(self, ref: ThreadRef) -> Path:
        """Flat layout in the single-user mode, per-user layout otherwise (SPEC D1)."""
        return self.checked(self._thread_dir(ref))

    def scope(self, ref: ThreadRef) -> str:
        """The thread's key in the upload records: its folder relative to the base dir."""
        return self._thread_dir(ref).relative_to(self.base_dir).as_posix()

    def parse_scope(self, scope: str) -> ThreadRef:
        """The thread of a records key made by `scope`.

        Raises:
            ValueError: Not a key `scope` makes.
        """
        parts = scope.split("/")
        if len(parts) == 2 and parts[0] == "threads":
            return ThreadRef.single_user(validate_thread_id(parts[1]))
        if len(parts) == 4 and parts[0] == "users" and parts[2] == "threads":
            return ThreadRef(validate_thread_id(parts[3]), validate_user_id(parts[1]))
        raise ValueError(f"not a thread scope: {scope!r}")

    def user_data_dir(self, ref: ThreadRef) -> Path:
        """The folder agents see as /mnt/user-data."""
        return self.checked(self.user_data_location(ref))

    def user_data_location(self, ref: ThreadRef) -> Path:
        """Where user-data belongs, unchecked (see `area_location`)."""
        return self._thread_dir(ref) / "user-data"

    def area_dir(self, ref: ThreadRef, area: Area) -> Path:
        """One of uploads/, workspace/, outputs/."""
        return self.checked(self.area_location(ref, area))

    def area_location(self, ref: ThreadRef, area: Area) -> Path:
        """Where an area belongs, unchecked: only to tell a sandbox where to look, never for
        the app's own reads or writes (use `area_dir` for those)."""
        return self._thread_dir(ref) / "user-data" / Area(area).value

    def uploads_dir(self, ref: ThreadRef) -> Path:
        """The thread's uploads folder (not created)."""
        return self.area_dir(ref, Area.UPLOADS)

    def ensure_thread_dirs(self, ref: ThreadRef) -> None:
        """Create workspace/, uploads/ and outputs/ with the folder mode (an existing area
        left more open by an earlier release is tightened on the way)."""
        user_data = self._thread_dir(ref) / "user-data"
        for area in Area:
            self.make_dirs(user_data / area.value, mode=storage_modes().folder)

    def delete_thread_dir(self, ref: ThreadRef) -> None:
        """Remove the thread's whole folder; a missing one is fine."""
        shutil.rmtree(self.thread_dir(ref), ignore_errors=True)

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

    def iter_thread_ids(self, user_id: str) -> Iterator[str]:
        """Ids of the threads that have a folder in the owner's layout (`SINGLE_USER`:
        the flat one)."""
        root = self.checked(
            self.base_dir / "threads"
            if user_id == SINGLE_USER
            else (self.base_dir / "users" / validate_user_id(user_id) / "threads")
        )
        if not root.is_dir():
            return
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False) and THREAD_ID_RE.fullmatch(entry.name):
                yield entry.name


class ThreadFolders:
    """One thread's folders for the length of a request or a tool call.

    The folders are walked from the data dir down once, on first use (one `open` per
    level, no link followed: `ThreadPaths._walk`); an area below the walked user-data is
    then one `lstat`. Everything that maps a path of the thread onto the disk goes through
    here, the virtual-path resolver of artifacts, previews, the agent's file access and
    document text included, so the rules of SPEC 1.9 are written once. Not shared between
    requests: a folder replaced by a link later is seen by the next request's walk.
    """

    def __init__(self, paths: ThreadPaths, ref: ThreadRef) -> None:
        self.paths = paths
        self.ref = ref
        self.scope = paths.scope(ref)
        self._walked = False
        self._unsafe: UnsafeFolder | None = None  # what the walk refused, if anything
        self._user_data_exists = False
        self._areas: dict[Area, Path] = {}
        self._existing: set[Path] = set()
        self._records: list[UploadRecord] | None = None
        self._history_dirs: dict[str, Path] = {}
        self._hydrated = paths.copies is None  # brought up to date with the bucket
        self._history_hydrated: set[str] = set()

    @property
    def thread_id(self) -> str:
        return self.ref.thread_id

    def _walk(self) -> None:
        """The one walk: from the data dir down to user-data, remembering what it refused
        (a refusal concerns the folders at and below the refused one only)."""
        if self._walked:
            return
        location = self.paths.user_data_location(self.ref)
        try:
            self.paths.checked(location)
            self._user_data_exists = os.path.isdir(location)
        except UnsafeFolder as error:
            self._unsafe = error
        self._walked = True

    def _checked(self, path: Path) -> Path:
        """`path` (the thread folder or user-data), once the walk found it safe."""
        self._walk()
        refused = self._unsafe
        if refused is not None:
            depth = len(path.relative_to(self.paths.base_dir).parts)
            if len(PurePosixPath(refused.relative).parts) <= depth:
                raise UnsafeFolder(refused.relative)
        return path

    def thread_dir(self) -> Path:
        """The thread's own folder, checked (by the one walk).

        Raises:
            UnsafeFolder: It, or a folder above it, is a link or not a folder.
        """
        return self._checked(self.paths._thread_dir(self.ref))

    def user_data_dir(self) -> Path:
        """/mnt/user-data on the host, checked (by the one walk).

        Raises:
            UnsafeFolder: A folder on the way is a link or not a folder.
        """
        return self._checked(self.paths.user_data_location(self.ref))

    def area_location(self, area: Area) -> Path:
        """Where an area belongs, unchecked (see `ThreadPaths.area_location`)."""
        return self.paths.area_location(self.ref, area)

    def area_dir(self, area: Area) -> Path:
        """One of uploads/, workspace/, outputs/, checked (a missing one is fine).

        Raises:
            UnsafeFolder: It, or a folder above it, is a link or not a folder.
        """
        area = Area(area)
        found = self._areas.get(area)
        if found is not None:
            return found
        if area is Area.UPLOADS and not self._hydrated:
            # On the S3 backend, brought up to date with the bucket before it is read.
            self._hydrated = True  # first: hydrating uses the folders itself
            copies = self.paths.copies
            assert copies is not None
            copies.hydrate(self)
        folder = self._area_checked(area)
        self._areas[area] = folder
        return folder

    def _area_checked(self, area: Area) -> Path:
        """The area's folder once it is known to be a real folder (or missing)."""
        folder = self.user_data_dir() / area.value
        if self._user_data_exists:
            try:
                info = os.lstat(folder)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISDIR(info.st_mode):  # a link, a file
                    raise UnsafeFolder(folder.relative_to(self.paths.base_dir).as_posix())
                self._existing.add(folder)
        return folder

    def uploads_dir(self) -> Path:
        """The thread's uploads folder, checked (not created)."""
        return self.area_dir(Area.UPLOADS)

    def uploads_area(self) -> Path:
        """The uploads folder, checked as `uploads_dir` checks it but, on the S3 backend,
        not brought up to date: for a caller that reads one named file of it, fetched (or
        streamed from the bucket) on its own."""
        return self._area_checked(Area.UPLOADS)

    def holds_upload(self, path: Path) -> bool:
        """Whether `path` (resolved) names a file directly in the uploads folder. Only a
        comparison: the folder is neither read nor, on the S3 backend, brought up to
        date, so serving one upload fetches that upload alone."""
        return path.parent == self.area_location(Area.UPLOADS)

    def versions_dir(self) -> Path:
        """Where the earlier bytes of replaced files are kept (checked, not created): the
        thread's hidden history folder, which no virtual path reaches."""
        return self._history(VERSIONS_FOLDER)

    def trash_dir(self) -> Path:
        """Where deleted files wait for a restore or their expiry (checked, not created)."""
        return self._history(TRASH_FOLDER)

    def _history(self, name: str) -> Path:
        """Checked once per handle, as the areas are: a commit replacing ten files walks
        to its versions folder once."""
        found = self._history_dirs.get(name)
        if found is None:
            found = self.paths.checked(self.thread_dir() / HISTORY_FOLDER / name)
            self._history_dirs[name] = found
            copies = self.paths.copies
            if copies is not None and name not in self._history_hydrated:
                self._history_hydrated.add(name)  # first: hydrating uses the folder itself
                copies.hydrate_history(self, name, found)
        return found

    def make_dirs(self, path: Path) -> list[Path]:
        """`ThreadPaths.make_dirs` for a folder of this thread; nothing to walk again when
        the handle's walk found it already there. Returns the folders created."""
        if path in self._existing:
            return []
        created = self.paths.make_dirs(path)
        self._existing.add(path)
        if created:  # what the walk found missing exists now: the next use walks again
            self._walked, self._unsafe = False, None
            self._areas.clear()
            self._history_dirs.clear()
        return created

    def cached_records(self) -> list[UploadRecord] | None:
        """The thread's upload records as last listed or written through this handle; None
        before the first listing and after a write that did not say what it left."""
        records = self._records
        return None if records is None else list(records)

    def remember_records(self, records: list[UploadRecord]) -> None:
        """Keep the records a listing, or a write's transaction, ended with."""
        self._records = list(records)

    def forget_records(self) -> None:
        """A write changed the records: the next reader lists them again."""
        self._records = None

    def recheck(self, path: Path) -> Path:
        """Walk to `path` again, for a write that follows a long wait (an upload's commit
        after its body streamed): a link planted meanwhile is refused before it is used.

        Raises:
            UnsafeFolder: A folder on the way is a link or not a folder now.
        """
        return self.paths.checked(path)

    def resolve_virtual_path(self, virtual_path: str) -> Path:
        """Map /mnt/user-data/... onto the host, refusing anything that leaves user-data.

        The one resolver of virtual paths. The result may not exist and may be a directory
        (SPEC 1.9).

        Raises:
            ArtifactPrefixError: Not under /mnt/user-data.
            PathTraversal: `..` or a link inside that leads out of user-data.
            UnsafeFolder: A linked area, even one that stays inside.
        """
        relative = _user_data_relative(virtual_path)
        area, _, rest = relative.partition("/")
        if area == Area.UPLOADS.value and not self._hydrated and _is_one_name(rest):
            # One upload (a download, a preview): on the S3 backend only that file is
            # fetched, not every file of the thread the folder lacks.
            self.uploads_area()  # a linked area is refused all the same
            copies = self.paths.copies
            assert copies is not None
            copies.hydrate_file(self, rest)
        elif area in _AREA_NAMES:
            self.area_dir(Area(area))  # a linked area is refused even when it stays inside
        elif not self._hydrated:
            self.area_dir(Area.UPLOADS)  # the root: a listing shows it, a search reaches in
        return self._inside(self.user_data_dir(), relative)

    @staticmethod
    def upload_named(virtual_path: str) -> str | None:
        """The name when `virtual_path` is one file of uploads/ itself
        (`/mnt/user-data/uploads/<name>`), else None (another area, a folder, a path
        through an archive).

        Raises:
            ArtifactPrefixError: Not under /mnt/user-data.
        """
        area, _, rest = _user_data_relative(virtual_path).partition("/")
        return rest if area == Area.UPLOADS.value and _is_one_name(rest) else None

    def split_archive_path(self, resolved: Path) -> tuple[Path, str] | None:
        """(archive, member path) when a resolved virtual path runs through an archive.

        `uploads/reports.zip/q3/summary.docx` does not exist on disk: its first component
        that is not a folder is `reports.zip`, a regular file named like an archive, so the
        rest names a member inside it (read by `services/archives`). Anything else on the
        way (a link, a plain file, a missing folder) means there is no such member.
        """
        user_data = self.user_data_dir().resolve()
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

    def resolve_in_area(self, area: Area, relative: str) -> Path:
        """A path of one area (the file manager's `folder`), refusing anything leaving it.

        Raises:
            PathTraversal, UnsafeFolder: As `resolve_virtual_path`, the area for the root.
        """
        return self._inside(self.area_dir(area), relative)

    @staticmethod
    def _inside(root: Path, relative: str) -> Path:
        actual = (root / relative).resolve()
        if not actual.is_relative_to(root.resolve()):
            raise PathTraversal()
        return actual


_AREA_NAMES = frozenset(area.value for area in Area)

# What services take for a thread: its handle for the request, or a bare reference (walked
# afresh: a script, a test, a background job of its own).
Thread = ThreadRef | ThreadFolders


def ref_of(thread: Thread) -> ThreadRef:
    """The reference of a handle or of a bare reference."""
    return thread.ref if isinstance(thread, ThreadFolders) else thread
