"""Accounts in a real browser: first-run set-up, sign in and out, uploads, tokens, isolation."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import ACCOUNTS
from tests.browser.helpers import RECORD_PROGRESS
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import intermediate_progress
from tests.browser.helpers import review_before_upload
from tests.browser.helpers import throttle_uploads
from tests.helpers import needs_auth

pytestmark = [pytest.mark.browser, needs_auth]

THREAD = "team-notes"
ADMIN_EMAIL = "admin@example.com"
ADMIN_PASSWORD = "admin browser password"


def set_up_admin(watched: Watched, live: LiveServer) -> None:
    """A fresh install: any page leads to /setup, which creates the admin and signs in."""
    page = watched.page
    page.goto(f"{live.url}/threads/{THREAD}")
    expect(page).to_have_url(f"{live.url}/setup")
    watched.shoot("accounts-setup")
    page.fill("#email", ADMIN_EMAIL)
    page.fill("#password", ADMIN_PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live.url}/")
    expect(page.locator(".account-nav .who")).to_have_text(f"Signed in as {ADMIN_EMAIL}")


def sign_in(watched: Watched, live: LiveServer, email: str, password: str) -> None:
    page = watched.page
    page.fill("#email", email)
    page.fill("#password", password)
    page.click("button[type=submit]")


@pytest.fixture
def accounts_live(start_server: Callable[..., LiveServer]) -> LiveServer:
    return start_server(mode=ACCOUNTS, account=False)  # a fresh install


def test_setup_sign_in_upload_token_sign_out(
    open_page: Callable[..., Watched], accounts_live: LiveServer, tmp_path
) -> None:
    live = accounts_live
    page = open_page()  # not signed in: the test makes the first account itself
    set_up_admin(page, live)

    # Upload with progress: the script sends the csrf_token cookie back in X-CSRF-Token.
    sent_headers: list[dict[str, str]] = []
    page.page.on(
        "request",
        lambda request: (
            sent_headers.append(request.headers)
            if request.method == "POST" and "/api/threads/" in request.url
            else None
        ),
    )
    page.page.goto(f"{live.url}/threads/{THREAD}")
    expect(page.page.locator("#drop-zone .drop-hint")).to_be_visible()
    review_before_upload(page.page)
    throttle_uploads(page)
    page.page.set_input_files(
        "#file-input", [{"name": "plan.txt", "mimeType": "text/plain", "buffer": b"p" * 400_000}]
    )
    page.page.evaluate(RECORD_PROGRESS)
    page.page.click("#upload-button")
    page.page.wait_for_function("() => window.__progress.some(v => v > 0.1 && v < 0.9)")
    expect(page.page.locator("#upload-status")).to_have_text("Uploaded 1 file(s).")
    assert intermediate_progress(page)
    cookie = {c["name"]: c["value"] for c in page.context.cookies()}["csrf_token"]
    assert sent_headers and sent_headers[-1].get("x-csrf-token") == cookie
    expect(page.page.locator("tr.file-row")).to_have_count(1)

    # An API token from the account page works with a real curl.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live.url)
    page.page.click(".account-nav a[href='/account']")
    page.page.fill("#name", "curl on my laptop")
    page.page.click("form[action='/account/tokens'] button[type=submit]")
    token_input = page.page.locator("#new-token")
    expect(token_input).to_be_visible()
    token = token_input.input_value()
    page.page.click("button[data-copy]")
    expect(page.page.locator("button[data-copy]")).to_have_text("Copied")
    assert page.page.evaluate("() => navigator.clipboard.readText()") == token
    page.shoot("accounts-new-token")
    curl = shutil.which("curl")
    assert curl is not None, "curl is needed for this test"
    result = subprocess.run(
        [
            curl,
            "-s",
            "-H",
            f"Authorization: Bearer {token}",
            f"{live.url}/api/threads/{THREAD}/uploads/list",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert [f["filename"] for f in json.loads(result.stdout)["files"]] == ["plan.txt"]
    page.page.reload()
    expect(page.page.locator("#new-token")).to_have_count(0)  # shown once only

    # Sign out: the thread page asks to sign in, then comes back.
    page.page.click(".account-nav button[type=submit]")
    expect(page.page).to_have_url(f"{live.url}/login")
    page.page.goto(f"{live.url}/threads/{THREAD}")
    expect(page.page).to_have_url(f"{live.url}/login?next=/threads/{THREAD}")
    page.shoot("accounts-login")
    sign_in(page, live, ADMIN_EMAIL, ADMIN_PASSWORD)
    expect(page.page).to_have_url(f"{live.url}/threads/{THREAD}")
    expect(page.page.locator("tr.file-row")).to_have_count(1)


def test_a_second_user_sees_only_their_own_thread_of_the_same_id(
    open_page: Callable[..., Watched], accounts_live: LiveServer
) -> None:
    live = accounts_live
    admin = open_page()
    set_up_admin(admin, live)
    admin.page.goto(f"{live.url}/threads/{THREAD}")
    admin.page.set_input_files(
        "#file-input", [{"name": "private.txt", "mimeType": "text/plain", "buffer": b"mine"}]
    )  # uploaded as soon as chosen
    expect(admin.page.locator("tr.file-row")).to_have_count(1)

    admin.page.goto(f"{live.url}/admin")
    admin.page.fill("#email", "second@example.com")
    admin.page.fill("#password", "second user password")
    admin.page.click("form[action='/admin/users'] button[type=submit]")
    expect(admin.page.locator(".users-table")).to_contain_text("second@example.com")

    second = open_page()
    second.allowed_errors.append("404")  # the browser logs the page's status
    second.page.goto(f"{live.url}/login")
    sign_in(second, live, "second@example.com", "second user password")
    expect(second.page).to_have_url(f"{live.url}/")
    expect(second.page.locator(".threads-table")).to_have_count(0)
    # Thread ids are per user: the same id is the second user's own (empty) thread.
    response = second.page.goto(f"{live.url}/threads/{THREAD}")
    assert response is not None and response.status == 200
    expect(second.page.locator("tr.file-row")).to_have_count(0)
    assert "private.txt" not in second.page.content()
    response = second.page.goto(f"{live.url}/threads/{THREAD}/files/uploads/private.txt")
    assert response is not None and response.status == 404
    expect(second.page.locator(".error-message")).to_have_text(
        "That thread does not exist, or it is not yours."
    )
    second.shoot("accounts-other-users-thread")
