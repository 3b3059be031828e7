"""Skipping one unparseable SSE event in place, so an otherwise intact stream keeps going.

The OpenAI SDK under LiteLLM decodes each ``data:`` event with ``json.loads`` inside the async
generator of ``openai.AsyncStream``; one invalid event ends that generator for good. The plugin
therefore puts :class:`EventSkipper` in front of the SDK's own SSE decoder of one stream (the
stream's ``_decoder``, swapped before the stream is first read): events arrive exactly as the SDK
splits them, and an invalid one is dropped when all of these hold:

* its raw text is a cut or garbled JSON object (or empty) that shows no value that could be part of
  the answer (:func:`shows_content`: a non-empty ``content``/``text``/``arguments``/
  ``partial_json``/... value, a tool call, an error, or a key cut off where such a value would
  start);
* fewer than :data:`MAX_SKIPPED_EVENTS` events were dropped in this stream before;
* the stream still shows a finish reason (before or after the dropped event) by its ``[DONE]`` or
  its end; if it does not, the dropped event's own ``JSONDecodeError`` is raised there, so the
  stream breaks exactly as it would have without the skipper.

Anything else (a valid event, ``[DONE]``, an event that may carry text, one over the cap) reaches
the SDK unchanged, so it fails as before and the router resumes the answer elsewhere.
Valid events are parsed once here and handed on with the parsed value (the SDK does not parse
them again). Reached where the plugin holds LiteLLM's ``CustomStreamWrapper`` over an
``openai.AsyncStream`` before it is read: direct dispatch, OpenAI-SDK providers (``openai/``,
``azure/``, OpenAI-compatible ones). See docs/streaming.md for where it is not.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from llm_resilience_plugin import _litellm

MAX_SKIPPED_EVENTS = 1
"""Invalid events one stream may drop; the next one breaks the stream as before."""

# Keys whose value is (part of) the answer: message text, reasoning, tool calls, refusals, and an
# error payload (an error must never be skipped as if it were noise).
_ANSWER_KEYS = (
    "content",
    "text",
    "arguments",
    "partial_json",
    "reasoning_content",
    "reasoning",
    "thinking",
    "refusal",
    "tool_calls",
    "function_call",
    "name",
    "input",
    "audio",
    "error",
)
_KEY = re.compile('"(' + "|".join(_ANSWER_KEYS) + ')"')
_EMPTY_VALUE = re.compile(r'\s*:\s*(?:""|null\b|\[\s*\]|\{\s*\})')
_KEY_END = re.compile(r"\s*(?::|$)")  # a key (followed by its colon, or cut right there)


def shows_content(raw: str) -> bool:
    """Could the raw text of an invalid event carry part of the answer? True when an answer key has
    a value that is not empty or is cut before its value, or the text ends inside a key that could
    be one. Text that is not a JSON object or array at all (a bare word could be an answer sent
    as plain text) counts as content; an empty event does not."""
    head = raw.lstrip()[:1]
    if head not in ("{", "[", ""):
        return True
    for match in _KEY.finditer(raw):
        end = match.end()
        if _KEY_END.match(raw, end) and not _EMPTY_VALUE.match(raw, end):
            return True
    cut = _open_string(raw)
    if cut is None:
        return False
    fragment = raw[cut:]
    before = raw[: cut - 1].rstrip()
    in_key_position = not before or before[-1] in "{,"
    return in_key_position and any(k.startswith(fragment) for k in _ANSWER_KEYS)


def _open_string(raw: str) -> int | None:
    """Where the string the text ends inside starts (after its quote), or None when it ends
    outside any string."""
    start: int | None = None
    escaped = False
    for i, ch in enumerate(raw):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = start is not None
        elif ch == '"':
            start = i + 1 if start is None else None
    return start


def _finishes(data: Any) -> bool:
    """Does a parsed chunk carry a finish reason (OpenAI chat/text chunks)?"""
    if not isinstance(data, dict):
        return False
    choices = data.get("choices")
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


@functools.cache
def parsed_event_type() -> type[Any] | None:
    """The SDK's ``ServerSentEvent`` with ``json()`` returning a value already parsed (so the SDK
    does not parse the event again); None if the SDK has no such class (then nothing is skipped)."""
    base: Any = _litellm.internals().sse_event
    if base is None:  # pragma: no cover - another SDK layout (capability sse_skipping)
        return None

    class ParsedEvent(base):  # type: ignore[misc,valid-type]
        def __init__(self, sse: Any, value: Any) -> None:
            super().__init__(event=sse.event, data=sse.data, id=sse.id, retry=sse.retry)
            self._value = value

        def json(self) -> Any:
            return self._value

    return ParsedEvent


class EventSkipper:
    """One stream's SSE decoder: the SDK's own, with at most :data:`MAX_SKIPPED_EVENTS` invalid,
    text-free events dropped (see the module docstring); ``skipped`` counts the drops that held."""

    def __init__(self, inner: Any, limit: int = MAX_SKIPPED_EVENTS) -> None:
        self._inner = inner
        self._limit = limit
        self._parsed = parsed_event_type()
        self.skipped = 0

    def iter_bytes(self, iterator: Iterator[bytes]) -> Iterator[Any]:
        """The sync twin is the SDK's own (the plugin swaps only async streams)."""
        return self._inner.iter_bytes(iterator)  # type: ignore[no-any-return]

    async def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        """The SDK decoder's events, an invalid text-free one dropped (see the module docstring)."""
        pending: ValueError | None = None  # the dropped event's error, until a finish reason shows
        finished = False
        async for sse in self._inner.aiter_bytes(iterator):
            data = sse.data
            if data.startswith("[DONE]") or (sse.event and sse.event.startswith("thread.")):
                if pending is not None and not finished:
                    self._unskip(pending)
                yield sse
                continue
            try:
                value = json.loads(data)
            except ValueError as exc:
                if self.skipped < self._limit and not shows_content(data):
                    self.skipped += 1
                    pending = exc
                    continue
                yield sse  # the SDK parses it and raises, as without the skipper
                continue
            if not finished and _finishes(value):
                finished = True
            yield sse if self._parsed is None else self._parsed(sse, value)
        if pending is not None and not finished:
            self._unskip(pending)

    def _unskip(self, error: ValueError) -> None:
        """No finish reason came after all: the dropped event ends the stream as a break."""
        self.skipped -= 1
        raise error


def skip_malformed_events(response: Any) -> EventSkipper | None:
    """Put an :class:`EventSkipper` in front of the SDK decoder of LiteLLM stream ``response``
    (before anything read it); None where the stream is not an unread ``openai.AsyncStream``."""
    inner = getattr(response, "completion_stream", None)
    if inner is None:
        return None
    decoder = _litellm.sdk_stream_decoder(inner)  # None unless an openai.AsyncStream
    if isinstance(decoder, EventSkipper):
        return decoder
    if decoder is None or not hasattr(decoder, "aiter_bytes") or not _unread(inner):
        return None
    if parsed_event_type() is None:
        return None
    skipper = EventSkipper(decoder)
    _litellm.set_sdk_stream_decoder(inner, skipper)
    return skipper


def _unread(stream: Any) -> bool:
    """Has the SDK stream's generator not started (so it has not taken its decoder yet)?"""
    gen: Any = _litellm.sdk_stream_generator(stream)
    state = getattr(inspect, "getasyncgenstate", None)  # Python 3.12+
    if state is not None:
        return inspect.isasyncgen(gen) and state(gen) == "AGEN_CREATED"
    frame = getattr(gen, "ag_frame", None)
    return frame is not None and not gen.ag_running and frame.f_lasti <= 0 and gen.ag_await is None


__all__ = [
    "MAX_SKIPPED_EVENTS",
    "EventSkipper",
    "parsed_event_type",
    "shows_content",
    "skip_malformed_events",
]
