"""Markdown to HTML that is safe to put in a page: no raw HTML, no script, no remote loads.

markdown-it-py runs with `html` off, so any tag in the source (a `<script>`, an `onerror`
attribute) comes out as visible text. On top of that, links may only use http(s), mailto
or relative targets, and an image is only loaded when it is a file of the same thread:
a remote image becomes a plain link, so opening a preview never contacts another server.

Rendering is bounded and cached (issue 23 item 8): a megabyte of `![` kept markdown-it busy
for 15 s per page view. A text over `MAX_RENDER_BYTES` is not rendered, a render that runs
past `RENDER_SECONDS` is given up, and each outcome is kept per process by the text's
SHA-256, so the same text is parsed once however often its page is opened. What depends on
the thread (which images exist, their URLs) is filled in on every view from the cached
result, never cached itself.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token
from markdown_it.utils import EnvType
from markdown_it.utils import OptionsDict
from markupsafe import escape

from deerflow_web.concurrency import off_loop

logger = logging.getLogger(__name__)
MAX_RENDER_BYTES = 512 * 1024  # UTF-8 size; above it, the page shows the source text
RENDER_SECONDS = 2.0  # CPU time of one render (its thread's)
MAX_IMAGES = 500  # distinct local images one view resolves; the rest show their alt text
RENDER_CACHE_BYTES = 32 * 1024 * 1024  # per process

SAFE_SCHEMES = frozenset({"http", "https", "mailto"})
_SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

ImageResolver = Callable[[str], str | None]
"""Maps a path relative to user-data (`uploads/img.png`) to a URL, or None if unavailable."""


def _is_safe_link(url: str) -> bool:
    """http(s), mailto, or no scheme at all (relative, `#anchor`, `/path`)."""
    stripped = url.strip()
    if stripped.startswith("//"):
        return True  # protocol-relative: https on this page's scheme
    match = _SCHEME_RE.match(stripped)
    return match is None or match.group(0)[:-1].lower() in SAFE_SCHEMES


def _is_remote(url: str) -> bool:
    return url.startswith("//") or _SCHEME_RE.match(url) is not None


def _local_target(base_dir: str, src: str) -> str | None:
    """The user-data path an image's relative `src` names, or None if it leaves user-data."""
    parts = urlsplit(src)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    joined = posixpath.normpath(posixpath.join(base_dir, unquote(parts.path)))
    if joined.startswith(("..", "/")) or joined == ".":
        return None
    return joined


_IMAGE_SLOT = re.compile("\x00([0-9]+)\x00")
"""Where a local image goes in cached HTML. markdown-it turns every NUL of the source
(and `&#0;`) into U+FFFD, so a NUL in its output can only be one of these slots."""


def _render_image(
    self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    if not _is_remote(src):
        # Whether it shows depends on the thread's files now: filled in at every view.
        env["images"].append((src, alt))
        return f"\x00{len(env['images']) - 1}\x00"
    label = alt or src
    if _is_safe_link(src):
        # Never load a remote image: it would tell another server who reads the file.
        return (
            f'<a class="md-remote-image" href="{escape(src)}" rel="nofollow noopener noreferrer">'
            f"{escape(label)}</a>"
        )
    return f'<span class="md-missing-image">{escape(label)}</span>'


def _local_image(src: str, alt: str, base_dir: str, image_url: ImageResolver) -> str:
    local = _local_target(base_dir, src)
    url = image_url(local) if local is not None else None
    if url is not None:
        return f'<img src="{escape(url)}" alt="{escape(alt)}" loading="lazy">'
    return f'<span class="md-missing-image">{escape(alt or src)}</span>'


def _bounded_resolver(image_url: ImageResolver | None) -> ImageResolver:
    """`image_url` asked once per path and for at most `MAX_IMAGES` paths per view.

    Each answer looks at the thread's files; a text naming a hundred thousand images
    would otherwise cost as many lookups on every view.
    """
    urls: dict[str, str | None] = {}

    def resolve(path: str) -> str | None:
        if path not in urls:
            if image_url is None or len(urls) >= MAX_IMAGES:
                return None
            urls[path] = image_url(path)
        return urls[path]

    return resolve


def _render_link_open(
    self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    if _is_remote(str(token.attrGet("href") or "")):
        token.attrSet("rel", "nofollow noopener noreferrer")
    return self.renderToken(tokens, idx, options, env)


class MarkdownNotRendered(Exception):
    """The text is too large to render, or its render ran out of time: show it as source.

    `reason` is `"size"` or `"time"`.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _with_deadline(rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule`, refusing to run once its render's CPU deadline (in `state.env`) has passed.

    markdown-it calls its rules for every token it tries, also while it scans ahead for
    the end of a link label, so a check here stops a render within a rule call of its
    deadline, however the input makes it slow. The deadline is the rendering thread's CPU
    time, not the clock's: the verdict, which is cached, then depends on the text and not
    on how busy the machine was when it was first asked for.
    """

    def checked(state: Any, *args: Any) -> Any:
        if time.thread_time() > state.env["deadline"]:
            raise MarkdownNotRendered("time")
        return rule(state, *args)

    return checked


def _make_parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.validateLink = _is_safe_link  # type: ignore[method-assign]
    md.add_render_rule("image", _render_image)
    md.add_render_rule("link_open", _render_link_open)
    for ruler in (md.core.ruler, md.block.ruler, md.inline.ruler, md.inline.ruler2):
        for rule in list(ruler.__rules__):
            ruler.at(rule.name, _with_deadline(rule.fn), {"alt": list(rule.alt)})
    return md


_PARSER = _make_parser()


@dataclass(frozen=True)
class _Rendered:
    """A render's outcome for one text: HTML with image slots, or why there is none."""

    html: str = ""
    images: tuple[tuple[str, str], ...] = ()  # (src, alt) of each slot
    refused: str = ""

    @property
    def weight(self) -> int:
        return len(self.html) + sum(len(src) + len(alt) for src, alt in self.images) + 100


class RenderCache:
    """Render outcomes by SHA-256 of the text, least recently used out first, bounded in size.

    Per process, not in the database: an entry is derived, and rebuilding one costs at most
    `RENDER_SECONDS`, once per process (a few workers), while sharing would write up to
    megabytes to the database on page views. The lock makes it safe under threads; under
    gevent it is only touched from the loop's greenlets (the parse itself runs off it).
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[bytes, _Rendered] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> _Rendered | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: bytes, entry: _Rendered) -> None:
        if entry.weight > self._max_bytes // 4:
            return  # one huge page would push out everything else
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.weight
            self._entries[key] = entry
            self._bytes += entry.weight
            while self._bytes > self._max_bytes:
                _key, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.weight

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


RENDER_CACHE = RenderCache(RENDER_CACHE_BYTES)


def _render_uncached(text: str) -> _Rendered:
    """Parse and render `text` within `RENDER_SECONDS`; images become slots."""
    env: dict[str, Any] = {"images": [], "deadline": time.thread_time() + RENDER_SECONDS}
    try:
        html = _PARSER.render(text, env)
    except MarkdownNotRendered as refused:
        logger.warning(
            "Markdown of %d characters not formatted: over %g s of CPU; shown as source",
            len(text),
            RENDER_SECONDS,
        )
        return _Rendered(refused=refused.reason)
    return _Rendered(html=html, images=tuple(env["images"]))


def render_markdown(
    text: str, *, base_dir: str = "", image_url: ImageResolver | None = None
) -> str:
    """Render Markdown to sanitised HTML, from the cache when this text was rendered before.

    Args:
        text: The Markdown source (untrusted).
        base_dir: The folder of the Markdown file, relative to user-data (`uploads`), that
            relative image paths start from.
        image_url: Turns a user-data path into a same-origin URL, or None when the file
            cannot be shown; without it no image is ever loaded.

    Raises:
        MarkdownNotRendered: The text is over `MAX_RENDER_BYTES`, or rendering it took
            longer than `RENDER_SECONDS` (now or when it was first tried).
    """
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_RENDER_BYTES:
        raise MarkdownNotRendered("size")
    key = hashlib.sha256(encoded).digest()
    rendered = RENDER_CACHE.get(key)
    if rendered is None:
        # Up to RENDER_SECONDS of parsing: off the event loop (concurrency.py).
        rendered = off_loop(_render_uncached, text)
        RENDER_CACHE.put(key, rendered)
    if rendered.refused:
        raise MarkdownNotRendered(rendered.refused)
    if not rendered.images:
        return rendered.html
    resolve = _bounded_resolver(image_url)

    def fill(slot: re.Match[str]) -> str:
        src, alt = rendered.images[int(slot.group(1))]
        return _local_image(src, alt, base_dir, resolve)

    return _IMAGE_SLOT.sub(fill, rendered.html)
