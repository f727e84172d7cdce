"""Large files in the file manager go through tus: pause and resume, a page reload, a server
restart between two chunks; the file ends up stored and listed once (SPEC 8). Each runs
with accounts on (signed in: every tus request carries the session and the CSRF header)
and single-user."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from deerflow_web.storage.paths import is_staging_name
from tests.browser.helpers import ACCOUNTS
from tests.browser.helpers import BrowserAccount
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import create_account
from tests.browser.helpers import review_before_upload
from tests.browser.helpers import sign_in
from tests.browser.helpers import skip_unless_accounts_can_run
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.support.live_server import start_server

pytestmark = pytest.mark.browser

THREAD = "big-files"
MIB = 1024 * 1024
SIZE = 40 * MIB
# Lost connections while the server is down are expected, and logged by Chromium (which
# of these it names depends on the moment the socket went: before, during or after connect).
NETWORK_ERRORS = [
    "ERR_CONNECTION_REFUSED",
    "ERR_CONNECTION_RESET",
    "ERR_EMPTY_RESPONSE",
    "ERR_SOCKET_NOT_CONNECTED",
]


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "recording 录音.bin"
    with path.open("wb") as handle:
        for _ in range(SIZE // MIB):
            handle.write(os.urandom(MIB))
    return path


def throttle(watched: Watched, bytes_per_second: int) -> None:
    """Slow the page's uploads so a person (or a test) can act between chunks."""
    cdp = watched.context.new_cdp_session(watched.page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {
            "offline": False,
            "latency": 5,
            "downloadThroughput": -1,
            "uploadThroughput": bytes_per_second,
        },
    )


def staged_bytes(folder: Path) -> int:
    """What the server holds of the upload in progress (0 before it has begun)."""
    if not folder.exists():
        return 0
    sizes = [(folder / n).stat().st_size for n in os.listdir(folder) if is_staging_name(n)]
    return max(sizes, default=0)


def wait_until(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def choose_and_send(watched: Watched, url: str, path: Path) -> None:
    watched.page.goto(f"{url}/threads/{THREAD}")
    expect(watched.page.locator("#drop-zone .drop-hint")).to_be_visible()
    review_before_upload(watched.page)
    watched.page.set_input_files("#file-input", str(path))
    expect(watched.page.locator("#upload-queue .upload-item.resumable")).to_have_count(1)
    watched.page.click("#upload-button")


def assert_stored_once(watched: Watched, folder: Path, path: Path) -> None:
    page = watched.page
    expect(page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).", timeout=90_000)
    bar = page.locator("#total-progress-bar")
    assert bar.evaluate("bar => bar.value / bar.max") == 1
    assert page.locator("#total-progress-text").text_content() == "40 MiB of 40 MiB"
    rows = page.locator("#files-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(path.name)
    stored = folder / path.name
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
    assert [n for n in os.listdir(stored.parent) if is_staging_name(n)] == []
    creations = [u for u in watched.posts if u.endswith(f"/threads/{THREAD}/uploads/tus")]
    assert len(creations) == 1  # resumed, never started again
    assert not any(u.endswith("/uploads") or "/upload?" in u for u in watched.posts)


def test_large_upload_is_paused_and_resumed(
    page: Watched, live: LiveServer, big_file: Path
) -> None:
    folder = live.uploads_dir(THREAD)
    throttle(page, 12 * MIB)
    choose_and_send(page, live.url, big_file)
    row = page.page.locator("#upload-queue .upload-item.resumable")
    expect(row.locator(".transfer")).to_have_text(re.compile(r"MiB of 40 MiB · .+/s · .+ left"))
    wait_until(lambda: staged_bytes(folder) >= 10 * MIB)
    row.locator(".pause").click()
    expect(row.locator(".pause")).to_have_text("Resume")
    expect(row.locator(".transfer")).to_contain_text("paused")
    time.sleep(0.5)  # the aborted chunk's last bytes land
    held = staged_bytes(folder)
    shown = row.locator("progress").evaluate("bar => bar.value")
    page.shoot("resumable-paused")
    time.sleep(1.5)
    assert staged_bytes(folder) == held  # paused means no bytes move
    assert row.locator("progress").evaluate("bar => bar.value") == shown
    assert 10 * MIB <= held < SIZE

    row.locator(".pause").click()
    expect(row.locator(".pause")).to_have_text("Pause")
    assert_stored_once(page, folder, big_file)
    page.shoot("resumable-done")


def test_upload_resumes_after_a_page_reload(
    page: Watched, live: LiveServer, big_file: Path
) -> None:
    folder = live.uploads_dir(THREAD)
    throttle(page, 12 * MIB)
    choose_and_send(page, live.url, big_file)
    wait_until(lambda: staged_bytes(folder) >= 9 * MIB)
    page.page.reload()
    time.sleep(0.5)
    held = staged_bytes(folder)
    patches: list[str] = []
    page.page.on(
        "request",
        lambda request: (
            patches.append(request.headers.get("upload-offset", ""))
            if request.method == "PATCH"
            else None
        ),
    )
    page.posts.clear()
    choose_and_send(page, live.url, big_file)  # the same file chosen again
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).", timeout=90_000)
    assert patches and int(patches[0]) == held > 0  # went on from the server's offset
    assert not [u for u in page.posts if u.endswith("/uploads/tus")]
    rows = page.page.locator("#files-table tbody tr")
    expect(rows).to_have_count(1)
    stored = folder / big_file.name
    assert stored.read_bytes() == big_file.read_bytes()


@pytest.fixture
def gunicorn(base_dir: Path, make_app: Callable[..., Any], mode: str):
    """A real gunicorn server that the test can kill and start again on the same port;
    with accounts on, over a data dir holding the account the page signs in as."""
    skip_unless_accounts_can_run(mode)
    account = None
    if mode == ACCOUNTS:
        account = BrowserAccount()
        create_account(make_app(auth={"enabled": True}, test_user=False), account)
    with start_server(base_dir, single_user=mode != ACCOUNTS) as server:
        yield server, account


def test_upload_survives_a_server_restart_between_two_chunks(
    open_page: Callable[..., Watched], gunicorn, big_file: Path, base_dir: Path
) -> None:
    """With accounts on, the session and its CSRF cookie outlive the restart too."""
    server, account = gunicorn
    page = open_page()
    if account is not None:
        sign_in(page.page, server.url, account)
        page.signed_in = True
        page.posts.clear()
    folder = uploads_dir(base_dir, THREAD, None if account is None else account.user_id)
    page.allowed_errors.extend(NETWORK_ERRORS)
    throttle(page, 12 * MIB)
    choose_and_send(page, server.url, big_file)
    wait_until(lambda: staged_bytes(folder) >= 8 * MIB)  # the first chunk is stored
    server.kill()
    held = staged_bytes(folder)
    row = page.page.locator("#upload-queue .upload-item.resumable")
    expect(row.locator(".transfer")).to_have_text("Connection lost; retrying…", timeout=20_000)
    server.start()
    assert_stored_once(page, folder, big_file)
    assert held >= 8 * MIB


def test_signed_in_upload_of_20_mib_goes_through_tus_and_is_stored_intact(
    open_page: Callable[..., Watched], start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """The default mode: every tus request a signed-in page sends passes the CSRF check, and
    the stored bytes and their recorded sha256 are the chosen file's."""
    live = start_server(mode=ACCOUNTS)
    page = open_page(server=live)
    path = tmp_path / "scan 扫描.bin"
    path.write_bytes(os.urandom(20 * MIB))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    statuses: list[tuple[str, int]] = []
    page.page.on(
        "response",
        lambda response: (
            statuses.append((response.request.method, response.status))
            if "/uploads/tus" in response.url
            else None
        ),
    )
    choose_and_send(page, live.url, path)
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).", timeout=90_000)
    assert [method for method, _ in statuses] == ["POST", "PATCH", "PATCH", "PATCH"]  # 8 MiB chunks
    assert all(status < 300 for _, status in statuses), statuses
    stored = live.uploads_dir(THREAD) / path.name
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
    (record,) = live.service.list_uploads(thread_ref(THREAD, live.user_id))
    assert (record.filename, record.size, record.sha256) == (path.name, 20 * MIB, digest)
    assert not any(u.endswith("/uploads") or "/upload?" in u for u in page.posts)
