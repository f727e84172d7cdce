"""Nothing the app writes in the data dir is open to other users of the machine.

The data dir holds password hashes, emails, the session key and every user's files: it is
0700, its folders 0700 and its files 0600, whatever the umask the service was started with
(the modes are set explicitly, never left to the umask). Each test runs under umask 000,
where anything left to the umask would come out group- and world-writable.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.errors import ConfigError
from deerflow_web.models import Area
from deerflow_web.storage.database import DATABASE_FILE
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import use_storage_group
from deerflow_web.web.wiring import SECRET_KEY_FILE
from tests.helpers import UploadActions
from tests.helpers import thread_dir
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.support.documents import make_docx
from tests.web.api.test_tus import TusActions
from tests.web.api.test_tus import encode_metadata


@pytest.fixture(autouse=True)
def _permissive_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_to_others(base_dir: Path) -> list[str]:
    """Every folder and file under (and including) the data dir with a group or other bit."""
    found = [f"{base_dir}: {mode(base_dir):o}"] if mode(base_dir) & 0o077 else []
    for root, folders, files in os.walk(base_dir):
        for name in folders + files:
            path = Path(root) / name
            if not path.is_symlink() and mode(path) & 0o077:
                found.append(f"{path.relative_to(base_dir)}: {mode(path):o}")
    return found


def test_every_kind_of_write_creates_nothing_others_can_read(
    make_app: Any, base_dir: Path, tmp_path: Path
) -> None:
    base_dir.rmdir()  # the app creates the data dir itself
    client = make_app(uploads={"conversion_wait_seconds": 120}).test_client()
    uploads = UploadActions(client)
    assert mode(base_dir) == 0o700
    # multipart upload, then a rename
    assert uploads.upload("T", (b"hello", "a.txt")).status_code == 200
    renamed = client.post("/api/threads/T/uploads/a.txt/rename", json={"new_name": "b.txt"})
    assert renamed.status_code == 200, renamed.get_json()
    # tus: created, then one chunk that completes it
    tus = TusActions(client)
    created = tus.create("T", 5, encode_metadata(filename="tus.bin"))
    assert created.status_code == 201, created.get_json()
    staging = [p for p in uploads_dir(base_dir, "T").iterdir() if p.name.startswith(".upload-")]
    assert staging and all(mode(p) == 0o600 for p in staging)
    assert tus.patch(created.headers["Location"], 0, b"12345").status_code == 204
    # a conversion companion
    docx = make_docx(tmp_path / "q.docx", title="Quarterly Report")
    assert uploads.upload("T", (docx.read_bytes(), "q.docx")).status_code == 200
    converted = client.post("/api/threads/T/uploads/q.docx/convert")
    assert converted.status_code == 200, converted.get_json()
    # "New thread"
    new = client.post("/threads")
    assert new.status_code == 302
    new_thread = new.headers["Location"].rsplit("/", 1)[-1]

    folder = uploads_dir(base_dir, "T")
    for name in ("b.txt", "tus.bin", "q.docx", "q.md"):
        assert mode(folder / name) == 0o600, name
    for area in ("uploads", "workspace", "outputs"):
        assert mode(thread_dir(base_dir, new_thread) / "user-data" / area) == 0o700
    assert mode(base_dir / SECRET_KEY_FILE) == 0o600
    database = base_dir / DATABASE_FILE
    assert mode(database) == 0o600
    assert (base_dir / f"{DATABASE_FILE}-wal").exists()  # WAL: SQLite made its journals
    assert open_to_others(base_dir) == []


def test_an_existing_data_dir_is_tightened_at_start_up(make_app: Any, base_dir: Path) -> None:
    """An earlier release left 0755 and 0644: the data dir (the gate to everything below),
    the database with its journals and the secret key are tightened; nothing is walked."""
    make_app()  # a data dir as an earlier release would leave it, with the database
    os.chmod(base_dir, 0o755)
    loose = [base_dir / SECRET_KEY_FILE, base_dir / DATABASE_FILE]
    loose += [base_dir / f"{DATABASE_FILE}{suffix}" for suffix in ("-wal", "-shm")]
    for path in loose:
        path.touch(exist_ok=True)
        os.chmod(path, 0o644)
    make_app()
    assert mode(base_dir) == 0o700
    for path in loose:
        assert mode(path) == 0o600, path.name


def test_new_folders_are_private_and_an_old_open_area_is_tightened(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path / "data")
    created = paths.make_dirs(tmp_path / "data/users/u/threads/t/x")
    assert created and all(mode(folder) == 0o700 for folder in created)
    assert mode(tmp_path / "data") == 0o700
    outputs = paths.area_location(thread_ref("t", "u"), Area.OUTPUTS)
    paths.make_dirs(outputs.parent)
    outputs.mkdir()
    os.chmod(outputs, 0o777)  # what "New thread" made before: world-writable, no sticky bit
    paths.ensure_thread_dirs(thread_ref("t", "u"))
    assert mode(outputs) == 0o700
    assert open_to_others(tmp_path / "data") == []


@pytest.fixture
def storage_group(tmp_path: Path) -> Iterator[grp.struct_group]:
    """A group other than the service's own; the process-wide modes are reset afterwards."""
    group = next((g for g in grp.getgrall() if g.gr_gid != os.getgid()), None)
    if group is None:
        pytest.skip("this machine has no second group")
    try:
        yield group
    finally:
        use_storage_group(None)


def test_with_a_storage_group_thread_files_are_readable_by_that_group_only(
    make_app: Any, base_dir: Path, tmp_path: Path, storage_group: grp.struct_group
) -> None:
    config = tmp_path / "group.yaml"
    config.write_text(f"storage:\n  group: {storage_group.gr_name}\n", encoding="utf-8")
    client = make_app(CONFIG_PATH=str(config)).test_client()
    assert UploadActions(client).upload("T", (b"hello", "a.txt")).status_code == 200
    assert client.post("/threads").status_code == 302
    assert mode(base_dir) == 0o2750 and base_dir.stat().st_gid == storage_group.gr_gid
    secrets = {base_dir / SECRET_KEY_FILE, base_dir / DATABASE_FILE}
    secrets |= {base_dir / f"{DATABASE_FILE}{suffix}" for suffix in ("-wal", "-shm")}
    for root, folders, files in os.walk(base_dir):
        for name in folders:
            folder = Path(root) / name
            assert mode(folder) == 0o2750, folder
            assert folder.stat().st_gid == storage_group.gr_gid, folder
        for name in files:
            path = Path(root) / name
            assert mode(path) == (0o600 if path in secrets else 0o640), path
    assert mode(uploads_dir(base_dir, "T") / "a.txt") == 0o640
    assert (uploads_dir(base_dir, "T") / "a.txt").stat().st_gid == storage_group.gr_gid


def test_an_unknown_storage_group_stops_start_up(make_app: Any, tmp_path: Path) -> None:
    config = tmp_path / "group.yaml"
    config.write_text("storage:\n  group: no-such-group-here\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no group named 'no-such-group-here'"):
        make_app(CONFIG_PATH=str(config))
    use_storage_group(None)
