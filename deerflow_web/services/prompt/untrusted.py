"""Neutralise user-derived text before it enters a trusted block or a page.

Filenames, paths, headings and previews come from whoever uploaded the file. The upload
context block is written by the server, so a forged `<system>` tag inside a filename would
look like an instruction to the model, and a newline in a name would add a line of its own
(a forged file entry, an "instruction"). Escaping keeps the text readable while taking
away its meaning (SPEC 4.1). Standard library only.
"""

from __future__ import annotations

import re

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
_BLOCKED_TAG = re.compile(rf"<\s*/?\s*(?:{_NAMES})\b[^>]*>?", re.IGNORECASE)

_BOUNDARY_MARKERS = (
    ("--- BEGIN USER INPUT ---", "[BEGIN USER INPUT]"),
    ("--- END USER INPUT ---", "[END USER INPUT]"),
)


# Every character that can end a line, reorder what is displayed or hide text: C0 controls,
# DEL, C1 controls, the Unicode line and paragraph separators and the bidirectional
# overrides and isolates. The same classes are refused in new filenames (filenames.py);
# this covers names placed on disk behind the app's back and text read from files.
_STRUCTURAL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_STRUCTURAL_BUT_TAB = re.compile(
    r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_control(match: re.Match[str]) -> str:
    char = match.group(0)
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, *, keep_tabs: bool = False) -> str:
    """Show every control, separator and bidi character as a visible escape.

    A newline becomes the two characters `\\n`, U+202E becomes `\\u202e`: the text keeps one
    line and displays in its real order. `keep_tabs` leaves tabs alone for lines of a
    file's content, where a tab is layout, not structure.
    """
    pattern = _STRUCTURAL_BUT_TAB if keep_tabs else _STRUCTURAL
    return pattern.sub(_escape_control, text)


def _escape_tag(match: re.Match[str]) -> str:
    return match.group(0).replace("<", "&lt;").replace(">", "&gt;")


def neutralize_untrusted_tags(text: str, *, keep_tabs: bool = False) -> str:
    """Escape controls and deny-listed tags and rewrite the input-guard boundary markers.

    The input guard later wraps the person's message between the boundary markers, so a
    value that carries a marker could close the wrapper early; rewriting the markers
    prevents that. Ordinary tags (`<div>`, `<mydata>`) pass untouched, because escaping
    them would garble legitimate names without adding safety.

    Args:
        text: A user-derived value (filename, path, heading, preview line, summary).
        keep_tabs: Leave tabs in place (a line of a file's content).

    Returns:
        The value on one line (see `escape_controls`), with every blocked tag's `<`/`>`
        escaped and both markers rewritten. Empty text is returned unchanged.
    """
    if not text:
        return text
    escaped = escape_controls(text, keep_tabs=keep_tabs)
    if not escaped.strip():
        return escaped
    escaped = _BLOCKED_TAG.sub(_escape_tag, escaped)
    for marker, replacement in _BOUNDARY_MARKERS:
        escaped = escaped.replace(marker, replacement)
    return escaped
