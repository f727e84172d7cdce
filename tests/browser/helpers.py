"""What the browser tests share: the live server handle, its account and the watched page."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from io import BytesIO
from pathlib import Path

import pytest
from flask import Flask
from playwright.sync_api import BrowserContext
from playwright.sync_api import Page
from playwright.sync_api import expect

from deerflow_web.models import IncomingFile
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import AUTH_ON
from tests.helpers import thread_ref

SCREENSHOTS: list[tuple[str, Path]] = []

# The two modes of SPEC 7.1 the file-manager tests run in: accounts on (the default), as a
# signed-in user, and the single-user mode.
ACCOUNTS = "accounts"
SINGLE_USER = "single-user"
MODES = (ACCOUNTS, SINGLE_USER)


@dataclass(frozen=True)
class BrowserAccount:
    """The person the pages sign in as when accounts are on (an admin created them)."""

    email: str = "reader@example.com"
    password: str = "a browser password"
    user_id: str = "browser-user"


def skip_unless_accounts_can_run(mode: str) -> None:
    """DEER_FLOW_AUTH_DISABLED=1 turns accounts off whatever the config says."""
    if mode == ACCOUNTS and not AUTH_ON:
        pytest.skip("accounts are off (DEER_FLOW_AUTH_DISABLED)")


def create_account(app: Flask, account: BrowserAccount) -> None:
    """Create the account in the app's database, as an administrator would."""
    accounts = app.extensions[EXTENSION_KEY].accounts
    accounts.create_user(account.email, account.password, role="admin", user_id=account.user_id)


def sign_in(page: Page, url: str, account: BrowserAccount) -> None:
    """Sign in through the real login page, as a person would; wait until it let us in."""
    page.goto(f"{url}/login")
    page.fill("#email", account.email)
    page.fill("#password", account.password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda address: "/login" not in address and "/setup" not in address)


def session_cookies(app: Flask, url: str, account: BrowserAccount) -> list[dict]:
    """The cookies a sign-in through the login page leaves (without "keep me signed in"):
    a server-side session opened for `account`, its companion flag and its CSRF cookie.

    Loaded into a fresh context, they spare each test the login page's two page loads; the
    account tests sign in through the page itself."""
    from deerflow_web.web.accounts.gate import CSRF_COOKIE
    from deerflow_web.web.accounts.gate import PERSISTENT_COOKIE
    from deerflow_web.web.accounts.gate import SESSION_COOKIE
    from deerflow_web.web.accounts.gate import csrf_value

    secret = app.extensions[EXTENSION_KEY].accounts.open_session(account.user_id, persistent=False)
    with app.app_context():
        csrf = csrf_value(secret)
    return [
        {"name": SESSION_COOKIE, "value": secret, "httpOnly": True, "sameSite": "Lax"},
        {"name": PERSISTENT_COOKIE, "value": "0", "httpOnly": True, "sameSite": "Lax"},
        {"name": CSRF_COOKIE, "value": csrf, "httpOnly": False, "sameSite": "Strict"},
    ]


@dataclass
class LiveServer:
    """A running app and helpers to put files in it without a browser.

    With accounts on, `account` is the user the pages sign in as, and the helpers read and
    write that user's threads (SPEC D1's per-user layout).
    """

    app: Flask
    url: str
    account: BrowserAccount | None = None

    @property
    def service(self) -> UploadService:
        return self.app.extensions[EXTENSION_KEY].uploads

    @property
    def user_id(self) -> str | None:
        """Whose threads the pages show: the account's, or None (the single-user layout)."""
        return None if self.account is None else self.account.user_id

    def seed(self, thread_id: str, files: dict[str, bytes]) -> None:
        """Store files through the upload service (any name, even ones browsers re-encode),
        in a thread the signed-in user owns."""
        ref = thread_ref(thread_id, self.user_id)
        self.app.extensions[EXTENSION_KEY].threads.create(ref.user_id, thread_id)
        incoming = [IncomingFile(name, BytesIO(body)) for name, body in files.items()]
        self.service.save_uploads(thread_ref(thread_id, self.user_id), incoming)

    def uploads_dir(self, thread_id: str) -> Path:
        return self.service.uploads_dir(thread_ref(thread_id, self.user_id))

    def area_dir(self, thread_id: str, area: str) -> Path:
        """One of the thread's areas (uploads, outputs, workspace), created."""
        self.service.paths.ensure_thread_dirs(thread_ref(thread_id, self.user_id))
        return self.service.paths.area_dir(thread_ref(thread_id, self.user_id), area)

    def names(self, thread_id: str) -> list[str]:
        return [
            record.filename
            for record in self.service.list_uploads(thread_ref(thread_id, self.user_id))
        ]

    def read(self, thread_id: str, name: str) -> bytes:
        return (self.uploads_dir(thread_id) / name).read_bytes()


@dataclass
class Watched:
    """A browser page plus what it logged: console errors, dialogs, requests."""

    page: Page
    context: BrowserContext
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    posts: list[str] = field(default_factory=list)
    screenshot_dir: Path | None = None
    allowed_errors: list[str] = field(default_factory=list)
    signed_in: bool = False
    in_flight: set[object] = field(default_factory=set)  # requests not answered in full yet

    def shoot(self, name: str, *, full_page: bool = True) -> Path:
        """Save a screenshot into the run's temporary folder and remember its path (a signed-in
        page's name ends in `-signed-in`, so the two modes' shots are both kept)."""
        assert self.screenshot_dir is not None
        name = f"{name}-signed-in" if self.signed_in else name
        path = self.screenshot_dir / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        SCREENSHOTS.append((name, path))
        print(f"screenshot {name}: {path}")
        return path


def review_before_upload(page: Page) -> None:
    """Tick "review first": chosen files wait in the list for the Upload button, as the
    tests that look at the list before sending (limits, conflicts, progress) need."""
    page.check("#review-first")


def gradient_png(width: int = 96, height: int = 64) -> bytes:
    """A small RGB PNG with a visible gradient, built with the standard library."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + b"".join(bytes((x * 255 // width, y * 255 // height, 160)) for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


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
    """The progress values `RECORD_PROGRESS` saw strictly between empty and full."""
    values = watched.page.evaluate("() => window.__progress")
    return [value for value in values if 0 < value < 1]


def open_thread(watched: Watched, live: LiveServer, thread_id: str = THREAD) -> None:
    """Open a thread's file manager and wait until its drop zone is ready."""
    watched.page.goto(f"{live.url}/threads/{thread_id}")
    expect(watched.page.locator("#drop-zone .drop-hint")).to_be_visible()
    review_before_upload(watched.page)


def axe_script() -> str:
    """axe-core as shipped by the `axe-playwright-python` test dependency (no download)."""
    import axe_playwright_python

    return (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text("utf-8")


def axe_violations(
    page: Page, impacts: tuple[str, ...] = ("critical", "serious"), exclude: tuple[str, ...] = ()
) -> list[str]:
    """Run axe-core in the page as it is now; the violations of those impacts, described.
    `exclude`: selectors of third-party markup left out (the vendored Swagger UI)."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Evaluated through the driver, so the page's CSP (script-src 'self') does not apply.
        page.evaluate(axe_script() + "\n;undefined")
    # A theme switched a moment ago may still be fading: judge the colours it ends with.
    page.evaluate("() => document.getAnimations().forEach(animation => animation.finish())")
    result = page.evaluate(
        "async (exclude) => await window.axe.run(exclude.length ? {exclude} : document)",
        [[selector] for selector in exclude],
    )
    found = []
    for violation in result["violations"]:
        if violation["impact"] in impacts:
            targets = [", ".join(node["target"]) for node in violation["nodes"]][:5]
            found.append(f"{violation['impact']} {violation['id']}: {targets}")
    return found


def assert_accessible(page: Page, exclude: tuple[str, ...] = ()) -> None:
    """axe-core finds no critical or serious violation on the page as it is now."""
    found = axe_violations(page, exclude=exclude)
    assert not found, f"axe on {page.url}: {found}"
