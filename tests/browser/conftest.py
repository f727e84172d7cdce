"""A live app on 127.0.0.1 and Debian's headless Chromium driven by Playwright.

Playwright never downloads a browser here: it drives `/usr/bin/chromium` (`make browser`
installs it). Every test gets a fresh data dir and server, and a browser page that records
console errors and dialogs; a page that logged an error fails its test. Screenshots go
to the run's temporary folder and their paths are listed at the end of the run.

The file-manager tests run in both modes of SPEC 7.1 through the `mode` parameter of the
`live` server: accounts on (the default), where every page starts signed in, with the
cookies a sign-in through the real login page leaves (test_browser_accounts.py signs in
through that page itself), and single-user. Both run in the first pass of `make test`; with
`DEER_FLOW_AUTH_DISABLED=1` (which forces accounts off) the accounts runs are skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser
from playwright.sync_api import BrowserContext
from playwright.sync_api import ConsoleMessage
from playwright.sync_api import Dialog
from playwright.sync_api import Playwright
from playwright.sync_api import sync_playwright
from werkzeug.serving import WSGIRequestHandler
from werkzeug.serving import make_server

from tests.browser.helpers import ACCOUNTS
from tests.browser.helpers import MODES
from tests.browser.helpers import SCREENSHOTS
from tests.browser.helpers import SINGLE_USER
from tests.browser.helpers import BrowserAccount
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import create_account
from tests.browser.helpers import session_cookies
from tests.browser.helpers import skip_unless_accounts_can_run

CHROMIUM = Path("/usr/bin/chromium")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything in this folder drives a real browser."""
    for item in items:
        if "tests/browser/" in item.nodeid:
            item.add_marker(pytest.mark.browser)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the screenshots this run saved, so a person can look at them."""
    if SCREENSHOTS:
        terminalreporter.section("browser screenshots")
        for title, path in SCREENSHOTS:
            terminalreporter.write_line(f"{title}: {path}")


@pytest.fixture(scope="package")
def playwright_instance() -> Iterator[Playwright]:
    """One Playwright driver for the browser tests only.

    The sync API runs an asyncio loop on the main thread while it lives; scoping it to
    this package ends that loop before other tests (which may call `asyncio.run`) run.
    """
    if not CHROMIUM.exists():
        pytest.fail(
            "Chromium is missing: run `make browser` (apt-get install chromium), "
            "or deselect these tests with -m 'not browser'",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="package")
def browser(playwright_instance: Playwright) -> Iterator[Browser]:
    """Debian's Chromium, headless; Playwright never downloads a browser here."""
    browser = playwright_instance.chromium.launch(executable_path=str(CHROMIUM), headless=True)
    yield browser
    browser.close()


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this run's screenshots go."""
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """The mode a file-manager test serves: accounts on (signed in), then single-user."""
    return request.param


# How often the server's loop looks whether it should stop: `shutdown()` waits for that
# look, half a second on average at the standard library's default, at every test's end.
SHUTDOWN_POLL = 0.02

SENDING = "tests.sending"  # the environ key of what the app answered a request with


class _ClosedOnce:
    """An app's answer, closed once however often it is asked to."""

    def __init__(self, answer: Iterable[bytes]) -> None:
        self._answer = answer
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._answer)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            close = getattr(self._answer, "close", None)
            if close is not None:
                close()


def _remembering_its_answer(app: Any) -> Any:
    def wsgi(environ: dict[str, Any], start_response: Any) -> _ClosedOnce:
        answer = environ[SENDING] = _ClosedOnce(app(environ, start_response))
        return answer

    return wsgi


class _Handler(WSGIRequestHandler):
    """The development server's handler, closing what the app was sending when the browser
    drops the connection. Werkzeug closes it after draining the request's socket, and
    a drain that meets the reset raises first: the file being sent (a favicon the browser
    gave up on, say) was left to the garbage collector, whose ResourceWarning failed
    whichever test ran then."""

    def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
        if environ is not None and SENDING in environ:
            environ[SENDING].close()
        super().connection_dropped(error, environ)


@pytest.fixture
def start_server(make_app: Any) -> Iterator[Callable[..., LiveServer]]:
    """Start the app (CSRF on, as in production) on a free loopback port."""
    servers = []

    def start(
        uploads: dict[str, Any] | None = None,
        *,
        mode: str = SINGLE_USER,
        account: bool = True,
        **config: Any,
    ) -> LiveServer:
        """Serve `mode`, with more config.yaml sections in `config` (`scanning`, ...).
        With accounts on the app has the account pages sign in as, or, with
        `account=False`, is a fresh install (no account yet), for the account tests."""
        skip_unless_accounts_can_run(mode)
        auth = {"enabled": mode == ACCOUNTS}
        app = make_app(
            uploads=uploads,
            auth=auth,
            test_user=False,
            WTF_CSRF_ENABLED=True,
            TESTING=False,
            **config,
        )
        chosen = BrowserAccount() if mode == ACCOUNTS and account else None
        if chosen is not None:
            create_account(app, chosen)
        server = make_server(
            "127.0.0.1", 0, _remembering_its_answer(app), threaded=True, request_handler=_Handler
        )
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL}, daemon=True
        )
        thread.start()
        servers.append((server, thread))
        return LiveServer(app, f"http://127.0.0.1:{server.server_port}", chosen)

    yield start
    for server, thread in servers:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


@pytest.fixture
def live(start_server: Callable[..., LiveServer], mode: str) -> LiveServer:
    """The app with default limits, in each mode."""
    return start_server(mode=mode)


def _watch(context: BrowserContext, screenshot_dir: Path) -> Watched:
    page = context.new_page()
    watched = Watched(page, context, screenshot_dir=screenshot_dir)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            watched.console_errors.append(f"{page.url}: {message.text}")

    def on_dialog(dialog: Dialog) -> None:
        watched.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda error: watched.console_errors.append(f"{page.url}: {error}"))
    page.on("dialog", on_dialog)
    page.on(
        "request",
        lambda request: watched.posts.append(request.url) if request.method == "POST" else None,
    )
    context.on("request", lambda request: watched.in_flight.add(request))
    context.on("requestfinished", lambda request: watched.in_flight.discard(request))
    context.on("requestfailed", lambda request: watched.in_flight.discard(request))
    return watched


SETTLE_SECONDS = 3.0


def _settle(watched: Watched) -> None:
    """Let the answers still on their way (a thumbnail loading late, say) arrive before the
    context closes: the development server leaves a file it was sending open when the
    browser drops the connection midway, and the suite turns that ResourceWarning into an
    error of whichever test runs then. Bounded: a request that never ends is dropped."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while watched.in_flight and time.monotonic() < deadline and not watched.page.is_closed():
        watched.page.wait_for_timeout(20)  # lets Playwright deliver the pending events


def _check(watched: Watched) -> None:
    errors = [
        error
        for error in watched.console_errors
        if not any(allowed in error for allowed in watched.allowed_errors)
    ]
    assert errors == [], "console errors"
    assert watched.dialogs == [], "no alert/confirm/prompt may ever fire"


@pytest.fixture
def open_page(browser: Browser, screenshot_dir: Path) -> Iterator[Callable[..., Watched]]:
    """Open watched pages; each must end with no console error and no native dialog."""
    opened: list[Watched] = []

    def factory(
        *,
        javascript: bool = True,
        width: int = 1280,
        language: str = "en-US",
        server: LiveServer | None = None,
    ) -> Watched:
        """A new browser context; signed in to `server` when it has an account."""
        context = browser.new_context(
            viewport={"width": width, "height": 900},
            java_script_enabled=javascript,
            accept_downloads=False,
            locale=language,
            extra_http_headers={"Accept-Language": language},
        )
        context.set_default_timeout(10_000)
        watched = _watch(context, screenshot_dir)
        opened.append(watched)
        if server is not None and server.account is not None:
            cookies = session_cookies(server.app, server.url, server.account)
            context.add_cookies([{**cookie, "url": server.url} for cookie in cookies])
            watched.signed_in = True
        return watched

    yield factory
    try:
        for watched in opened:
            _check(watched)
    finally:
        for watched in opened:
            _settle(watched)
            watched.context.close()


@pytest.fixture
def page(open_page: Callable[..., Watched], live: LiveServer) -> Watched:
    """A watched page with JavaScript on, at desktop width, in English, signed in to `live`
    when accounts are on."""
    return open_page(server=live)
