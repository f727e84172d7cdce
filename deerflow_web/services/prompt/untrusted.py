"""Neutralise prompt-control tags in user-derived text before it enters a trusted block.

Filenames, paths, headings and previews come from whoever uploaded the file. The upload
context block is written by the server, so a forged `<system>` tag inside a filename would
look like an instruction to the model. Escaping the tag keeps the text readable while
taking away its meaning (SPEC 4.1). Standard library only.
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


def _escape_tag(match: re.Match[str]) -> str:
    return match.group(0).replace("<", "&lt;").replace(">", "&gt;")


def neutralize_untrusted_tags(text: str) -> str:
    """Escape deny-listed tags and rewrite the input-guard boundary markers.

    The input guard later wraps the person's message between the boundary markers, so a
    value that carries a marker could close the wrapper early; rewriting the markers
    prevents that. Ordinary tags (`<div>`, `<mydata>`) pass untouched, because escaping
    them would garble legitimate names without adding safety.

    Args:
        text: A user-derived value (filename, path, heading, preview line, summary).

    Returns:
        The value with every blocked tag's `<`/`>` escaped and both markers rewritten.
        Empty or whitespace-only text is returned unchanged.
    """
    if not text or not text.strip():
        return text
    escaped = _BLOCKED_TAG.sub(_escape_tag, text)
    for marker, replacement in _BOUNDARY_MARKERS:
        escaped = escaped.replace(marker, replacement)
    return escaped
