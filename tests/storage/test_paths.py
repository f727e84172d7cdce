"""Thread ids, user ids, base-dir resolution and virtual paths (SPEC 1, cases 1-9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.errors import ArtifactPrefixError
from deerflow_web.errors import ConfigError
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import PathTraversal
from deerflow_web.models import Area
from deerflow_web.models import ThreadRef
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import resolve_base_dir
from deerflow_web.storage.paths import safe_user_id
from deerflow_web.storage.paths import validate_thread_id
from deerflow_web.storage.paths import validate_user_id
from tests.helpers import thread_ref


@pytest.mark.parametrize("thread_id", ["a", "A1_b-2", "x" * 64])
def test_valid_thread_ids_are_returned_unchanged(thread_id: str) -> None:
    assert validate_thread_id(thread_id) == thread_id


@pytest.mark.parametrize(
    "thread_id",
    ["", "x" * 65, "thread.with.dot", "../escape", "has space", "line\nbreak", "线程", 1, {}],
)
def test_invalid_thread_ids_are_rejected(thread_id: object) -> None:
    with pytest.raises(InvalidThreadId, match="Invalid thread_id"):
        validate_thread_id(thread_id)


@pytest.mark.parametrize("user_id", ["../escape", "foo/bar", ""])
def test_invalid_user_ids_are_rejected(user_id: str) -> None:
    with pytest.raises(InvalidUserId, match="Invalid user_id"):
        validate_user_id(user_id)


def test_safe_user_id_buckets() -> None:
    assert safe_user_id("user@example.com") == "user-example-com-b4c9a289323b21a0"
    assert safe_user_id("ou_abc-123") == "ou_abc-123"
    assert safe_user_id("a.b") != safe_user_id("a/b")
    with pytest.raises(InvalidUserId):
        safe_user_id("")


def test_layouts(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path)
    assert (
        paths.uploads_dir(thread_ref("t1", "u1"))
        == tmp_path / "users/u1/threads/t1/user-data/uploads"
    )
    assert (
        paths.uploads_dir(ThreadRef.single_user("t1")) == tmp_path / "threads/t1/user-data/uploads"
    )
    assert not (tmp_path / "threads").exists()  # computing a path creates nothing


def test_ensure_thread_dirs_creates_private_areas(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path)
    paths.ensure_thread_dirs(ThreadRef.single_user("t1"))
    for area in Area:
        folder = paths.area_dir(ThreadRef.single_user("t1"), area)
        assert folder.is_dir()
        assert folder.stat().st_mode & 0o7777 == 0o700
    paths.delete_thread_dir(ThreadRef.single_user("t1"))
    assert not paths.thread_dir(ThreadRef.single_user("t1")).exists()
    paths.delete_thread_dir(ThreadRef.single_user("t1"))  # a missing thread is a no-op


def test_base_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_base_dir(tmp_path / "x", {}) == (tmp_path / "x").resolve()
    assert resolve_base_dir(None, {"DEER_FLOW_HOME": str(tmp_path / "h")}) == tmp_path / "h"
    assert resolve_base_dir(None, {"DEER_FLOW_PROJECT_ROOT": str(tmp_path)}) == (
        tmp_path / ".deer-flow"
    )
    with pytest.raises(ConfigError, match="DEER_FLOW_PROJECT_ROOT.*does not exist"):
        resolve_base_dir(None, {"DEER_FLOW_PROJECT_ROOT": str(tmp_path / "missing")})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        resolve_base_dir(None, {"DEER_FLOW_PROJECT_ROOT": str(tmp_path / "file")})
    monkeypatch.chdir(tmp_path)
    assert resolve_base_dir(None, {}) == tmp_path.resolve() / ".deer-flow"


def test_virtual_paths(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path)
    resolved = paths.folders(ThreadRef.single_user("t1")).resolve_virtual_path(
        "/mnt/user-data/workspace/file.txt"
    )
    assert resolved == tmp_path.resolve() / "threads/t1/user-data/workspace/file.txt"
    assert paths.folders(ThreadRef.single_user("t1")).resolve_virtual_path(
        "mnt/user-data"
    ) == paths.user_data_dir(ThreadRef.single_user("t1"))
    with pytest.raises(ArtifactPrefixError, match="Path must start with /mnt/user-data"):
        paths.folders(ThreadRef.single_user("t1")).resolve_virtual_path("mnt/user-dataX/a")
    with pytest.raises(PathTraversal, match="path traversal detected"):
        paths.folders(ThreadRef.single_user("t1")).resolve_virtual_path("mnt/user-data/../../x")


def test_virtual_path_symlink_out_is_traversal(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path / "base")
    outputs = paths.area_dir(ThreadRef.single_user("t1"), Area.OUTPUTS)
    outputs.mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("secret")
    (outputs / "link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(PathTraversal):
        paths.folders(ThreadRef.single_user("t1")).resolve_virtual_path(
            "mnt/user-data/outputs/link.txt"
        )
