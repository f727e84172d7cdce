"""The virus scan's badge on the file manager's list, a file's own page and the chat
preview, through the test client, in both languages: what a file that is not (yet)
scanned clean says there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from tests.helpers import UploadActions
from tests.helpers import uploads_dir
from tests.support.clamd import Clamd

ZH = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"}
_BADGE = re.compile(
    r'<span class="([^"]*scan-state[^"]*)" data-role="scan" title="([^"]*)">([^<]*)</span>'
)


def scanning_app(make_app: Any, address: str, **scanning: Any) -> Flask:
    return make_app(scanning={"clamd": address, "timeout_seconds": 3, **scanning})


def badges(client: FlaskClient, path: str, **headers: str) -> list[tuple[str, str, str]]:
    """(classes, title, label) of every scan badge on the page."""
    response = client.get(path, headers=headers)
    assert response.status_code == 200
    return _BADGE.findall(response.get_data(as_text=True))


def test_a_file_stored_unscanned_says_so_in_both_languages(
    make_app: Any, make_clamd: Any, base_dir: Path
) -> None:
    clamd = make_clamd()
    app = scanning_app(make_app, clamd.address, on_unavailable="accept_unscanned")
    clamd.stop()
    client = app.test_client()
    assert UploadActions(client).upload("t1", (b"agenda", "minutes.txt")).status_code == 200

    english = (
        "badge badge-warn scan-state scan-unscanned",
        "Stored while the virus scanner was unavailable; not given to the agent until a "
        "virus scan clears it",
        "Not scanned",
    )
    assert badges(client, "/threads/t1") == [english]
    assert badges(client, "/threads/t1/files/uploads/minutes.txt") == [english]
    assert badges(client, "/threads/t1/chat") == [english]
    chinese = (
        "badge badge-warn scan-state scan-unscanned",
        "存储时病毒扫描器不可用；病毒扫描通过前不会提供给智能体",
        "未扫描",
    )
    assert badges(client, "/threads/t1", **ZH) == [chinese]
    assert badges(client, "/threads/t1/files/uploads/minutes.txt", **ZH) == [chinese]
    assert badges(client, "/threads/t1/chat", **ZH) == [chinese]


def test_a_file_without_a_verdict_shows_as_pending_while_scanning_is_on(
    make_app: Any, clamd: Clamd, base_dir: Path
) -> None:
    """A file put in the folder behind the app's back has no verdict: held back from the
    agent as waiting for its scan, and shown so, until a rescan gives it one."""
    app = scanning_app(make_app, clamd.address)
    client = app.test_client()
    UploadActions(client).upload("t1", (b"fine", "fine.txt"))
    (uploads_dir(base_dir, "t1") / "dropped.txt").write_bytes(b"put here by hand")

    found = dict((label, classes) for classes, _, label in badges(client, "/threads/t1"))
    assert found == {
        "Scanned": "badge scan-state scan-clean",
        "Scan pending": "badge badge-warn scan-state scan-pending",
    }
    assert (
        "badge badge-warn scan-state scan-pending",
        "正在等待病毒扫描；病毒扫描通过前不会提供给智能体",
        "等待扫描",
    ) in badges(client, "/threads/t1/chat", **ZH)
    assert [label for _, _, label in badges(client, "/threads/t1/files/uploads/dropped.txt")] == [
        "Scan pending"
    ]
    listed = {f["filename"]: f["scan_state"] for f in UploadActions(client).list("t1")["files"]}
    assert listed == {"dropped.txt": None, "fine.txt": "clean"}  # the API: no verdict yet

    result = app.test_cli_runner().invoke(args=["files", "rescan"])

    assert result.exit_code == 0, result.output
    labels = [label for _, _, label in badges(client, "/threads/t1")]
    assert labels == ["Scanned", "Scanned"]


def test_with_scanning_off_a_file_without_a_verdict_has_no_badge(
    client: FlaskClient, base_dir: Path
) -> None:
    UploadActions(client).upload("t1", (b"fine", "fine.txt"))
    (uploads_dir(base_dir, "t1") / "dropped.txt").write_bytes(b"put here by hand")

    assert badges(client, "/threads/t1") == []
    assert badges(client, "/threads/t1/chat") == []
    page = client.get("/threads/t1/files/uploads/dropped.txt").get_data(as_text=True)
    assert _BADGE.findall(page) == [] and "Virus scan" not in page
