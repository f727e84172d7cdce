"""Pictures for vision models, LangChain side: whether the model is shown pictures, and
putting a message's pictures beside its upload block.

Whether pictures are sent is decided once, when the agent is built, because the tools are
decided then too (`view_image` is only offered to a model that can look): `agent.vision`
true or false wins; `auto` (the default) asks the chat model's LangChain profile
(`model.profile["image_inputs"]`), and a model without a profile is not shown pictures.
Which pictures and their bytes come from `services/prompt/images.py`, which the chat
preview calls too.

Wiring::

    vision = vision_enabled(None, model)             # settings, then the model's profile
    middleware = make_upload_middleware(vision=vision)
    tools = make_file_tools(vision=vision)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import HumanMessage

from deerflow_web.models import ImageLimits
from deerflow_web.services.prompt.images import TurnImages

logger = logging.getLogger(__name__)


def model_accepts_images(model: Any) -> bool | None:
    """What the chat model's profile says about image input; None when it says nothing.

    LangChain chat models carry a `profile` (a dict of capabilities, from the provider's
    data) since langchain-core 1.0; older ones and fakes have none.
    """
    profile = getattr(model, "profile", None)
    if isinstance(profile, Mapping):
        value = profile.get("image_inputs")
    else:
        value = getattr(profile, "image_inputs", None)
    return value if isinstance(value, bool) else None


def vision_enabled(explicit: bool | None, model: Any = None, *, uses_app_settings: bool) -> bool:
    """Whether the agent's model is shown pictures.

    Args:
        explicit: True or False given by the caller wins.
        model: The chat model, asked through its profile when the setting is `auto`.
        uses_app_settings: Read `agent.vision` from the app's settings when no explicit
            value is given (components built on a base dir of their own use `auto`).
    """
    if explicit is not None:
        return explicit
    setting: bool | None = None
    if uses_app_settings:
        from deerflow_web.settings import load_settings  # reads config.yaml: only when needed

        setting = load_settings().agent.vision
    if setting is not None:
        return setting
    return bool(model_accepts_images(model))


def image_limits_for(explicit: ImageLimits | None, *, uses_app_settings: bool) -> ImageLimits:
    """The given limits, else `agent.image_*` from the settings, else the defaults."""
    if explicit is not None:
        return explicit
    if not uses_app_settings:
        return ImageLimits()
    from deerflow_web.settings import load_settings  # reads config.yaml: only when needed

    return load_settings().agent.images


def with_turn_images(message: HumanMessage, images: TurnImages) -> HumanMessage:
    """Return a copy of the message with its pictures after its text.

    String content becomes one text block followed by the pictures; list content keeps
    every element it had (a client's own images too) and gets the pictures at the end.
    The id, name and `additional_kwargs` (`original_user_content` included) are kept.
    """
    parts = images.content_parts()
    if not parts:
        return message
    content = message.content
    head: list[Any]
    if isinstance(content, str):
        head = [{"type": "text", "text": content}] if content else []
    elif isinstance(content, list):
        head = list(content)
    else:  # pragma: no cover - LangChain allows only the two shapes
        logger.warning("message content of type %s left without pictures", type(content))
        return message
    return message.model_copy(update={"content": [*head, *parts]})


__all__ = [
    "image_limits_for",
    "model_accepts_images",
    "vision_enabled",
    "with_turn_images",
]
