"""What a person reads when an upload fails: a sentence of the page's language, never the
API's developer text. The failures are the server's own (a stale CSRF token, a signed-out
session, a limit the page did not know about, a dropped connection) except for the
statuses only a fault can produce (409, 429, 507, 503), whose answers are stood in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Route
from playwright.sync_api import expect

from tests.browser.helpers import ACCOUNTS
from tests.browser.helpers import SINGLE_USER
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import open_thread

pytestmark = pytest.mark.browser

THREAD = "browser-thread"
SESSION_EXPIRED = {
    "en": "Upload failed: Your session has expired. Reload the page and try again.",
    "zh": "上传失败：您的会话已过期。请刷新页面后重试。",
}
TOO_LARGE = {
    "en": "Upload failed: This is more than the server accepts in one upload. "
    "Send fewer or smaller files.",
    "zh": "上传失败：超出了服务器单次上传允许的范围。请减少文件数量或大小。",
}
LANGUAGES = {"en": "en-US", "zh": "zh-CN"}


def without_csrf_header(route: Route) -> None:
    """The request as a page whose token no longer matches its session sends it."""
    headers = {k: v for k, v in route.request.headers.items() if k.lower() != "x-csrf-token"}
    route.continue_(headers=headers)


def choose(watched: Watched, name: str, size: int) -> None:
    files = [{"name": name, "mimeType": "application/octet-stream", "buffer": b"x" * size}]
    watched.page.set_input_files("#file-input", files)


# Both scripts (upload.js, resumable.js) and both languages, each once.
@pytest.mark.parametrize(("path", "language"), (("multipart", "en"), ("tus", "zh")))
def test_a_refused_csrf_token_asks_to_reload_the_page(
    open_page: Callable[..., Watched],
    start_server: Callable[..., LiveServer],
    path: str,
    language: str,
) -> None:
    live = start_server(uploads={"resumable_threshold_bytes": 2000}, mode=ACCOUNTS)
    page = open_page(server=live, language=LANGUAGES[language])
    page.allowed_errors.append("status of 403")
    target = "**/uploads?*" if path == "multipart" else "**/uploads/tus"
    page.page.route(target, without_csrf_header)
    open_thread(page, live)
    choose(page, "notes.bin", 5000 if path == "tus" else 1000)  # tus above 2000 B here
    expect(page.page.locator("#upload-queue .upload-item.resumable")).to_have_count(
        1 if path == "tus" else 0
    )
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text(SESSION_EXPIRED[language])
    assert live.names(THREAD) == []


def test_single_user_a_refused_request_asks_to_reload_without_naming_a_session(
    open_page: Callable[..., Watched], start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """Single-user there is no session: a 403 (here: an agent swapped the thread's uploads
    folder for a link after the page loaded, which the server refuses to follow) is
    explained without one."""
    live = start_server(mode=SINGLE_USER)
    page = open_page(server=live)
    page.allowed_errors.append("status of 403")
    open_thread(page, live)
    folder = live.area_dir(THREAD, "uploads")
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir()
    folder.symlink_to(tmp_path / "elsewhere")
    choose(page, "notes.bin", 1000)
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text(
        "Upload failed: The server refused this request. Reload the page and try again."
    )
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_a_file_over_the_servers_limit_is_explained(
    open_page: Callable[..., Watched], start_server: Callable[..., LiveServer], language: str
) -> None:
    """The server's limit was lowered after the page loaded: the page's own check let the
    file through, and the server's 413 is what the person reads about."""
    live = start_server(uploads={"max_file_size": 1000}, mode=ACCOUNTS)
    page = open_page(server=live, language=LANGUAGES[language])
    page.allowed_errors.append("status of 413")

    def limits_of_before(route: Route) -> None:
        body = route.fetch().json()
        route.fulfill(json={**body, "max_file_size": 10**6, "max_total_size": 10**6})

    page.page.route("**/uploads/limits", limits_of_before)
    open_thread(page, live)
    choose(page, "big.bin", 5000)
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text(TOO_LARGE[language])
    assert live.names(THREAD) == []


def test_a_signed_out_page_asks_to_sign_in_again(
    open_page: Callable[..., Watched], start_server: Callable[..., LiveServer]
) -> None:
    live = start_server(mode=ACCOUNTS)
    page = open_page(server=live)
    page.allowed_errors.append("status of 401")
    open_thread(page, live)
    other_tab = page.context.new_page()  # the same person signs out in another tab
    other_tab.goto(f"{live.url}/threads/{THREAD}")
    other_tab.click(".account-nav button[type=submit]")
    expect(other_tab).to_have_url(f"{live.url}/login")
    choose(page, "notes.txt", 100)
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text(
        "Upload failed: You have been signed out. Reload the page to sign in again."
    )
    assert live.names(THREAD) == []


# What the page does with an answer does not depend on the mode: these run in the default one.
@pytest.mark.parametrize("mode", (ACCOUNTS,))
def test_a_lost_connection_is_named(page: Watched, live: LiveServer, mode: str) -> None:
    page.allowed_errors.append("ERR_FAILED")
    page.page.route("**/uploads?*", lambda route: route.abort())
    open_thread(page, live)
    choose(page, "notes.txt", 100)
    page.page.click("#upload-button")
    lost = "Upload failed: The connection to the server was lost. Check your network and try again."
    expect(page.page.locator("#upload-status")).to_have_text(lost)
    assert live.names(THREAD) == []


# Each status with the developer text a server or a proxy in front of it would send.
STOOD_IN = {
    409: "Name conflict: x.bin already exists",
    429: "Too many conversions queued; retry after 30 s",
    503: "The database is unavailable; try again shortly",
    507: "Insufficient storage: the disk is full",
    500: "Internal Server Error",
}
SENTENCES = {
    409: "Someone else changed the same file at the same moment. Reload the page and try again.",
    429: "The server is busy. Wait a moment and try again.",
    503: "The server is unavailable for the moment. Try again shortly.",
    507: "The server is out of storage space; nothing was stored. "
    "Try again later or tell the administrator.",
    500: "Something went wrong on the server. Try again, and tell the administrator if it "
    "keeps happening.",
}


@pytest.mark.parametrize("mode", (ACCOUNTS,))
def test_every_failure_a_person_can_act_on_has_its_sentence(
    page: Watched, live: LiveServer, mode: str
) -> None:
    page.allowed_errors.extend(f"status of {status}" for status in STOOD_IN)
    answer: dict[str, int] = {}

    def stand_in(route: Route) -> None:
        status = answer["status"]
        route.fulfill(status=status, json={"detail": STOOD_IN[status]})

    page.page.route("**/uploads?*", stand_in)
    open_thread(page, live)
    choose(page, "notes.txt", 100)
    for status in STOOD_IN:
        answer["status"] = status
        page.page.click("#upload-button")  # a failed upload keeps its queue
        expect(page.page.locator("#upload-status")).to_have_text(
            f"Upload failed: {SENTENCES[status]}"
        )
    page.page.unroute("**/uploads?*")
    page.page.click("#upload-button")
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).")
    assert live.names(THREAD) == ["notes.txt"]
