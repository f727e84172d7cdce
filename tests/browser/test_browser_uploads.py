"""Uploading in a real browser: file input, drag and drop, progress, limits, conflicts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import review_before_upload

pytestmark = pytest.mark.browser

THREAD = "browser-thread"
UPLOAD_BYTES_PER_SECOND = 384 * 1024

RECORD_PROGRESS = """
() => {
  window.__progress = [];
  const bar = document.getElementById("total-progress-bar");
  window.__progressTimer = setInterval(() => {
    if (bar.max > 1) { window.__progress.push(bar.value / bar.max); }
  }, 25);
}
"""

DROP_FILES = """
(files) => {
  const zone = document.getElementById("drop-zone");
  const transfer = new DataTransfer();
  for (const [name, size] of files) {
    transfer.items.add(new File([new Uint8Array(size).fill(65)], name, {type: "text/plain"}));
  }
  for (const type of ["dragenter", "dragover", "drop"]) {
    const init = {dataTransfer: transfer, bubbles: true, cancelable: true};
    zone.dispatchEvent(new DragEvent(type, init));
  }
}
"""


def throttle_uploads(watched: Watched) -> None:
    """Slow the page's uploads down so progress events arrive while bytes are in flight."""
    cdp = watched.context.new_cdp_session(watched.page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {
            "offline": False,
            "latency": 10,
            "downloadThroughput": -1,
            "uploadThroughput": UPLOAD_BYTES_PER_SECOND,
        },
    )


def intermediate_progress(watched: Watched) -> list[float]:
    values = watched.page.evaluate("() => window.__progress")
    return [value for value in values if 0 < value < 1]


def open_thread(watched: Watched, live: LiveServer, thread_id: str = THREAD) -> None:
    watched.page.goto(f"{live.url}/threads/{thread_id}")
    expect(watched.page.locator("#drop-zone .drop-hint")).to_be_visible()
    review_before_upload(watched.page)


def test_upload_through_file_input_shows_progress(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    page.shoot("thread-empty")
    throttle_uploads(page)
    page.page.set_input_files(
        "#file-input",
        [
            {"name": "first.txt", "mimeType": "text/plain", "buffer": b"a" * 300_000},
            {"name": "报告 second.csv", "mimeType": "text/csv", "buffer": b"x,y\n" * 60_000},
        ],
    )
    queue = page.page.locator("#upload-queue .upload-item")
    expect(queue).to_have_count(2)
    expect(queue.nth(1)).to_contain_text("234.4 KiB")  # SPEC 2.7 format, in the browser too
    page.page.evaluate(RECORD_PROGRESS)
    page.page.click("#upload-button")
    expect(page.page.locator("#cancel-button")).to_be_visible()
    page.page.wait_for_function("() => window.__progress.some(v => v > 0.2 && v < 0.9)")
    page.shoot("upload-in-progress")
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 2 file(s).")
    assert intermediate_progress(page), "the total bar moved through intermediate values"
    rows = page.page.locator("tr.file-row")
    expect(rows).to_have_count(2)
    assert live.names(THREAD) == ["first.txt", "报告 second.csv"]
    assert live.read(THREAD, "first.txt") == b"a" * 300_000
    page.shoot("thread-after-upload")


def test_drag_and_drop_upload_with_progress(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    throttle_uploads(page)
    page.page.evaluate(DROP_FILES, [["dropped.txt", 250_000], ["second drop.txt", 10]])
    expect(page.page.locator("#upload-queue .upload-item")).to_have_count(2)
    page.page.evaluate(RECORD_PROGRESS)
    page.page.click("#upload-button")
    page.page.wait_for_function(
        "() => [...document.querySelectorAll('#upload-queue progress')]"
        ".some(bar => bar.value > 0 && bar.value < bar.max)"
    )
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 2 file(s).")
    assert intermediate_progress(page)
    assert live.names(THREAD) == ["dropped.txt", "second drop.txt"]
    assert live.read(THREAD, "dropped.txt") == b"A" * 250_000


def test_cancel_stops_the_upload_and_stores_nothing(page: Watched, live: LiveServer) -> None:
    open_thread(page, live)
    throttle_uploads(page)
    page.page.evaluate(DROP_FILES, [["slow.bin", 2_000_000]])
    page.page.evaluate(RECORD_PROGRESS)
    page.page.click("#upload-button")
    page.page.wait_for_function("() => window.__progress.some(v => v > 0.05)")
    page.page.click("#cancel-button")
    expect(page.page.locator("#upload-status")).to_contain_text("Upload cancelled")
    assert live.names(THREAD) == []


def test_limit_violations_are_explained_and_nothing_is_sent(
    open_page: Callable[..., Watched], start_server: Callable[..., LiveServer], mode: str
) -> None:
    limits = {"max_files": 2, "max_file_size": 1000, "max_total_size": 1500}
    live = start_server(uploads=limits, mode=mode)
    page = open_page(server=live)
    open_thread(page, live)
    expect(page.page.locator("#upload-limits")).to_contain_text(
        "Up to 2 files per upload, 1000 B each, 1.5 KiB in total."
    )
    page.page.evaluate(
        DROP_FILES, [["ok.txt", 900], ["huge.txt", 5000], ["over-total.txt", 700], ["c.txt", 1]]
    )
    problems = page.page.locator("#upload-problems li")
    expect(problems).to_have_count(2)
    expect(problems.nth(0)).to_have_text(
        "huge.txt is 4.9 KiB, larger than the limit of 1000 B per file."
    )
    expect(problems.nth(1)).to_have_text(
        "over-total.txt would bring the total to 1.6 KiB, over the limit of 1.5 KiB per upload."
    )
    page.posts.clear()
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-problems")).to_contain_text("Nothing was sent.")
    page.page.wait_for_timeout(300)
    assert page.posts == [], "no request may leave the page"
    page.shoot("upload-limits-explained")
    # Removing the culprits makes the rest uploadable.
    page.page.get_by_role("button", name="Remove huge.txt from the upload").click()
    page.page.get_by_role("button", name="Remove over-total.txt from the upload").click()
    expect(page.page.locator("#upload-problems")).to_be_hidden()
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 2 file(s).")
    assert live.names(THREAD) == ["c.txt", "ok.txt"]


def test_existing_names_ask_replace_keep_both_or_skip(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"a.txt": b"old a", "b.txt": b"old b", "c.txt": b"old c"})
    open_thread(page, live)
    page.page.set_input_files(
        "#file-input",
        [
            {"name": name, "mimeType": "text/plain", "buffer": f"new {name}".encode()}
            for name in ("a.txt", "b.txt", "c.txt", "d.txt")
        ],
    )
    page.page.click("#upload-button")
    dialog = page.page.locator("#conflict-dialog")
    expect(dialog).to_be_visible()
    choices = dialog.locator("fieldset")
    expect(choices).to_have_count(3)
    expect(choices.locator("legend")).to_have_text(["a.txt", "b.txt", "c.txt"])
    choices.nth(1).get_by_label("Keep both").check()
    choices.nth(2).get_by_label("Skip").check()
    page.shoot("conflict-prompt")
    dialog.get_by_role("button", name="Continue").click()
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 3 file(s). Skipped: c.txt")
    assert live.names(THREAD) == ["a.txt", "b.txt", "b_1.txt", "c.txt", "d.txt"]
    assert live.read(THREAD, "a.txt") == b"new a.txt"
    assert live.read(THREAD, "b.txt") == b"old b"
    assert live.read(THREAD, "b_1.txt") == b"new b.txt"
    assert live.read(THREAD, "c.txt") == b"old c"
    expect(page.page.locator("tr.file-row")).to_have_count(5)


def test_cancelling_the_conflict_prompt_sends_nothing(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"a.txt": b"old"})
    open_thread(page, live)
    page.page.set_input_files(
        "#file-input", [{"name": "a.txt", "mimeType": "text/plain", "buffer": b"new"}]
    )
    page.page.click("#upload-button")
    page.page.locator("#conflict-dialog").get_by_role("button", name="Cancel upload").click()
    page.posts.clear()
    page.page.wait_for_timeout(200)
    assert page.posts == []
    assert live.read(THREAD, "a.txt") == b"old"
