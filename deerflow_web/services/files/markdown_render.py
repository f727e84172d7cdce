"""Markdown to HTML that is safe to put in a page: no raw HTML, no script, no remote loads.

markdown-it-py runs with `html` off, so any tag in the source (a `<script>`, an `onerror`
attribute) comes out as visible text. On top of that, links may only use http(s), mailto
or relative targets, and an image is only loaded when it is a file of the same thread:
a remote image becomes a plain link, so opening a preview never contacts another server.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token
from markdown_it.utils import EnvType
from markdown_it.utils import OptionsDict
from markupsafe import escape

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


def _render_image(
    self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    escape = env["escape"]
    local = _local_target(env["base_dir"], src) if not _is_remote(src) else None
    url = env["image_url"](local) if local is not None else None
    if url is not None:
        return f'<img src="{escape(url)}" alt="{escape(alt)}" loading="lazy">'
    label = alt or src
    if _is_remote(src) and _is_safe_link(src):
        # Never load a remote image: it would tell another server who reads the file.
        return (
            f'<a class="md-remote-image" href="{escape(src)}" rel="nofollow noopener noreferrer">'
            f"{escape(label)}</a>"
        )
    return f'<span class="md-missing-image">{escape(label)}</span>'


def _render_link_open(
    self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    if _is_remote(str(token.attrGet("href") or "")):
        token.attrSet("rel", "nofollow noopener noreferrer")
    return self.renderToken(tokens, idx, options, env)


def _make_parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.validateLink = _is_safe_link  # type: ignore[method-assign]
    md.add_render_rule("image", _render_image)
    md.add_render_rule("link_open", _render_link_open)
    return md


_PARSER = _make_parser()


def render_markdown(
    text: str, *, base_dir: str = "", image_url: ImageResolver | None = None
) -> str:
    """Render Markdown to sanitised HTML.

    Args:
        text: The Markdown source (untrusted).
        base_dir: The folder of the Markdown file, relative to user-data (`uploads`), that
            relative image paths start from.
        image_url: Turns a user-data path into a same-origin URL, or None when the file
            cannot be shown; without it no image is ever loaded.
    """
    env = {
        "base_dir": base_dir,
        "image_url": image_url or (lambda _path: None),
        "escape": lambda value: str(escape(value)),
    }
    return _PARSER.render(text, env)
