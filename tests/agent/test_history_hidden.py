"""The agent's tools never see a thread's history (issue 27): earlier versions of replaced
files and deleted files in the trash are neither listed, globbed, grepped nor read."""

from __future__ import annotations

import os
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.agent import UploadTools
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ThreadRef
from deerflow_web.services.history.hooks import make_history
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import HistorySettings
from tests.support.agent_helpers import make_runtime

T = "t1"


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    uploads = make_upload_service(path)
    make_history(uploads, HistorySettings())
    ref = ThreadRef.single_user(T)

    def put(name: str, body: bytes) -> None:
        incoming = IncomingFile(name, BytesIO(body))
        uploads.save_uploads(ref, [incoming], on_conflict=OnConflict.REPLACE)

    put("report.txt", b"OLD SECRET version\n")
    put("report.txt", b"current text\n")
    put("deleted.txt", b"TRASHED SECRET\n")
    uploads.delete_upload(ref, "deleted.txt")
    history = path / "threads" / T / "history"
    assert len(os.listdir(history / "versions")) == 1 and len(os.listdir(history / "trash")) == 1
    return path


def _tool(base: Path, name: str, **args: Any) -> Any:
    tool = UploadTools(base_dir=base).by_name()[name]
    return tool.invoke({**args, "runtime": make_runtime({"thread_id": T})})


def test_the_listing_shows_the_current_file_only(base: Path) -> None:
    result = _tool(base, "list_uploaded_files")
    assert [entry["filename"] for entry in result["files"]] == ["report.txt"]


def test_glob_and_grep_find_nothing_of_the_history(base: Path) -> None:
    globbed = str(_tool(base, "glob", pattern="**/*", path="/mnt/user-data"))
    assert "report.txt" in globbed
    assert "history" not in globbed and "deleted.txt" not in globbed
    grepped = str(_tool(base, "grep", pattern="SECRET", path="/mnt/user-data"))
    assert "OLD SECRET" not in grepped and "TRASHED SECRET" not in grepped


def test_read_file_reaches_only_the_current_version(base: Path) -> None:
    assert "current text" in _tool(base, "read_file", path="/mnt/user-data/uploads/report.txt")
    version = os.listdir(base / "threads" / T / "history" / "versions")[0]
    (entry,) = os.listdir(base / "threads" / T / "history" / "trash")
    for path in (
        f"/mnt/user-data/../history/versions/{version}",
        f"/mnt/user-data/uploads/../../history/versions/{version}",
        f"/mnt/user-data/../history/trash/{entry}/deleted.txt",
        "/mnt/user-data/uploads/deleted.txt",
        str(base / "threads" / T / "history" / "versions" / version),
    ):
        result = _tool(base, "read_file", path=path)
        assert "SECRET" not in result, path
