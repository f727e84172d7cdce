"""The chat preview's tools panel in headless Chromium: what read_file and grep return."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import ACCOUNTS
from tests.browser.helpers import SINGLE_USER
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.support.documents import make_docx

pytestmark = pytest.mark.browser

THREAD = "tools-thread"
SLOW = 90_000  # ms: the first read converts the document in the isolated worker


def _seed(live: LiveServer, tmp_path: Path) -> None:
    docx = make_docx(
        tmp_path / "report.docx", title="Quarterly Report", paragraphs=("Zinc prices rose.",)
    )
    live.seed(THREAD, {"report.docx": docx.read_bytes(), "notes.txt": b"zinc notes\n"})


# The page has no script of its own: with or without JavaScript only the browser differs,
# not the server, so the no-script run is not repeated with accounts on.
@pytest.mark.parametrize(
    ("mode", "javascript"),
    ((ACCOUNTS, True), (SINGLE_USER, True), (SINGLE_USER, False)),
    ids=("accounts-js", "single-user-js", "single-user-no-js"),
)
def test_read_file_and_grep_show_what_the_model_gets(
    open_page: Callable[..., Watched],
    live: LiveServer,
    tmp_path: Path,
    mode: str,
    javascript: bool,
) -> None:
    _seed(live, tmp_path)
    watched = open_page(javascript=javascript, server=live)
    page = watched.page
    page.goto(f"{live.url}/threads/{THREAD}/chat")
    panel = page.locator("#tools")
    expect(panel.get_by_role("heading", name="What would the tools return")).to_be_visible()

    panel.get_by_label("Tool").select_option("read_file")
    panel.get_by_label("File").select_option(label="report.docx")
    panel.get_by_label("From line").fill("1")
    panel.get_by_label("To line").fill("3")
    panel.get_by_role("button", name="Run the tool").click(timeout=SLOW)

    answer = page.locator("#tool-answer")
    expect(answer).to_contain_text(
        "[/mnt/user-data/uploads/report.docx as Markdown text, lines 1-3 of", timeout=SLOW
    )
    expect(answer).to_contain_text("1\t# Quarterly Report")
    expect(answer).not_to_contain_text("PK")
    expect(page.locator("#tool-call")).to_contain_text('"start_line": 1')
    assert live.names(THREAD) == ["notes.txt", "report.docx", "report.md"]  # recorded
    watched.shoot(f"tools-panel-read-{'js' if javascript else 'nojs'}")

    panel = page.locator("#tools")
    panel.get_by_label("Tool").select_option("grep")
    panel.get_by_label("File").select_option(label="/mnt/user-data/uploads/")
    panel.get_by_label("Pattern (grep)").fill("(?i)zinc")
    panel.get_by_role("button", name="Run the tool").click()
    expect(answer).to_contain_text('"path": "/mnt/user-data/uploads/report.docx"')
    expect(answer).to_contain_text('"text": "Zinc prices rose."')
    expect(answer).to_contain_text('"path": "/mnt/user-data/uploads/notes.txt"')
    expect(answer).not_to_contain_text("report.md")


def test_a_tool_error_is_shown_as_the_model_reads_it_in_chinese_too(
    open_page: Callable[..., Watched], live: LiveServer
) -> None:
    live.seed(THREAD, {"old.doc": bytes.fromhex("D0CF11E0A1B11AE1") + b"\0" * 600})
    watched = open_page(language="zh-CN", server=live)
    page = watched.page
    page.goto(f"{live.url}/threads/{THREAD}/chat")
    panel = page.locator("#tools")
    expect(panel.get_by_role("heading", name="工具会返回什么")).to_be_visible()
    panel.get_by_label("文件").select_option(label="old.doc")
    panel.get_by_role("button", name="运行工具").click()
    expect(page.locator("#tool-answer")).to_contain_text(
        "Cannot read /mnt/user-data/uploads/old.doc: old.doc is a legacy Word (.doc) file",
        timeout=SLOW,
    )
    expect(page.locator("#tools")).to_contain_text("错误")
