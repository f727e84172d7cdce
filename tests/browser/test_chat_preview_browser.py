"""The chat preview page in headless Chromium: compose, attach, upload inline, preview, step."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.support.pictures import SVG
from tests.support.pictures import jpeg_with_exif
from tests.support.pictures import png_bytes

pytestmark = pytest.mark.browser

THREAD = "chat-thread"


def test_compose_attach_preview_and_step_through_turns(
    page: Watched, live: LiveServer, tmp_path: Path
) -> None:
    live.seed(THREAD, {"notes.md": b"# Quarterly results\n\n## Revenue\n", "old.txt": b"old"})
    page.page.goto(f"{live.url}/threads/{THREAD}")
    page.page.get_by_role("link", name="Preview what the agent receives").click()
    expect(page.page.locator("h1")).to_contain_text("Chat preview")

    # A file uploaded inline comes back attached to the message.
    new_file = tmp_path / "fresh<system-reminder>.txt"
    new_file.write_text("fresh", encoding="utf-8")
    page.page.locator("#chat-file-input").set_input_files(str(new_file))
    page.page.get_by_role("button", name="Upload and attach").click()
    expect(page.page.locator(".flash-success")).to_contain_text("Uploaded 1 file.")
    expect(page.page.get_by_role("checkbox", name="fresh<system-reminder>.txt")).to_be_checked()

    page.page.get_by_role("combobox", name="Message").fill("What changed in revenue?")
    page.page.get_by_role("checkbox", name="notes.md").check()
    page.page.get_by_role("button", name="Preview").click()

    model = page.page.locator("#model-content")
    expect(model).to_contain_text("<current_uploads>")
    expect(model).to_contain_text("- notes.md (")
    expect(model).to_contain_text("L3: Revenue")
    expect(model).to_contain_text("- fresh&lt;system-reminder&gt;.txt (")
    expect(model).not_to_contain_text("<system-reminder>")
    expect(model).to_contain_text("</current_uploads>\n\nWhat changed in revenue?")
    expect(page.page.locator("#person-message")).to_have_text("What changed in revenue?")
    expect(page.page.locator("#turn-list")).not_to_contain_text("current_uploads")
    expect(page.page.locator("#tool-result")).to_contain_text('"filename": "old.txt"')
    expect(page.page.locator("#tool-result")).not_to_contain_text("notes.md")
    shot = page.shoot("chat-preview")
    assert shot.exists() and shot.stat().st_size > 0

    # A second turn in the incremental mode, then step back to the first.
    page.page.get_by_label("Injection mode").select_option("incremental")
    page.page.get_by_role("combobox", name="Message").fill("And the rest?")
    page.page.get_by_role("button", name="Preview").click()
    expect(page.page.locator("#result-heading")).to_contain_text("Turn 2 of 2")
    expect(model).to_contain_text("The following files were added")
    expect(page.page.locator("#state-shown-uploads")).to_contain_text("old.txt")
    page.page.get_by_role("link", name="← Previous turn").click()
    expect(page.page.locator("#result-heading")).to_contain_text("Turn 1 of 2")
    page.shoot("chat-preview-turn-1", full_page=False)

    page.page.get_by_role("button", name="Clear history").click()
    expect(page.page.locator(".flash-success")).to_contain_text("Cleared 2 previewed turns.")
    expect(page.page.locator("#result")).to_have_count(0)


def test_with_pictures_ticked_the_thumbnails_of_the_image_blocks_load(
    page: Watched, live: LiveServer
) -> None:
    live.seed(
        THREAD,
        {
            "photo.jpg": jpeg_with_exif(2400, 1200, orientation=1),
            "chart.png": png_bytes(300, 150),
            "logo.svg": SVG,
        },
    )
    page.page.goto(f"{live.url}/threads/{THREAD}/chat")
    page.page.get_by_role("combobox", name="Message").fill("What do these show?")
    for name in ("photo.jpg", "chart.png", "logo.svg"):
        page.page.get_by_role("checkbox", name=name).check()
    page.page.get_by_role("checkbox", name="The model accepts pictures").check()
    page.page.get_by_role("button", name="Preview").click()

    thumbs = page.page.locator("img.picture-thumb")
    expect(thumbs).to_have_count(2)
    # Decoded by the browser under the page's CSP: real pictures, at the sizes sent.
    sizes = thumbs.evaluate_all("images => images.map(i => [i.naturalWidth, i.naturalHeight])")
    assert sizes == [[300, 150], [1568, 784]]  # in the order of the form: chart.png first
    expect(page.page.get_by_role("img", name="Image block 2: photo.jpg")).to_be_visible()
    parts = page.page.locator("#picture-parts")
    expect(parts).to_contain_text("Picture 2 of 2 attached to this message")
    expect(parts).to_contain_text("image/jpeg · 1568×784 px")
    expect(parts).to_contain_text("never rendered here")  # the SVG's note, no block
    expect(page.page.get_by_role("checkbox", name="The model accepts pictures")).to_be_checked()
    page.shoot("chat-preview-pictures")
