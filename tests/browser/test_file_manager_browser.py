"""The file manager as a person uses it every day: attaching without a second click,
dropping anywhere, pasting, and every page free of serious accessibility faults."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import assert_accessible
from tests.browser.helpers import gradient_png

pytestmark = pytest.mark.browser

THREAD = "everyday"
LINK_GONE = "This share link does not work"  # unknown, expired and revoked alike

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
    watched.page.goto(f"{live.url}/api/docs")
    watched.page.wait_for_selector("#swagger-ui .opblock")
    assert_accessible(watched.page, exclude=("#swagger-ui",))  # the vendored UI's own markup
    watched.allowed_errors.append("404")
    watched.page.goto(f"{live.url}/threads/{THREAD}/files/uploads/missing.txt")
    assert_accessible(watched.page)  # an error page
    if live.account:
        stranger = open_page()
        stranger.page.emulate_media(color_scheme=scheme)
        stranger.page.goto(f"{live.url}/login")
        assert_accessible(stranger.page)


ZIP_FILES = {
    "季度报告.txt": "第一季度：收入增长。\n".encode() * 50,
    "notes.md": b"# Notes\n",
    "data.bin": bytes(range(256)) * 40,
}


def test_three_selected_files_download_as_one_zip_byte_for_byte(
    page: Watched, live: LiveServer
) -> None:
    live.seed(THREAD, {**ZIP_FILES, "left out.txt": b"not selected"})
    open_thread(page, live)
    for name in ZIP_FILES:
        page.page.locator(f'tr.file-row[data-filename="{name}"] input.select-file').check()
    expect(page.page.locator("#bulk-zip")).to_be_enabled()
    with page.page.expect_download() as info:
        page.page.click("#bulk-zip")
    url = info.value.url
    response = page.context.request.get(url)  # the page's own cookies: the same user
    assert response.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(response.body())) as archive:
        assert sorted(archive.namelist()) == sorted(ZIP_FILES)
        for info_ in archive.infolist():
            assert archive.read(info_.filename) == ZIP_FILES[info_.filename]
        assert archive.getinfo("季度报告.txt").flag_bits & 0x800  # the UTF-8 name flag


def create_share_link(watched: Watched, live: LiveServer, name: str, password: str = "") -> str:
    """Select one file, open the share box and create a link; the URL shown once."""
    open_thread(watched, live)
    watched.page.locator(f'tr.file-row[data-filename="{name}"] input.select-file').check()
    watched.page.click("#share-box summary")
    watched.page.select_option("#share-hours", "1")
    if password:
        watched.page.fill("#share-password", password)
    watched.page.click("#share-create")
    url = watched.page.locator("#share-url").input_value()
    assert_accessible(watched.page)
    return url


def test_a_share_link_opens_in_a_fresh_browser_until_revoked(
    page: Watched, open_page: Callable[..., Watched], live: LiveServer
) -> None:
    live.seed(THREAD, {"handout.txt": b"for the meeting", "private.txt": b"mine"})
    url = create_share_link(page, live, "handout.txt")
    visitor = open_page()  # no account, no cookie of the owner
    visitor.page.goto(url)
    expect(visitor.page.locator(".share-files li")).to_have_count(1)
    expect(visitor.page.locator(".share-files")).to_contain_text("handout.txt")
    assert_accessible(visitor.page)
    file_url = visitor.page.locator(".share-files a", has_text="Download").get_attribute("href")
    assert visitor.context.request.get(f"{live.url}{file_url}").body() == b"for the meeting"
    assert "private.txt" not in visitor.page.content()

    page.page.goto(f"{live.url}/threads/{THREAD}")
    row = page.page.locator("tr.share-row")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("active")
    row.get_by_role("button", name="Revoke").click()
    expect(page.page.locator("tr.share-row")).to_contain_text("revoked")

    visitor.allowed_errors.append("404")
    response = visitor.page.goto(url)
    assert response is not None and response.status == 404
    expect(visitor.page.locator(".error-message")).to_contain_text(LINK_GONE)
    assert visitor.context.request.get(f"{live.url}{file_url}").status == 404


def test_a_password_link_asks_first_and_ends_when_it_expires(
    page: Watched, open_page: Callable[..., Watched], live: LiveServer
) -> None:
    live.seed(THREAD, {"secret plan.txt": b"step one"})
    url = create_share_link(page, live, "secret plan.txt", password="correct horse")
    visitor = open_page()
    visitor.page.goto(url)
    expect(visitor.page.locator("#share-password")).to_be_visible()
    assert "secret plan.txt" not in visitor.page.content()
    assert_accessible(visitor.page)
    visitor.allowed_errors.append("403")
    visitor.page.fill("#share-password", "wrong")
    visitor.page.click(".share-unlock button[type=submit]")
    expect(visitor.page.locator(".share-unlock .flash-error")).to_have_text(
        "That password is not right."
    )
    visitor.page.fill("#share-password", "correct horse")
    visitor.page.click(".share-unlock button[type=submit]")
    expect(visitor.page.locator(".share-files")).to_contain_text("secret plan.txt")

    stranger = open_page()  # the link alone is not enough
    stranger.page.goto(url)
    expect(stranger.page.locator("#share-password")).to_be_visible()

    links = live.app.extensions[EXTENSION_KEY].share_links
    real_clock = links._clock
    links._clock = lambda: real_clock() + 3601  # the hour it was made for has passed
    visitor.allowed_errors.append("404")
    response = visitor.page.goto(url)
    assert response is not None and response.status == 404
    expect(visitor.page.locator(".error-message")).to_contain_text(LINK_GONE)


def expect_names(watched: Watched, names: list[str]) -> None:
    """The list shows exactly `names`, in that order, once the page that shows them is in
    (a click on a column starts a navigation; reading the rows at once can catch the old
    page, or none)."""
    rows = watched.page.locator("tr.file-row")
    expect(rows).to_have_count(len(names))
    for index, name in enumerate(names):
        expect(rows.nth(index)).to_have_attribute("data-filename", name)


def test_natural_sort_and_the_chosen_order_survive_a_reload(
    page: Watched, live: LiveServer
) -> None:
    live.seed(THREAD, {"bulk-10.txt": b"x" * 10, "bulk-2.txt": b"x" * 300, "bulk-1.txt": b"x"})
    open_thread(page, live)
    expect_names(page, ["bulk-1.txt", "bulk-2.txt", "bulk-10.txt"])
    page.page.get_by_role("link", name="Size", exact=True).click()
    expect_names(page, ["bulk-1.txt", "bulk-10.txt", "bulk-2.txt"])  # smallest first
    page.page.get_by_role("link", name="Size", exact=True).click()
    expect_names(page, ["bulk-2.txt", "bulk-10.txt", "bulk-1.txt"])  # then largest first
    page.page.goto(f"{live.url}/threads/{THREAD}")  # a plain URL: the choice is kept
    expect_names(page, ["bulk-2.txt", "bulk-10.txt", "bulk-1.txt"])
    expect(page.page.locator('th[aria-sort="descending"]')).to_contain_text("Size")
    page.page.get_by_role("link", name="Name", exact=True).click()  # back to the default, kept too
    expect(page.page.locator('th[aria-sort="ascending"]')).to_contain_text("Name")
    page.page.reload()
    expect_names(page, ["bulk-1.txt", "bulk-2.txt", "bulk-10.txt"])


def test_the_grid_shows_thumbnails_and_is_remembered(page: Watched, live: LiveServer) -> None:
    live.seed(
        THREAD,
        {
            "photo.png": gradient_png(300, 200),
            "drawing.svg": b"<svg xmlns='http://www.w3.org/2000/svg'/>",
            "a.txt": b"a",
        },
    )
    open_thread(page, live)
    page.page.click("#view-grid")
    expect(page.page.locator("#files-table.view-grid")).to_be_visible()
    thumb = page.page.locator('tr[data-filename="photo.png"] img.thumb')
    expect(thumb).to_be_visible()
    page.page.wait_for_function(
        "img => img.complete && img.naturalWidth > 0", arg=thumb.element_handle()
    )
    assert thumb.evaluate("img => img.naturalWidth") == 300
    src = thumb.get_attribute("src")
    response = page.context.request.get(f"{live.url}{src}")
    assert response.headers["content-type"] == "image/webp"
    assert page.page.locator('tr[data-filename="drawing.svg"] img').count() == 0  # never SVG
    assert_accessible(page.page)
    page.shoot("thread-grid")
    page.page.goto(f"{live.url}/threads/{THREAD}")
    expect(page.page.locator("#files-table.view-grid")).to_be_visible()
    page.page.click("#view-list")
    expect(page.page.locator("#files-table.view-grid")).to_have_count(0)


def test_each_keyboard_shortcut(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"alpha.txt": b"a", "beta.txt": b"b", "gamma.txt": b"c"})
    open_thread(page, live)
    keys = page.page.keyboard
    keys.press("?")
    expect(page.page.locator("#shortcuts-dialog")).to_be_visible()
    assert_accessible(page.page)
    keys.press("Escape")
    expect(page.page.locator("#shortcuts-dialog")).to_be_hidden()

    keys.press("/")
    expect(page.page.locator("#filter-name")).to_be_focused()
    keys.type("?/")  # inside a field the keys are text, not shortcuts
    expect(page.page.locator("#filter-name")).to_have_value("?/")
    expect(page.page.locator("#shortcuts-dialog")).to_be_hidden()
    page.page.fill("#filter-name", "")
    page.page.locator("#filter-name").blur()

    keys.press("ArrowDown")
    keys.press("ArrowDown")
    expect(page.page.locator("tr.file-row.cursor")).to_have_attribute("data-filename", "beta.txt")
    keys.press("ArrowUp")
    expect(page.page.locator("tr.file-row.cursor")).to_have_attribute("data-filename", "alpha.txt")

    keys.press("F2")
    expect(page.page.locator("#rename-dialog")).to_be_visible()
    page.page.fill("#rename-dialog-name", "gamma.txt")  # taken: the dialog stays open
    page.page.click("#rename-dialog button[type=submit]")
    page.allowed_errors.append("409")
    expect(page.page.locator('#rename-dialog [data-role="error"]')).to_contain_text(
        "already exists"
    )
    expect(page.page.locator("#rename-dialog")).to_be_visible()
    page.page.fill("#rename-dialog-name", "first.txt")
    page.page.click("#rename-dialog button[type=submit]")
    expect(page.page.locator("#rename-dialog")).to_be_hidden()
    expect(page.page.locator('tr[data-filename="first.txt"]')).to_have_count(1)
    assert sorted(live.names(THREAD)) == ["beta.txt", "first.txt", "gamma.txt"]

    page.page.locator("body").click(position={"x": 5, "y": 5})
    keys.press("ArrowDown")
    keys.press("ArrowDown")  # beta.txt (first.txt sorts after it)
    keys.press("Delete")
    dialog = page.page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator('[data-role="names"]')).to_have_text("first.txt")
    dialog.locator('[data-role="confirm"]').click()
    expect(page.page.locator(".flash-success")).to_contain_text("Deleted 1 file")
    expect(page.page.locator("tr.file-row")).to_have_count(2)
    expect(page.page.locator("#select-all")).to_be_visible()  # the reloaded page's script ran
    assert sorted(live.names(THREAD)) == ["beta.txt", "gamma.txt"]

    keys.press("ArrowDown")
    keys.press("Enter")
    page.page.wait_for_url("**/files/uploads/beta.txt")


def test_the_preview_has_previous_next_and_the_file_actions(
    page: Watched, live: LiveServer
) -> None:
    live.seed(THREAD, {"bulk-1.txt": b"1", "bulk-2.txt": b"2", "bulk-10.txt": b"10"})
    page.page.goto(f"{live.url}/threads/{THREAD}/files/uploads/bulk-2.txt")
    expect(page.page.locator("#previous-file")).to_contain_text("bulk-1.txt")
    page.page.click("#next-file")
    page.page.wait_for_url("**/uploads/bulk-10.txt")
    expect(page.page.locator("#next-file")).to_have_count(0)
    page.page.click("#previous-file")
    page.page.wait_for_url("**/uploads/bulk-2.txt")
    expect(page.page.locator("#preview-rename")).to_be_visible()
    expect(page.page.locator("#preview-delete")).to_be_visible()
    assert_accessible(page.page)
    page.page.click("#preview-delete")
    page.page.get_by_role("button", name="Delete").click()
    expect(page.page.locator("tr.file-row")).to_have_count(2)


def test_dark_mode_follows_the_system_and_the_toggle(
    open_page: Callable[..., Watched], live: LiveServer
) -> None:
    live.seed(THREAD, {"a.txt": b"a", "photo.png": gradient_png()})
    watched = open_page(server=live)
    watched.page.emulate_media(color_scheme="dark")
    open_thread(watched, live)
    background = "() => getComputedStyle(document.documentElement).backgroundColor"
    dark = watched.page.evaluate(background)
    assert dark == "rgb(18, 22, 27)"
    assert_accessible(watched.page)
    watched.shoot("thread-dark")
    watched.page.click("#theme-toggle")  # light, whatever the system says
    assert watched.page.evaluate(background) == "rgb(246, 247, 249)"
    watched.page.reload()
    assert watched.page.evaluate(background) == "rgb(246, 247, 249)"
    expect(watched.page.locator("#theme-toggle")).to_have_attribute("aria-pressed", "false")
    watched.page.click("#theme-toggle")
    assert watched.page.evaluate(background) == dark
    assert_accessible(watched.page)


def test_at_phone_width_the_list_comes_first_and_rows_are_compact(
    open_page: Callable[..., Watched], live: LiveServer
) -> None:
    live.seed(THREAD, {f"file-{n}.txt": b"x" * n for n in range(1, 6)})
    watched = open_page(server=live, width=390)
    watched.page.set_viewport_size({"width": 390, "height": 844})
    open_thread(watched, live)
    watched.shoot("thread-phone-before", full_page=True)
    header = watched.page.locator(".site-header").bounding_box()
    assert header is not None and header["height"] <= 60
    first = watched.page.locator("tr.file-row").first.bounding_box()
    assert first is not None and first["y"] + first["height"] < 844  # above the fold
    assert first["height"] <= 64
    upload = watched.page.locator(".upload-panel").bounding_box()
    assert upload is not None and upload["y"] > first["y"]
    assert watched.page.evaluate("document.documentElement.scrollWidth") <= 390
    row = watched.page.locator("tr.file-row").first
    expect(row.locator("a.action").first).to_be_hidden()
    row.locator(".row-menu-toggle").click()
    expect(row.get_by_role("link", name="Download")).to_be_visible()
    small = watched.page.evaluate(
        """() => [...document.querySelectorAll('a, button, input, select, summary')]
            .filter(el => el.offsetParent !== null && !el.closest('.visually-hidden')
                    && !el.closest('p, li, td.name-cell, .hint'))
            .map(el => [el, el.getBoundingClientRect()])
            .filter(([el, box]) => box.width > 0 && (box.width < 24 || box.height < 24))
            .map(([el, box]) => el.outerHTML.slice(0, 80) + ` ${box.width}x${box.height}`)"""
    )
    assert small == []
    assert_accessible(watched.page)
    watched.shoot("thread-phone", full_page=False)
    watched.page.emulate_media(color_scheme="dark")
    assert_accessible(watched.page)
    watched.shoot("thread-phone-dark", full_page=False)


def test_typing_at_in_the_composer_attaches_a_file(page: Watched, live: LiveServer) -> None:
    live.seed(THREAD, {"budget-2026.xlsx": b"x", "notes.txt": b"n", "notes-old.txt": b"o"})
    page.page.goto(f"{live.url}/threads/{THREAD}/chat")
    message = page.page.locator("#compose-form textarea[name='message']")
    message.click()
    page.page.keyboard.type("Compare @note")
    options = page.page.locator("#mention-list [role=option]")
    expect(options).to_have_text(["notes-old.txt", "notes.txt"])
    assert_accessible(page.page)
    page.page.keyboard.press("ArrowDown")
    expect(options.nth(1)).to_have_attribute("aria-selected", "true")
    page.page.keyboard.press("Enter")
    expect(page.page.locator("#mention-list")).to_be_hidden()
    expect(message).to_have_value("Compare")
    expect(page.page.locator("input[name=attach][value='notes.txt']")).to_be_checked()
    expect(page.page.locator("input[name=attach][value='notes-old.txt']")).not_to_be_checked()
    page.page.keyboard.type(" with @zzz")
    expect(page.page.locator("#mention-list")).to_be_hidden()  # nothing matches
    page.page.keyboard.press("Enter")  # an ordinary line break, no file chosen
    expect(message).to_have_value("Compare with @zzz\n")


def test_at_1280_px_the_actions_stay_on_one_line_and_the_list_fits(
    page: Watched, live: LiveServer, tmp_path
) -> None:
    from tests.support.documents import make_docx

    live.seed(
        THREAD,
        {
            "quarterly report for the board.docx": make_docx(tmp_path / "r.docx").read_bytes(),
            "photo.png": gradient_png(),
        },
    )
    open_thread(page, live)
    expect(page.page.get_by_role("button", name="Convert to Markdown quarterly")).to_be_visible()
    wrap = page.page.evaluate(
        "() => { const w = document.querySelector('.table-wrap');"
        " return [w.scrollWidth, w.clientWidth]; }"
    )
    assert wrap[0] <= wrap[1], "the list fits its panel"
    boxes = (
        page.page.locator("tr.file-row")
        .first.locator("td.actions .action")
        .evaluate_all(
            "links => links.filter(link => link.offsetParent).map(link => {"
            " const box = link.getBoundingClientRect();"
            " return [Math.round(box.top), Math.round(box.bottom)]; })"
        )
    )
    # One line: every action overlaps every other vertically (a button is taller than a
    # link beside it, so their tops differ by a few pixels; a wrapped one would not overlap).
    assert len(boxes) >= 4 and max(top for top, _ in boxes) < min(bottom for _, bottom in boxes), (
        f"one line of actions: {boxes}"
    )
