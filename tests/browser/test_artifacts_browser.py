"""A thread's file, opened through its artifact URL, never runs script in the app's origin.

Every payload tries everything at once: an alert, a same-origin `fetch(..., DELETE)` of a
file in another thread, an image beacon and a flag on the window. The browser is watched
for dialogs and every request; the other thread's file must survive. Each file is opened
twice: as served (markup is a download), and with its `Content-Disposition` stripped by the
test, as a browser that ignored it would render it, so the Content-Security-Policy alone
must hold.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from flask import request
from flask import request_started
from playwright.sync_api import Browser
from playwright.sync_api import BrowserContext
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page
from playwright.sync_api import Route
from playwright.sync_api import expect

from tests.browser.helpers import ACCOUNTS
from tests.browser.helpers import SINGLE_USER
from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched
from tests.browser.helpers import gradient_png
from tests.browser.helpers import session_cookies
from tests.support.documents import make_pdf

pytestmark = pytest.mark.browser

THREAD = "attacker"
VICTIM = "victim"
AREAS = ("uploads", "outputs", "workspace")
XHTML = "http://www.w3.org/1999/xhtml"
# Everything a script could do to another thread, plus a way to see that it ran at all.
ATTACK = (
    "window.__pwned = 1;"
    f"fetch('/api/threads/{VICTIM}/uploads/keep.txt', {{method: 'DELETE'}});"
    "new Image().src = '/beacon?' + document.domain;"
    "alert(document.domain);"
)
HTML = f"<!doctype html><html><body><h1>hi</h1><script>{ATTACK}</script></body></html>"
XML_SCRIPT = f'<r xmlns:x="{XHTML}"><x:script>{ATTACK}</x:script></r>'
XSLT = f"""<?xml version="1.0"?>
<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
<xsl:template match="/"><html xmlns="{XHTML}"><body><script>{ATTACK}</script></body></html>
</xsl:template></xsl:stylesheet>"""
PAYLOADS = {
    "p.xml": XML_SCRIPT,
    "styled.xml": '<?xml-stylesheet type="text/xsl" href="transform.xsl"?><r/>',
    "transform.xsl": XSLT,
    "inline-xslt.xml": (
        '<?xml-stylesheet type="text/xsl" href="#s"?>'
        f"<!DOCTYPE r [<!ATTLIST xsl:stylesheet id ID #IMPLIED>]><r>{XSLT[22:]}</r>"
    ).replace("<xsl:stylesheet ", '<xsl:stylesheet id="s" '),
    "feed.rss": f'<rss version="2.0"><channel><title>t</title>{XML_SCRIPT}</channel></rss>',
    "feed.atom": f'<feed xmlns="http://www.w3.org/2005/Atom">{XML_SCRIPT}</feed>',
    "formula.mml": (
        '<math xmlns="http://www.w3.org/1998/Math/MathML">'
        f'<mi>x</mi><x:script xmlns:x="{XHTML}">{ATTACK}</x:script></math>'
    ),
    "page.xhtml": f'<html xmlns="{XHTML}"><body><script>{ATTACK}</script></body></html>',
    "page.html": HTML,
    "README": HTML,  # no extension at all
    "page.txt": HTML,
    "page.json": HTML,  # passive text types keep their own type, never a document
    "page.csv": HTML,
    "page.md": HTML,
    "page.ndjson": HTML,
    "page.yaml": HTML,
    "picture.svg": (
        '<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned = 2">'
        f"<script>{ATTACK}</script></svg>"
    ),
    "fake.png": HTML,
    "fake.pdf": HTML,
    "fake.mp4": HTML,
}


@dataclass
class Probe:
    """A page in its own context, with every request and dialog recorded."""

    page: Page
    context: BrowserContext
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)
    allowed: set[str] = field(default_factory=set)


@pytest.fixture
def probe(browser: Browser, live: LiveServer) -> Iterator[Probe]:
    """A page signed in to `live` when accounts are on, as the thread's owner browses."""
    context = browser.new_context(accept_downloads=True)
    context.set_default_timeout(10_000)
    if live.account is not None:  # the cookies a sign-in through the login page leaves
        cookies = session_cookies(live.app, live.url, live.account)
        context.add_cookies([{**cookie, "url": live.url} for cookie in cookies])
    page = context.new_page()
    watched = Probe(page, context)
    context.on(
        "request",
        lambda request: (
            watched.requests.append(request.url)
            if request.url.startswith("http")  # not the browser's own viewers (chrome-extension:)
            else None
        ),
    )
    page.on("dialog", lambda dialog: (watched.dialogs.append(dialog.message), dialog.dismiss()))
    yield watched
    context.close()


def _put(live: LiveServer, area: str, name: str, data: bytes) -> str:
    folder = live.area_dir(THREAD, area)
    (folder / name).write_bytes(data)
    return f"{live.url}/api/threads/{THREAD}/artifacts/mnt/user-data/{area}/{name}"


def _open(probe: Probe, url: str) -> None:
    """Open a URL as a person would; a download ends the navigation, which is fine here."""
    probe.requests.clear()
    try:
        probe.page.goto(url, wait_until="load")
    except PlaywrightError as error:
        assert "Download is starting" in str(error) or "ERR_ABORTED" in str(error), error
    probe.page.wait_for_timeout(150)  # time for a script, had one run, to send its requests


def _pwned(probe: Probe) -> object:
    try:
        return probe.page.evaluate("() => window.__pwned")
    except PlaywrightError:  # a download left no document to ask
        return None


def _ignore_disposition(probe: Probe) -> Callable[[Route], None]:
    """Serve the opened file without Content-Disposition, as a careless browser would.

    Any other request the document makes is recorded and never reaches the server.
    """

    def handle(route: Route) -> None:
        if route.request.url not in probe.allowed:
            probe.stray.append(route.request.url)
            route.abort()
            return
        response = route.fetch()
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-disposition"}
        route.fulfill(response=response, headers=headers)

    return handle


# The policy and the disposition do not depend on the mode (web/security.py sets them for
# every response). Every payload runs single-user, the harder case: there, nothing but the
# policy would stop the same-origin DELETE (with accounts on the CSRF check refuses it too).
# With accounts on, two kinds of document (HTML, SVG) show that a signed-in owner's
# session opens no door.
@pytest.mark.parametrize(
    ("mode", "name"),
    [(SINGLE_USER, name) for name in sorted(PAYLOADS)]
    + [(ACCOUNTS, "page.html"), (ACCOUNTS, "picture.svg")],
)
def test_no_payload_runs_script_or_sends_a_request(
    probe: Probe, live: LiveServer, mode: str, name: str
) -> None:
    live.seed(VICTIM, {"keep.txt": b"keep me"})
    received: list[str] = []

    def record(sender: object, **extra: object) -> None:
        if request.path != "/favicon.ico":  # the browser's own request for a tab icon
            received.append(request.path)

    request_started.connect(record, live.app)  # held weakly: `record` lives to the end
    data = PAYLOADS[name].encode()
    urls = []
    for area in AREAS:
        urls.append(_put(live, area, name, data))
        if name == "styled.xml":
            _put(live, area, "transform.xsl", XSLT.encode())
    paths = {urlsplit(url).path for url in urls}
    for url in urls:
        received.clear()
        _open(probe, url)
        # Only the file itself (a viewer may fetch it again, even after moving on).
        assert url in probe.requests and set(probe.requests) <= set(urls)
        assert urlsplit(url).path in received and set(received) <= paths
        assert _pwned(probe) is None
    # As a browser that ignored the disposition would render it: the policy alone holds.
    # The policy is the route's, whatever the area, so one area shows it.
    probe.allowed.update(urls)
    probe.context.route(lambda url: url.startswith("http"), _ignore_disposition(probe))
    received.clear()
    _open(probe, urls[0])
    assert urlsplit(urls[0]).path in received and set(received) <= paths
    assert _pwned(probe) is None
    assert probe.stray == [], "the rendered document sent requests"
    assert probe.dialogs == []
    assert live.names(VICTIM) == ["keep.txt"]


def test_markup_is_downloaded_and_text_shown_as_text(probe: Probe, live: LiveServer) -> None:
    for name in ("p.xml", "picture.svg", "page.html", "README", "page.txt"):
        _put(live, "outputs", name, PAYLOADS[name].encode())
    for name in ("p.xml", "picture.svg", "page.html"):
        with probe.page.expect_download() as download:
            _open(probe, f"{live.url}/api/threads/{THREAD}/artifacts/mnt/user-data/outputs/{name}")
        assert download.value.suggested_filename == name
    for name in ("README", "page.txt"):
        _open(probe, f"{live.url}/api/threads/{THREAD}/artifacts/mnt/user-data/outputs/{name}")
        expect(probe.page.locator("pre")).to_have_text(HTML)  # Chromium's text viewer


def _wav() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as sound:
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(8000)
        sound.writeframes(b"\x00\x10" * 8000)
    return buffer.getvalue()


def test_passive_kinds_still_display_with_the_policy(
    page: Watched, live: LiveServer, tmp_path: Path
) -> None:
    """The preview page embeds images, PDFs and media from the artifact route."""
    pdf = make_pdf(tmp_path / "report.pdf").read_bytes()
    live.seed(THREAD, {"report.pdf": pdf, "tone.wav": _wav(), "pixel.png": gradient_png()})
    files = f"{live.url}/threads/{THREAD}/files/uploads"

    page.page.goto(f"{files}/pixel.png")
    page.page.wait_for_function("() => document.querySelector('.image-frame img').complete")
    assert page.page.evaluate("() => document.querySelector('.image-frame img').naturalWidth") == 96

    page.page.goto(f"{files}/tone.wav")
    page.page.wait_for_function("() => document.querySelector('audio').readyState >= 1")
    assert page.page.evaluate("() => document.querySelector('audio').duration") == 1

    page.page.goto(f"{files}/report.pdf")
    # Chromium's PDF viewer is an extension frame inside the (sandboxed) artifact frame.
    page.page.wait_for_timeout(800)
    assert any(f.url.startswith("chrome-extension://") for f in page.page.frames)
    page.shoot("preview-pdf-under-policy")


def test_passive_kinds_display_on_their_own_with_the_policy(
    probe: Probe, live: LiveServer, tmp_path: Path
) -> None:
    """Opened top level, Chromium's own image, media and PDF viewers work under the policy."""
    pdf = make_pdf(tmp_path / "report.pdf").read_bytes()
    live.seed(THREAD, {"report.pdf": pdf, "tone.wav": _wav(), "pixel.png": gradient_png()})
    artifacts = f"{live.url}/api/threads/{THREAD}/artifacts/mnt/user-data/uploads"
    messages: list[str] = []
    probe.page.on("console", lambda message: messages.append(message.text))
    probe.page.goto(f"{artifacts}/tone.wav")
    probe.page.wait_for_function("() => document.querySelector('video').readyState >= 1")
    assert probe.page.evaluate("() => document.querySelector('video').duration") == 1
    probe.page.goto(f"{artifacts}/pixel.png")
    assert probe.page.evaluate("() => document.querySelector('img').naturalWidth") == 96
    probe.page.goto(f"{artifacts}/report.pdf")
    probe.page.wait_for_timeout(800)
    assert any(f.url.startswith("chrome-extension://") for f in probe.page.frames)
    assert [m for m in messages if "Content Security Policy" in m] == []
