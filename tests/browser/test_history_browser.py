"""Nothing lost by one click (issue 27): the Undo right after a delete, the trash, and
restoring an earlier version of a file, in a real browser, signed in and single-user."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import assert_accessible

pytestmark = pytest.mark.browser

THREAD = "history"


def test_undo_right_after_a_delete_brings_the_file_back(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"minutes.txt": b"the agenda", "other.txt": b"o"})
    page.page.goto(f"{live.url}/threads/{THREAD}")
    row = page.page.locator('tr.file-row[data-filename="minutes.txt"]')
    row.locator('[data-action="delete"]').click()
    page.page.locator('#confirm-dialog [data-role="confirm"]').click()
    expect(page.page.locator("#undo-delete")).to_contain_text("minutes.txt")
    expect(page.page.locator("tr.file-row")).to_have_count(1)
    assert live.names(THREAD) == ["other.txt"]
    expect(page.page.locator("#trash-link")).to_have_text("Trash (1)")
    assert_accessible(page.page)
    page.page.click("#undo-button")
    expect(page.page.locator("tr.file-row")).to_have_count(2)
    expect(page.page.locator("#undo-delete")).to_have_count(0)
    assert sorted(live.names(THREAD)) == ["minutes.txt", "other.txt"]
    assert live.read(THREAD, "minutes.txt") == b"the agenda"


def test_the_trash_restores_and_deletes_for_good(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"a.txt": b"a", "b.txt": b"b"})
    page.page.goto(f"{live.url}/threads/{THREAD}")
    for name in ("a.txt", "b.txt"):
        page.page.locator(f'tr.file-row[data-filename="{name}"] [data-action="delete"]').click()
        page.page.locator('#confirm-dialog [data-role="confirm"]').click()
        expect(page.page.locator("#undo-delete")).to_contain_text(name)
    page.page.click("#trash-link")
    expect(page.page.locator("tr.trash-row")).to_have_count(2)
    assert_accessible(page.page)
    page.page.locator('tr.trash-row[data-filename="a.txt"]').get_by_role(
        "button", name="Restore"
    ).click()
    expect(page.page.locator(".flash-success")).to_contain_text("Restored 1 file: a.txt")
    page.page.locator('tr.trash-row[data-filename="b.txt"]').get_by_role(
        "button", name="Delete for good"
    ).click()
    expect(page.page.locator(".empty")).to_have_text("The trash is empty.")
    assert live.names(THREAD) == ["a.txt"]


def test_restoring_an_earlier_version_from_the_preview(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"report.txt": b"first draft"})
    live.seed(THREAD, {"report.txt": b"second draft"})
    page.page.goto(f"{live.url}/threads/{THREAD}/files/uploads/report.txt")
    page.page.click("#preview-versions")
    page.page.wait_for_url(f"**/threads/{THREAD}/versions/report.txt")
    expect(page.page.locator("tr.version-row")).to_have_count(1)
    assert_accessible(page.page)
    page.page.get_by_role("button", name="Restore").click()
    expect(page.page.locator(".flash-success")).to_contain_text(
        "Restored an earlier version of report.txt"
    )
    assert live.read(THREAD, "report.txt") == b"first draft"
    # the restore is undoable: the second draft is the version now
    expect(page.page.locator("tr.version-row")).to_have_count(1)
    page.page.get_by_role("button", name="Restore").click()
    expect(page.page.locator(".flash-success")).to_be_visible()
    assert live.read(THREAD, "report.txt") == b"second draft"
