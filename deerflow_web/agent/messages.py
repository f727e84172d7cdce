"""Put an upload block in front of the person's message without losing anything of it.

The middlewares never mutate the incoming message: they return a copy (SPEC 4.4 steps
8-10). Keeping every content block matters for multimodal messages, and keeping the
pre-injection text in `original_user_content` lets the input guard escape only what the
person wrote, not the server's block (SPEC 4.1, last bullet).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.messages import HumanMessage

from deerflow_web.services.prompt.turn import compose_text

logger = logging.getLogger(__name__)

ORIGINAL_CONTENT_KEY = "original_user_content"


def state_messages(state: Any) -> list[BaseMessage]:
    """The state's messages as a new list (dict state or attribute state)."""
    if isinstance(state, Mapping):
        messages = state.get("messages")
    else:
        messages = getattr(state, "messages", None)
    return list(messages or [])


def state_value(state: Any, key: str) -> Any:
    """One key of a dict state or an attribute of an object state; None when absent."""
    if isinstance(state, Mapping):
        return state.get(key)
    return getattr(state, key, None)


def last_human(messages: list[BaseMessage]) -> HumanMessage | None:
    """The last message when it is a human message, else None."""
    if messages and isinstance(messages[-1], HumanMessage):
        return messages[-1]
    return None


def content_text(content: Any) -> str:
    """The text of a message content: strings and `text` values, joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for item in content:
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("text"), str):
            parts.append(item["text"])
    return "\n".join(part for part in parts if part)


def prepend_block(content: Any, block: str) -> Any:
    """Put `block` before the content; every original list element is kept, images too."""
    if isinstance(content, str):
        return compose_text(block, content)
    if isinstance(content, list):
        return [{"type": "text", "text": compose_text(block, "")}, *content]
    return content


def with_upload_block(message: HumanMessage, block: str) -> HumanMessage:
    """Return a copy of the message with the block in front (same id, name and kwargs).

    `original_user_content` is set to the text before injection unless it already holds a
    string (an upstream producer may have recorded the person's words more precisely).
    """
    kwargs = dict(message.additional_kwargs)
    existing = kwargs.get(ORIGINAL_CONTENT_KEY)
    if not isinstance(existing, str):
        if existing is not None:
            logger.warning(
                "replacing non-string %s of type %s", ORIGINAL_CONTENT_KEY, type(existing).__name__
            )
        kwargs[ORIGINAL_CONTENT_KEY] = content_text(message.content)
    return message.model_copy(
        update={"content": prepend_block(message.content, block), "additional_kwargs": kwargs}
    )


def legacy_text(content: Any) -> str:
    """Doc A's text of a content: only `type == "text"` blocks of a list survive."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        )
    return str(content)
