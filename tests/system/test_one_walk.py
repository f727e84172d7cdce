"""A request, or an agent's tool call, settles its thread once (issue: the thread handle).

Counts, for one multipart upload through the app and one agent `read_file` of a Word file
nobody converted: how often a thread id is validated, how often a thread's folders are
walked from the data dir down (one `open` per level), and how often the uploads are listed.
The thread handle is made and checked once, its folders walked once and its records listed
at most once. An upload's commit walks to its folder once more, under the records lock
(`ThreadFolders.recheck`): a link planted while the body streamed is refused before any
rename goes through it; that walk is counted apart.
"""

from __future__ import annotations

import io
import sys
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from deerflow_web import models
from deerflow_web.agent.uploads_source import DirectoryUploadLister
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.storage import paths as storage_paths
from tests.support.agent_helpers import make_runtime
from tests.support.documents import make_docx

UPLOADS = "/mnt/user-data/uploads"


def _counting(counts: Counter[str], key: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return original(*args, **kwargs)

    return counted


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts of validations, folder walks and listings from the moment it is used."""
    found: Counter[str] = Counter()
    validate = getattr(models, "validate_thread_id", storage_paths.validate_thread_id)
    counted = _counting(found, "validate_thread_id", validate)
    for module in list(sys.modules.values()):  # every module that imported it by name
        name = getattr(module, "__name__", "") or ""
        if name.startswith("deerflow_web") and getattr(module, "validate_thread_id", None) in (
            validate,
            storage_paths.validate_thread_id,
        ):
            monkeypatch.setattr(module, "validate_thread_id", counted)
    walk = storage_paths.ThreadPaths._walk
    monkeypatch.setattr(storage_paths.ThreadPaths, "_walk", _counting(found, "walks", walk))
    recheck = storage_paths.ThreadFolders.recheck

    def rechecked(self: storage_paths.ThreadFolders, path: Path) -> Path:
        found["rechecks"] += 1
        found["walks"] -= 1  # the recheck's own walk is counted apart
        return recheck(self, path)

    monkeypatch.setattr(storage_paths.ThreadFolders, "recheck", rechecked)
    for lister in (UploadService, DirectoryUploadLister):
        monkeypatch.setattr(
            lister, "list_uploads", _counting(found, "listings", lister.list_uploads)
        )
    yield found


def _report(what: str, counts: Counter[str]) -> dict[str, int]:
    figures = {key: counts[key] for key in ("validate_thread_id", "walks", "listings", "rechecks")}
    print(f"\n{what}: {figures}")
    return figures


def test_one_upload_settles_its_thread_once(
    client: FlaskClient, counts: Counter[str], base_dir: Path
) -> None:
    first = client.post(
        "/api/threads/t1/uploads", data={"files": [(io.BytesIO(b"one"), "one.txt")]}
    )
    assert first.status_code == 200, first.get_json()
    counts.clear()

    response = client.post(
        "/api/threads/t1/uploads", data={"files": [(io.BytesIO(b"hello"), "notes.txt")]}
    )

    assert response.status_code == 200, response.get_json()
    assert _report("multipart upload", counts) == {
        "validate_thread_id": 1,
        "walks": 1,
        "listings": 0,
        "rechecks": 1,
    }


def test_one_read_of_an_unconverted_document_settles_its_thread_once(
    base_dir: Path, tmp_path: Path, counts: Counter[str]
) -> None:
    from deerflow_web.agent import UploadTools

    service = make_upload_service(base_dir)
    docx = make_docx(tmp_path / "report.docx", title="Report", paragraphs=("Zanzibarite.",))
    service.save_uploads(
        ThreadRef.single_user("t1"), [IncomingFile(docx.name, io.BytesIO(docx.read_bytes()))]
    )
    read = UploadTools(base_dir=base_dir).by_name()["read_file"]
    runtime = make_runtime({"thread_id": "t1"})
    counts.clear()

    text = read.invoke({"path": f"{UPLOADS}/report.docx", "runtime": runtime})

    assert "Zanzibarite" in text
    figures = _report("agent read_file of an unconverted .docx", counts)
    assert (figures["validate_thread_id"], figures["walks"], figures["rechecks"]) == (1, 1, 0)
    assert figures["listings"] <= 4  # before the handle: 4
