"""A file stored while the virus scanner was down, as a person sees it in headless
Chromium: the file manager's list, the file's own page and the chat preview say "Not
scanned" (未扫描 in Chinese), with why in the badge's title, and the preview shows the
agent told the same.

A real clamd is started and stopped, and the app is configured to accept uploads
unscanned (`scanning.on_unavailable: accept_unscanned`), so the upload is stored
`unscanned`; the file is picked in the page's own file input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.helpers import thread_ref

pytestmark = pytest.mark.browser

THREAD = "scan-thread"
NAME = "minutes.txt"
TITLE_EN = (
    "Stored while the virus scanner was unavailable; not given to the agent until a virus "
    "scan clears it"
)
TITLE_ZH = "存储时病毒扫描器不可用；病毒扫描通过前不会提供给智能体"


def _badge(watched: Watched) -> Any:
    return watched.page.locator(f'tr.file-row[data-filename="{NAME}"] [data-role="scan"]')


def test_an_upload_stored_unscanned_is_badged_in_the_list_and_the_chat_preview(
    start_server: Callable[..., LiveServer],
    open_page: Callable[..., Watched],
    make_clamd: Any,
    mode: str,
) -> None:
    clamd = make_clamd()
    live = start_server(
        mode=mode,
        scanning={
            "clamd": clamd.address,
            "timeout_seconds": 3,
            "on_unavailable": "accept_unscanned",
        },
    )
    clamd.stop()  # down for real: nothing answers on its socket any more
    page = open_page(server=live)
    page.page.goto(f"{live.url}/threads/{THREAD}")
    expect(page.page.locator("#drop-zone .drop-hint")).to_be_visible()

    page.page.set_input_files(
        "#file-input", [{"name": NAME, "mimeType": "text/plain", "buffer": b"agenda"}]
    )

    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).")
    badge = _badge(page)
    expect(badge).to_have_text("Not scanned")
    expect(badge).to_have_attribute("title", TITLE_EN)
    expect(badge).to_have_class(re.compile(r"\bbadge-warn\b"))
    (record,) = live.service.list_uploads(thread_ref(THREAD, live.user_id))
    assert record.scan_state is not None and record.scan_state.value == "unscanned"
    badge.scroll_into_view_if_needed()
    page.shoot("scan-badge-unscanned", full_page=False)

    page.page.get_by_role("link", name="Preview what the agent receives").click()
    item = page.page.locator(".attach-list li", has_text=NAME)
    expect(item.locator(".scan-state")).to_have_text("Not scanned")
    expect(item.locator(".scan-state")).to_have_attribute("title", TITLE_EN)
    page.page.get_by_role("checkbox", name=NAME).check()
    page.page.get_by_role("combobox", name="Message").fill("Summarise the minutes")
    page.page.get_by_role("button", name="Preview").click()
    model = page.page.locator("#model-content")
    expect(model).to_contain_text("<withheld_uploads>")
    expect(model).to_contain_text(
        f"- {NAME}: it could not be virus-scanned yet (the scanner was unavailable)"
    )
    expect(model).not_to_contain_text("<current_uploads>")

    chinese = open_page(server=live, language="zh-CN")
    chinese.page.goto(f"{live.url}/threads/{THREAD}")
    expect(_badge(chinese)).to_have_text("未扫描")
    expect(_badge(chinese)).to_have_attribute("title", TITLE_ZH)
    chinese.page.get_by_role("link", name=NAME, exact=True).first.click()  # the file's own page
    own = chinese.page.locator(".file-facts .scan-state")
    expect(own).to_have_text("未扫描")
    expect(own).to_have_attribute("title", TITLE_ZH)
    chinese.page.goto(f"{live.url}/threads/{THREAD}/chat")
    zh_item = chinese.page.locator(".attach-list li", has_text=NAME).locator(".scan-state")
    expect(zh_item).to_have_text("未扫描")
    expect(zh_item).to_have_attribute("title", TITLE_ZH)
