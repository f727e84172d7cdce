"""Neutralise user-derived text before it enters a trusted block or a page.

Filenames, paths, headings and previews come from whoever uploaded the file. The upload
context block is written by the server, so a forged `<system>` tag inside a filename would
look like an instruction to the model, and a newline in a name would add a line of its own
(a forged file entry, an "instruction"). Escaping keeps the text readable while taking
away its meaning (SPEC 4.1). Standard library only.

A tag is recognised by what it looks like, not by its code points (issue 23 item 12): a
zero-width space inside `</current_uploads>`, a full-width `＜`, a Cyrillic `с` in `system`
or an invisible tag character would otherwise slip past a pattern written in ASCII while
the model reads the tag all the same. So the patterns run over a skeleton of the text
(compatibility forms decomposed, accents and invisible characters dropped, look-alike
letters and brackets folded to ASCII, lower case), and only what they find there is
escaped, in the original text: every other character is kept as it was.
"""

from __future__ import annotations

import functools
import re
import unicodedata

BLOCKED_TAG_NAMES: tuple[str, ...] = (
    "analysis",
    "available-deferred-tools",
    "available_skills",
    "background_task_event",
    "citations",
    "clarification_system",
    "critical_reminders",
    "current_date",
    "current_uploads",
    "disabled_skills",
    "durable_context_data",
    "file_editing_workflow",
    "goal_continuation",
    "guidelines",
    "ignore",
    "important",
    "instruction",
    "mcp_routing_hints",
    "memory",
    "memory_tool_system",
    "output_format",
    "override",
    "prompt",
    "response_style",
    "role",
    "self_update",
    "skill_index",
    "skill_system",
    "slash_skill_activation",
    "soul",
    "subagent_system",
    "system",
    "system-reminder",
    "system_reminder",
    "think",
    "thinking_style",
    "todo_list_system",
    "tool_restrictions",
    "uploaded_files",
    "working_directory",
)

# Longest names first so `system_reminder` is tried before `system`; `\b` alone would
# already reject `<systems>`, the ordering only makes the alternation easier to read.
_NAMES = "|".join(re.escape(name) for name in sorted(BLOCKED_TAG_NAMES, key=len, reverse=True))
# Run over the skeleton (see `_skeleton`): a blocked tag, or a boundary marker of the input
# guard (`--- BEGIN USER INPUT ---`, in any case and spacing).
_FORGED = re.compile(
    rf"(?P<tag><\s*/?\s*(?:{_NAMES})\b[^>]*>?)"
    r"|(?P<marker>-{3}\s*(?P<which>begin|end)\s+user\s+input\s*-{3})",
    re.IGNORECASE,
)
_MARKER_REPLACEMENTS = {"begin": "[BEGIN USER INPUT]", "end": "[END USER INPUT]"}

# Characters that look like ASCII ones the patterns need (brackets, slash, hyphen, low
# line, letters) but that compatibility decomposition leaves alone: Cyrillic, Greek and
# Armenian letters, small capitals, angle brackets and quotation marks, dashes. Upper and
# lower case are listed apart: `Н` looks like `H`, `н` like a small `h`.
_LOOK_ALIKES: dict[str, str] = {
    **dict.fromkeys("\u2039\u2329\u27e8\u3008\u276e\u2770\u29fc\u02c2\u1438\u227a", "<"),
    **dict.fromkeys("\u203a\u232a\u27e9\u3009\u276f\u2771\u29fd\u02c3\u1433\u227b", ">"),
    **dict.fromkeys("\u2044\u2215\u29f8\u2571\u27cb", "/"),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2043\u02d7\u2796", "-"),
    **dict.fromkeys("\u2017\u02cd", "_"),
    **dict(zip("АВЕКМНОРСТУХЅІЈҮҺӀԜ", "ABEKMHOPCTYXSIJYHIW", strict=True)),
    **dict(zip("авекмнорстухѕіјүһӏԁԛԝ", "abekmhopctyxsijyhldqw", strict=True)),
    **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "ABEZHIKMNOPTYX", strict=True)),
    **dict(zip("αγεηικνορτυχωϲϳ", "ayenikvoptuxwcj", strict=True)),
    **dict(zip("օսհոզ", "ouhnq", strict=True)),
    **dict(zip("ıȷɑɡɩɪʏʀɴʜɢʟᴀᴄᴅᴇᴊᴋᴍᴏᴘᴛᴜᴠᴡᴢꜱ", "ijagiiyrnhglacdejkmoptuvwzs", strict=True)),
}
# Letters that draw nothing (Hangul fillers): invisible like the format characters.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Mn", "Me"})  # format characters, combining marks


@functools.lru_cache(maxsize=8192)
def _fold(char: str) -> str:
    """What one non-ASCII character looks like, for matching: "" when it shows nothing.

    Compatibility forms decompose (`＜` to `<`, `ｓ` and `𝐬` to `s`, `ſ` to `s`), accents
    and invisible characters (zero-width spaces and joiners, the soft hyphen, word joiners,
    the byte-order mark, tag characters, variation selectors) drop out, look-alikes fold
    to the ASCII they imitate, and the result is in lower case.
    """
    if char in _LOOK_ALIKES:
        return _LOOK_ALIKES[char].lower()
    if char in _BLANK_LETTERS or unicodedata.category(char) in _INVISIBLE_CATEGORIES:
        return ""
    parts = []
    for part in unicodedata.normalize("NFKD", char):
        if unicodedata.category(part) not in _INVISIBLE_CATEGORIES:
            parts.append(_LOOK_ALIKES.get(part, part))
    return "".join(parts).lower()


def _skeleton(text: str) -> tuple[str, list[int] | None]:
    """The text as it looks (see `_fold`) and, per skeleton character, its index in `text`.

    ASCII text is its own skeleton (the patterns ignore case): None stands for "the same
    index", so the common case costs one regular-expression pass as before.
    """
    if text.isascii():
        return text, None
    parts: list[str] = []
    owners: list[int] = []
    for index, char in enumerate(text):
        folded = char if char < "\x80" else _fold(char)
        parts.append(folded)
        owners.extend([index] * len(folded))
    return "".join(parts), owners


def _defuse_tag(original: str) -> str:
    """One forged tag as visible text: its brackets escaped, its hidden characters shown."""
    out: list[str] = []
    for char in original:
        folded = char if char < "\x80" else _fold(char)
        if "<" in folded:
            out.append("&lt;")
        elif ">" in folded:
            out.append("&gt;")
        elif not folded:
            out.append(_escape_char(char))
        else:
            out.append(char)
    return "".join(out)


def _defuse_forged(text: str) -> str:
    """Escape every blocked tag and rewrite every boundary marker, in whatever form."""
    skeleton, owners = _skeleton(text)
    pieces: list[str] = []
    done = 0
    for match in _FORGED.finditer(skeleton):
        start, end = match.span()
        if owners is not None:
            start, end = owners[start], owners[end - 1] + 1
        if start < done:
            continue  # inside one character that folded to several: already handled
        pieces.append(text[done:start])
        if match.group("tag") is not None:
            pieces.append(_defuse_tag(text[start:end]))
        else:
            pieces.append(_MARKER_REPLACEMENTS[match.group("which").lower()])
        done = end
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


# Every character that can end a line, reorder what is displayed or hide text: C0 controls,
# DEL, C1 controls, the Unicode line and paragraph separators, the bidirectional
# overrides and isolates, and the tag characters (invisible copies of ASCII that a model
# reads as text). The same classes are refused in new filenames (filenames.py); this
# covers names placed on disk behind the app's back and text read from files.
_HIDDEN = "\u2028\u2029\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f"
_STRUCTURAL = re.compile(rf"[\x00-\x1f\x7f-\x9f{_HIDDEN}]")
_STRUCTURAL_BUT_TAB = re.compile(rf"[\x00-\x08\x0a-\x1f\x7f-\x9f{_HIDDEN}]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escape_control(match: re.Match[str]) -> str:
    return _escape_char(match.group(0))


def escape_controls(text: str, *, keep_tabs: bool = False) -> str:
    """Show every control, separator and bidi character as a visible escape.

    A newline becomes the two characters `\\n`, U+202E becomes `\\u202e`: the text keeps one
    line and displays in its real order. `keep_tabs` leaves tabs alone for lines of a
    file's content, where a tab is layout, not structure.
    """
    pattern = _STRUCTURAL_BUT_TAB if keep_tabs else _STRUCTURAL
    return pattern.sub(_escape_control, text)


def neutralize_untrusted_tags(text: str, *, keep_tabs: bool = False) -> str:
    """Escape controls and deny-listed tags and rewrite the input-guard boundary markers.

    The input guard later wraps the person's message between the boundary markers, so a
    value that carries a marker could close the wrapper early; rewriting the markers
    prevents that. Ordinary tags (`<div>`, `<mydata>`) pass untouched, because escaping
    them would garble legitimate names without adding safety. Tags and markers are found
    by how they look (see the module docstring): `＜ѕystem＞` and `</current\u200b_uploads>`
    are escaped like `<system>`.

    Args:
        text: A user-derived value (filename, path, heading, preview line, summary).
        keep_tabs: Leave tabs in place (a line of a file's content).

    Returns:
        The value on one line (see `escape_controls`), with every blocked tag's brackets
        escaped (`&lt;`/`&gt;`) and the invisible characters inside it shown as escapes,
        and both markers rewritten. Empty text is returned unchanged; text without a tag
        or marker keeps every character but the structural ones.
    """
    if not text:
        return text
    return escape_controls(_defuse_forged(text), keep_tabs=keep_tabs)
