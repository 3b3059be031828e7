"""Reading stream chunks of every streaming operation alike: chat chunks (``choices[].delta``),
text-completion chunks (``choices[].text``) and Responses API events (``type``, ``delta``).

The router's streams (:mod:`._streams`) ask these what a chunk carries, so one stream class
serves chat, ``text_completion`` and ``responses``.
"""

from __future__ import annotations

from typing import Any

from llm_resilience_plugin.events import usage_of

# Responses API events that end a response (their ``response.status`` is the finish reason).
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete"})


def _event_type(chunk: Any) -> str | None:
    kind = getattr(chunk, "type", None)
    kind = getattr(kind, "value", kind)  # LiteLLM's event types are str enums
    return kind if isinstance(kind, str) else None


def chunk_has_payload(chunk: Any) -> bool:
    """Does ``chunk`` carry content, a tool call or an end (what a stream's first chunk must)?"""
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        if delta is not None and (getattr(delta, "content", None) or getattr(delta, "tool_calls", None)):
            return True
        if delta is None and getattr(choice, "text", None):
            return True
        if getattr(choice, "finish_reason", None):
            return True
    kind = _event_type(chunk)
    return kind is not None and (kind.endswith(".delta") or kind in _RESPONSE_ENDS)


def chunk_text(chunk: Any) -> str:
    """The text a chunk adds to the answer (choice 0, or an ``output_text.delta`` event)."""
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        text = getattr(delta, "content", None) if delta is not None else getattr(choice, "text", None)
        return text if isinstance(text, str) else ""
    if _event_type(chunk) == "response.output_text.delta":
        text = getattr(chunk, "delta", None)
        return text if isinstance(text, str) else ""
    return ""


def done_text(chunk: Any) -> str | None:
    """The whole text a Responses ``output_text.done`` event states for its part, else None."""
    if _event_type(chunk) != "response.output_text.done":
        return None
    text = getattr(chunk, "text", None)
    return text if isinstance(text, str) else None


def set_chunk_text(chunk: Any, text: str) -> None:
    """Replace the text :func:`chunk_text` reads (a resumed stream drops what was delivered)."""
    choices = getattr(chunk, "choices", None) or []
    if choices:
        delta = getattr(choices[0], "delta", None)
        if delta is not None:
            delta.content = text
        else:
            choices[0].text = text
    else:
        chunk.delta = text


def chunk_has_tool_call(chunk: Any) -> bool:
    """Does ``chunk`` carry (part of) a tool call?"""
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        if delta is not None and getattr(delta, "tool_calls", None):
            return True
    return _event_type(chunk) == "response.function_call_arguments.delta"


def chunk_finish(chunk: Any) -> str | None:
    """The finish reason a chunk carries (a Responses event's final status), else None."""
    for choice in getattr(chunk, "choices", None) or []:
        reason = getattr(choice, "finish_reason", None)
        if reason:
            return str(reason)
    if _event_type(chunk) in _RESPONSE_ENDS:
        status = getattr(getattr(chunk, "response", None), "status", None)
        return str(status or "completed")
    return None


def chunk_usage(chunk: Any) -> dict[str, int] | None:
    """Token usage a chunk reports (a Responses end event: its response's usage)."""
    usage = usage_of(chunk)
    if usage is None and _event_type(chunk) in _RESPONSE_ENDS:
        usage = usage_of(getattr(chunk, "response", None))
    return usage


def chunk_model(chunk: Any) -> str | None:
    """The model a chunk names (a Responses event: its response's model)."""
    model = getattr(chunk, "model", None)
    if not model:
        model = getattr(getattr(chunk, "response", None), "model", None)
    return model if isinstance(model, str) and model else None


def is_usage_only(chunk: Any) -> bool:
    """The usage-only last chunk of a chat or text stream: ``choices == []``, or (LiteLLM 1.105
    to 1.108) one choice with an empty delta and no finish reason beside the usage."""
    if _event_type(chunk) is not None:
        return False
    choices = getattr(chunk, "choices", None)
    if not choices:
        return True
    return usage_of(chunk) is not None and all(_empty_choice(c) for c in choices)


_DELTA_FIELDS = ("content", "tool_calls", "function_call", "audio", "reasoning_content", "thinking_blocks")


def _empty_choice(choice: Any) -> bool:
    if getattr(choice, "finish_reason", None) is not None:
        return False
    delta = getattr(choice, "delta", None)
    if delta is None:
        return getattr(choice, "text", None) in (None, "")
    return all(getattr(delta, f, None) in (None, "", []) for f in _DELTA_FIELDS)
