"""The thread handle: a `ThreadRef` is valid once made, and `ThreadFolders` walks once.

A reference with a malformed thread or user id cannot exist, and no reference means "no
user": the single-user mode is its own owner. The folders of one handle are walked once,
yet refuse a planted link exactly where a fresh walk would, and the one virtual-path
resolver keeps every path inside the thread's user-data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from deerflow_web.errors import ArtifactPrefixError
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import InvalidUserId
from deerflow_web.errors import PathTraversal
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import Area
from deerflow_web.models import ThreadRef
from deerflow_web.storage.paths import ThreadPaths

BAD_THREAD_IDS = ["", "a/b", "..", "a b", "é", "x" * 65, None, 7]
BAD_USER_IDS = ["a/b", "..", "a b", "é", None, 7]


@pytest.mark.parametrize("thread_id", BAD_THREAD_IDS)
def test_a_malformed_thread_id_makes_no_reference(thread_id: object) -> None:
    with pytest.raises(InvalidThreadId):
        ThreadRef(thread_id, "u1")  # type: ignore[arg-type]
    with pytest.raises(InvalidThreadId):
        ThreadRef.single_user(thread_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("user_id", BAD_USER_IDS)
def test_a_malformed_or_missing_user_makes_no_reference(user_id: object) -> None:
    """None is refused too: forgetting the user is an error, not the flat layout."""
    with pytest.raises(InvalidUserId):
        ThreadRef("t1", user_id)  # type: ignore[arg-type]


def test_the_single_user_mode_is_its_own_owner(tmp_path: Path) -> None:
    single = ThreadRef.single_user("t1")
    assert single == ThreadRef("t1", SINGLE_USER)
    assert single.is_single_user and single.owner is None
    owned = ThreadRef("t1", "u1")
    assert not owned.is_single_user and owned.owner == "u1"
    assert single != owned
    paths = ThreadPaths(tmp_path)
    assert paths.scope(single) == "threads/t1"
    assert paths.scope(owned) == "users/u1/threads/t1"
    assert paths.parse_scope("threads/t1") == single
    assert paths.parse_scope("users/u1/threads/t1") == owned
    with pytest.raises(dataclasses.FrozenInstanceError):
        owned.user_id = "u2"  # type: ignore[misc]


def _count_walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    walked: list[Path] = []
    walk = ThreadPaths._walk

    def counted(self: ThreadPaths, path: Path, **kwargs: object) -> list[Path]:
        walked.append(path)
        return walk(self, path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ThreadPaths, "_walk", counted)
    return walked


def test_one_handle_walks_once_for_all_its_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = ThreadPaths(tmp_path)
    ref = ThreadRef("t1", "u1")
    paths.ensure_thread_dirs(ref)
    walked = _count_walks(monkeypatch)
    folders = paths.folders(ref)
    assert walked == []  # made without touching the disk
    user_data = tmp_path / "users/u1/threads/t1/user-data"
    assert folders.thread_dir() == user_data.parent
    assert folders.user_data_dir() == user_data
    for area in Area:
        assert folders.area_dir(area) == user_data / area.value
    assert folders.resolve_virtual_path("/mnt/user-data/outputs/a.txt") == (
        user_data / "outputs/a.txt"
    )
    assert folders.make_dirs(folders.uploads_dir()) == []  # found there: nothing to walk
    assert walked == [user_data]


@pytest.mark.parametrize("level", ["thread", "user-data", "uploads", "outputs"])
def test_a_link_is_refused_where_a_fresh_walk_refuses_it(tmp_path: Path, level: str) -> None:
    """Each accessor answers as `ThreadPaths` does: a linked area refuses that area only."""
    base = tmp_path / "data"
    paths = ThreadPaths(base)
    ref = ThreadRef.single_user("t1")
    paths.ensure_thread_dirs(ref)
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = {
        "thread": base / "threads/t1",
        "user-data": base / "threads/t1/user-data",
        "uploads": base / "threads/t1/user-data/uploads",
        "outputs": base / "threads/t1/user-data/outputs",
    }[level]
    linked.rename(tmp_path / "moved")
    linked.symlink_to(outside, target_is_directory=True)
    folders = paths.folders(ref)

    def answer(call: Callable[[], Path]) -> object:
        try:
            return call()
        except UnsafeFolder as error:
            return ("refused", error.relative)

    assert answer(folders.thread_dir) == answer(lambda: paths.thread_dir(ref))
    assert answer(folders.user_data_dir) == answer(lambda: paths.user_data_dir(ref))
    for area in Area:
        assert answer(lambda a=area: folders.area_dir(a)) == answer(
            lambda a=area: paths.area_dir(ref, a)
        )
    assert list(outside.iterdir()) == []


def test_the_resolver_keeps_paths_inside_user_data(tmp_path: Path) -> None:
    paths = ThreadPaths(tmp_path / "data")
    ref = ThreadRef.single_user("t1")
    paths.ensure_thread_dirs(ref)
    folders = paths.folders(ref)
    user_data = folders.user_data_dir()
    assert folders.resolve_virtual_path("mnt/user-data") == user_data
    with pytest.raises(ArtifactPrefixError):
        folders.resolve_virtual_path("/mnt/user-dataX/a")
    with pytest.raises(PathTraversal):
        folders.resolve_virtual_path("/mnt/user-data/uploads/../../../x")
    (tmp_path / "secret").write_text("s")
    (user_data / "outputs" / "out").symlink_to(tmp_path / "secret")
    with pytest.raises(PathTraversal):
        folders.resolve_virtual_path("/mnt/user-data/outputs/out")
    assert folders.resolve_in_area(Area.OUTPUTS, "sub/f") == user_data / "outputs/sub/f"
    with pytest.raises(PathTraversal):
        folders.resolve_in_area(Area.OUTPUTS, "../uploads")
