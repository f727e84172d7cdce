"""The file manager as a person uses it every day: attaching without a second click,
dropping anywhere, pasting, and every page free of serious accessibility faults."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import assert_accessible
from tests.browser.helpers import gradient_png

pytestmark = pytest.mark.browser

THREAD = "everyday"

DROP_ON = """
([selector, files]) => {
  const target = document.querySelector(selector);
  const transfer = new DataTransfer();
  for (const [name, text] of files) {
    transfer.items.add(new File([text], name, {type: "text/plain"}));
  }
  for (const type of ["dragenter", "dragover", "drop"]) {
    const init = {dataTransfer: transfer, bubbles: true, cancelable: true};
    target.dispatchEvent(new DragEvent(type, init));
  }
}
"""

PASTE_IMAGE = """
(bytes) => {
  const transfer = new DataTransfer();
  transfer.items.add(new File([new Uint8Array(bytes)], "image.png", {type: "image/png"}));
  const init = {clipboardData: transfer, bubbles: true, cancelable: true};
  document.body.dispatchEvent(new ClipboardEvent("paste", init));
}
"""


def open_thread(watched: Watched, live: LiveServer) -> None:
    watched.page.goto(f"{live.url}/threads/{THREAD}")
    expect(watched.page.locator("#drop-zone .drop-hint")).to_be_visible()


def test_files_upload_as_soon_as_they_are_picked(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    expect(page.page.locator("#upload-button")).to_be_hidden()  # no second click needed
    page.page.set_input_files(
        "#file-input",
        [
            {"name": "minutes.txt", "mimeType": "text/plain", "buffer": b"agenda"},
            {"name": "预算.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"},
        ],
    )
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 2 file(s).")
    expect(page.page.locator("tr.file-row")).to_have_count(2)
    assert sorted(live.names(THREAD)) == ["minutes.txt", "预算.csv"]
    assert live.read(THREAD, "预算.csv") == b"a,b\n1,2\n"


def test_review_first_is_a_remembered_choice(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    page.page.check("#review-first")
    page.page.reload()
    expect(page.page.locator("#review-first")).to_be_checked()
    page.page.set_input_files(
        "#file-input", [{"name": "draft.txt", "mimeType": "text/plain", "buffer": b"d"}]
    )
    expect(page.page.locator("#upload-queue .upload-item")).to_have_count(1)
    expect(page.page.locator("#upload-queue .upload-item .name")).to_have_text("draft.txt")
    assert live.names(THREAD) == []  # waiting for the person
    page.page.click("#upload-button")
    expect(page.page.locator("tr.file-row")).to_have_count(1)
    assert live.names(THREAD) == ["draft.txt"]


def test_a_drop_on_the_file_list_uploads(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"already.txt": b"here"})
    open_thread(page, live)
    page.page.evaluate(DROP_ON, ["#files-table", [["dropped on the list.txt", "dropped"]]])
    expect(page.page.locator("tr.file-row")).to_have_count(2)
    assert live.read(THREAD, "dropped on the list.txt") == b"dropped"


def test_a_pasted_image_is_uploaded_with_a_dated_name(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    png = gradient_png()
    page.page.evaluate(PASTE_IMAGE, list(png))
    expect(page.page.locator("tr.file-row")).to_have_count(1)
    (name,) = live.names(THREAD)
    assert name.startswith("pasted-") and name.endswith(".png")
    assert live.read(THREAD, name) == png


def test_text_pasted_into_the_filter_stays_text(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"a.txt": b"a"})
    open_thread(page, live)
    page.page.fill("#filter-name", "")
    page.page.focus("#filter-name")
    page.page.keyboard.insert_text("a.t")
    expect(page.page.locator("#filter-name")).to_have_value("a.t")
    assert live.names(THREAD) == ["a.txt"]


PAGES = [
    "/",
    f"/threads/{THREAD}",
    f"/threads/{THREAD}/chat",
    f"/threads/{THREAD}/files/uploads/notes.md",
    f"/threads/{THREAD}/files/uploads/picture.png",
    f"/threads/{THREAD}/files/uploads/plain.txt",
    f"/threads/{THREAD}/browse/outputs",
    f"/threads/{THREAD}/rename?filename=plain.txt",
    f"/threads/{THREAD}/delete?filenames=plain.txt",
]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_serious_on_any_page(
    open_page: Callable[..., Watched], live: LiveServer, scheme: str
) -> None:
    live.seed(
        THREAD,
        {"notes.md": b"# Notes\n\nSome *text*.", "picture.png": gradient_png(), "plain.txt": b"x"},
    )
    watched = open_page(server=live)
    watched.page.emulate_media(color_scheme=scheme)
    pages = PAGES + (["/account", "/admin"] if live.account else [])
    for path in pages:
        watched.page.goto(f"{live.url}{path}")
        assert_accessible(watched.page)
