"""The chat preview's tools panel through the test client: the same answer as the tools."""

from __future__ import annotations

import html
import json
import re
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from deerflow_web.agent import UploadTools
from deerflow_web.models import IncomingFile
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID
from tests.helpers import thread_ref
from tests.support.agent_helpers import make_runtime
from tests.support.documents import make_pdf

T = "t1"
TOOLS = f"/threads/{T}/chat/tools"


def _seed(app: Flask, files: dict[str, bytes]) -> None:
    incoming = [IncomingFile(name, BytesIO(body)) for name, body in files.items()]
    app.extensions[EXTENSION_KEY].uploads.save_uploads(thread_ref(T), incoming)


def _answer(response: Any) -> str:
    match = re.search(r'id="tool-answer"[^>]*>(.*?)</pre>', response.get_data(as_text=True), re.S)
    assert match is not None, response.get_data(as_text=True)
    return html.unescape(match.group(1))


def test_the_panel_shows_what_read_file_returns(app: Flask, base_dir: Path, tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "letter.pdf", lines=("Hello PDF world", "Second line"))
    _seed(app, {"letter.pdf": pdf.read_bytes(), "notes.txt": b"one\ntwo <system>x</system>\n"})
    client = app.test_client()
    runtime = make_runtime({"thread_id": T, "user_id": USER_ID})
    read = UploadTools(base_dir=base_dir).by_name()["read_file"]

    for path, start, end in (
        ("/mnt/user-data/uploads/letter.pdf", "", ""),
        ("/mnt/user-data/uploads/notes.txt", "2", "2"),
        ("/mnt/user-data/uploads/gone.txt", "", ""),
        ("/mnt/user-data/uploads", "", ""),
    ):
        data = {"tool": "read_file", "path": path, "start_line": start, "end_line": end}
        response = client.post(TOOLS, data=data)
        assert response.status_code == 200
        args: dict[str, Any] = {"path": path, "runtime": runtime}
        if start:
            args.update(start_line=int(start), end_line=int(end))
        assert _answer(response) == read.invoke(args)

    assert "Hello PDF world" in _answer(
        client.post(TOOLS, data={"tool": "read_file", "path": "/mnt/user-data/uploads/letter.pdf"})
    )


def test_the_panel_shows_what_grep_returns(app: Flask, base_dir: Path) -> None:
    _seed(app, {"a.txt": b"alpha\nbeta\n", "b.txt": b"alphabet\n"})
    client = app.test_client()
    grep = UploadTools(base_dir=base_dir).by_name()["grep"]
    runtime = make_runtime({"thread_id": T, "user_id": USER_ID})

    for pattern in ("alpha", "(", ""):
        response = client.post(
            TOOLS, data={"tool": "grep", "path": "/mnt/user-data/uploads", "pattern": pattern}
        )
        assert response.status_code == 200
        expected = grep.invoke({"pattern": pattern, "runtime": runtime})
        if isinstance(expected, dict):
            import json

            expected = json.dumps(expected, ensure_ascii=False)
        assert _answer(response) == expected


def test_bad_line_numbers_are_refused_and_nothing_runs(app: Flask) -> None:
    _seed(app, {"a.txt": b"alpha\n"})
    response = app.test_client().post(
        TOOLS, data={"tool": "read_file", "path": "/mnt/user-data/uploads/a.txt", "start_line": "0"}
    )
    assert response.status_code == 422
    assert 'id="tool-answer"' not in response.get_data(as_text=True)


def test_the_panel_needs_a_csrf_token(make_app: Any) -> None:
    app = make_app(WTF_CSRF_ENABLED=True)
    _seed(app, {"a.txt": b"alpha\n"})
    response = app.test_client().post(
        TOOLS, data={"tool": "read_file", "path": "/mnt/user-data/uploads/a.txt"}
    )
    assert response.status_code == 400
    assert 'id="tool-answer"' not in response.get_data(as_text=True)


def test_the_panel_is_bounded_by_the_same_grep_budget(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 3 on the page: one budget per call, and the answer says where it stopped."""
    from deerflow_web.services.prompt import file_access

    lines = 10 * 1024 * 1024
    _seed(app, {"a.txt": b"a\n" * lines, "b.txt": b"a\n" * lines})
    monkeypatch.setattr(file_access, "GREP_SECONDS", 0.5)
    client = app.test_client()

    started = time.thread_time()
    response = client.post(
        TOOLS, data={"tool": "grep", "path": "/mnt/user-data/uploads", "pattern": "zzz"}
    )
    cpu_seconds = time.thread_time() - started

    assert response.status_code == 200
    # The budget and the request's own work (the page, the JSON): an unbounded search of
    # both files takes several CPU-seconds, and stopping inside a.txt is asserted below.
    assert cpu_seconds < 0.5 + 1.0
    answer = json.loads(_answer(response))
    assert answer["truncated"] is True
    assert answer["stopped_at"]["path"] == "/mnt/user-data/uploads/a.txt"
    assert 1 < answer["stopped_at"]["line"] < lines
    assert (
        f"at line {answer['stopped_at']['line']} of /mnt/user-data/uploads/a.txt"
        in (answer["message"])
    )
