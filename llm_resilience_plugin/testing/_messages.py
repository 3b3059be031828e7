"""Reading a chat request's messages: their text, the token estimates, the default reply text.

Shared by the reply builder and the schema faker, so it depends on nothing else in the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "JSONDict",
    "content_text",
    "default_text",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "last_text",
]

JSONDict = dict[str, Any]

_IMAGE_TOKENS = 85


def estimate_tokens(text: str) -> int:
    """The simulator's token estimate for a piece of text: ``ceil(len(text) / 4)``."""
    return (len(text) + 3) // 4


def content_text(content: Any) -> tuple[str, int]:
    """(concatenated text, number of image parts) of a message ``content``."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if isinstance(content, list):
        texts: list[str] = []
        images = 0
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind in ("image_url", "input_image", "image"):
                    images += 1
                elif isinstance(part.get("text"), str):
                    texts.append(part["text"])
        return "".join(texts), images
    return str(content), 0


def estimate_prompt_tokens(messages: Sequence[Any]) -> int:
    """``sum(4 + estimate_tokens(text) + 85 * images for each message) + 2``."""
    total = 2
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else message
        text, images = content_text(content)
        total += 4 + estimate_tokens(text) + _IMAGE_TOKENS * images
    return total


def last_text(messages: Sequence[Any], role: str) -> str:
    """The text of the last message with ``role`` (``""`` when there is none)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == role:
            return content_text(message.get("content"))[0]
    return ""


def default_text(deployment: str, user_text: str) -> str:
    """``"Hello from <deployment>. You said: <first 12 words of user_text>."``"""
    words = user_text.split()[:12]
    excerpt = " ".join(words).rstrip(".!?;:, ")
    if not excerpt:
        return f"Hello from {deployment}."
    return f"Hello from {deployment}. You said: {excerpt}."
