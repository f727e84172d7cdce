"""Large files in the file manager go through tus: pause and resume, a page reload, a server
restart between two chunks; the file ends up stored and listed once (SPEC 8)."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import uploads_dir
from playwright.sync_api import expect

from deerflow_web.storage.paths import is_staging_name
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.live_server import start_server

pytestmark = pytest.mark.browser

THREAD = "big-files"
MIB = 1024 * 1024
SIZE = 40 * MIB
# Lost connections while the server is down are expected, and logged by Chromium.
NETWORK_ERRORS = ["ERR_CONNECTION_REFUSED", "ERR_CONNECTION_RESET", "ERR_EMPTY_RESPONSE"]


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


def staged_bytes(base_dir: Path) -> int:
    """What the server holds of the upload in progress (0 before it has begun)."""
    folder = uploads_dir(base_dir, THREAD, None)  # the live server runs single-user
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
    watched.page.set_input_files("#file-input", str(path))
    expect(watched.page.locator("#upload-queue .upload-item.resumable")).to_have_count(1)
    watched.page.click("#upload-button")


def assert_stored_once(watched: Watched, base_dir: Path, path: Path) -> None:
    page = watched.page
    expect(page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).", timeout=90_000)
    bar = page.locator("#total-progress-bar")
    assert bar.evaluate("bar => bar.value / bar.max") == 1
    assert page.locator("#total-progress-text").text_content() == "40 MiB of 40 MiB"
    rows = page.locator("#files-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(path.name)
    stored = uploads_dir(base_dir, THREAD, None) / path.name  # the live server is single-user
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
    assert [n for n in os.listdir(stored.parent) if is_staging_name(n)] == []
    creations = [u for u in watched.posts if u.endswith(f"/threads/{THREAD}/uploads/tus")]
    assert len(creations) == 1  # resumed, never started again
    assert not any(u.endswith("/uploads") or "/upload?" in u for u in watched.posts)


def test_large_upload_is_paused_and_resumed(
    page: Watched, live: LiveServer, big_file: Path, base_dir: Path
) -> None:
    throttle(page, 12 * MIB)
    choose_and_send(page, live.url, big_file)
    row = page.page.locator("#upload-queue .upload-item.resumable")
    expect(row.locator(".transfer")).to_have_text(re.compile(r"MiB of 40 MiB · .+/s · .+ left"))
    wait_until(lambda: staged_bytes(base_dir) >= 10 * MIB)
    row.locator(".pause").click()
    expect(row.locator(".pause")).to_have_text("Resume")
    expect(row.locator(".transfer")).to_contain_text("paused")
    time.sleep(0.5)  # the aborted chunk's last bytes land
    held = staged_bytes(base_dir)
    shown = row.locator("progress").evaluate("bar => bar.value")
    page.shoot("resumable-paused")
    time.sleep(1.5)
    assert staged_bytes(base_dir) == held  # paused means no bytes move
    assert row.locator("progress").evaluate("bar => bar.value") == shown
    assert 10 * MIB <= held < SIZE

    row.locator(".pause").click()
    expect(row.locator(".pause")).to_have_text("Pause")
    assert_stored_once(page, base_dir, big_file)
    page.shoot("resumable-done")


def test_upload_resumes_after_a_page_reload(
    page: Watched, live: LiveServer, big_file: Path, base_dir: Path
) -> None:
    throttle(page, 12 * MIB)
    choose_and_send(page, live.url, big_file)
    wait_until(lambda: staged_bytes(base_dir) >= 9 * MIB)
    page.page.reload()
    time.sleep(0.5)
    held = staged_bytes(base_dir)
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
    stored = uploads_dir(base_dir, THREAD, None) / big_file.name  # single-user server
    assert stored.read_bytes() == big_file.read_bytes()


@pytest.fixture
def gunicorn(base_dir: Path):
    """A real gunicorn server that the test can kill and start again on the same port."""
    with start_server(base_dir, single_user=True) as server:
        yield server


def test_upload_survives_a_server_restart_between_two_chunks(
    page: Watched, gunicorn, big_file: Path, base_dir: Path
) -> None:
    page.allowed_errors.extend(NETWORK_ERRORS)
    throttle(page, 12 * MIB)
    choose_and_send(page, gunicorn.url, big_file)
    wait_until(lambda: staged_bytes(base_dir) >= 8 * MIB)  # the first chunk is stored
    gunicorn.kill()
    held = staged_bytes(base_dir)
    row = page.page.locator("#upload-queue .upload-item.resumable")
    expect(row.locator(".transfer")).to_have_text("Connection lost; retrying…", timeout=20_000)
    gunicorn.start()
    assert_stored_once(page, base_dir, big_file)
    assert held >= 8 * MIB
