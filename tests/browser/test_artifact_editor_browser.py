"""The editor of an outputs text file, in Chromium: save, then a save over a newer version."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from deerflow_web.models import Area
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched

pytestmark = pytest.mark.browser

THREAD = "editor-thread"


def test_edit_an_output_and_refuse_a_stale_save(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"notes.txt": b"the thread's first file"})
    report = live.area_dir(THREAD, Area.OUTPUTS.value) / "report.md"
    report.write_bytes("\n# Draft\n\n第一稿\n".encode())  # a leading newline survives too
    page.page.goto(f"{live.url}/threads/{THREAD}/files/outputs/report.md")
    editor = page.page.locator("#editor-text")
    expect(editor).to_have_value("\n# Draft\n\n第一稿\n")
    editor.fill("# Final\n\n定稿\n")
    page.page.get_by_role("button", name="Save").click()
    expect(page.page.locator("#editor-status")).to_contain_text("Saved")
    assert report.read_text(encoding="utf-8") == "# Final\n\n定稿\n"

    # A second save names the version the first one wrote: no reload needed.
    editor.fill("# Final, again\n")
    page.page.get_by_role("button", name="Save").click()
    expect(page.page.locator("#editor-status")).to_contain_text("Saved (15 B)")
    assert report.read_text(encoding="utf-8") == "# Final, again\n"

    # An agent writes the file again; the open page's next save must not overwrite it.
    report.write_text("# Written by the agent\n", encoding="utf-8")
    page.allowed_errors.append("412")  # Chromium logs the refused request itself
    editor.fill("# My late change\n")
    page.page.get_by_role("button", name="Save").click()
    expect(page.page.locator("#editor-status")).to_contain_text("changed since you opened it")
    expect(page.page.locator("#editor-reload")).to_be_visible()
    assert report.read_text(encoding="utf-8") == "# Written by the agent\n"
    page.shoot("artifact-editor-412")
    page.page.locator("#editor-reload").click()
    expect(page.page.locator("#editor-text")).to_have_value("# Written by the agent\n")


def test_no_editor_outside_outputs_or_for_binary(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"upload.txt": b"an upload"})
    (live.area_dir(THREAD, Area.OUTPUTS.value) / "data.bin").write_bytes(b"\0\1\2binary")
    for path in ("uploads/upload.txt", "outputs/data.bin"):
        page.page.goto(f"{live.url}/threads/{THREAD}/files/{path}")
        expect(page.page.locator("h1")).to_be_visible()
        expect(page.page.locator("#artifact-editor")).to_have_count(0)
