"""Reply building: what the simulated model says to a chat request, and OpenAI's wire format for it.

:func:`build_reply` decides the content (text, tool call or structured output, cut by ``stop`` and
``max_tokens``); :func:`completion_body` and :func:`stream_events` serialise it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_resilience_plugin.testing._messages import (
    JSONDict,
    content_text,
    default_text,
    estimate_tokens,
    last_text,
)
from llm_resilience_plugin.testing._schema import pick_tool, structured_text, tool_arguments

__all__ = [
    "MALFORMED_EVENT",
    "Reply",
    "build_reply",
    "completion_body",
    "stream_events",
]

MALFORMED_EVENT = b'data: {"id": "broken", "choices": [{"delta": {"content": "oops"\n\n'
_DONE_EVENT = b"data: [DONE]\n\n"
_WORD_RE = re.compile(r"\s*\S+\s*")
_TOOL_ARG_FRAGMENT = 16


@dataclass
class Reply:
    """One generated reply: its content split into word chunks, or a single tool call."""

    content: str | None
    words: list[str]
    finish_reason: str
    completion_tokens: int
    tool_call: JSONDict | None = None


def _split_words(text: str) -> list[str]:
    return _WORD_RE.findall(text)


def _apply_limits(text: str, body: Mapping[str, Any]) -> tuple[list[str], str]:
    finish = "stop"
    stop = body.get("stop")
    sequences = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    cut = len(text)
    for seq in sequences:
        if isinstance(seq, str) and seq:
            position = text.find(seq)
            if 0 <= position < cut:
                cut = position
    words = _split_words(text[:cut])
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < len(words):
        words = words[:limit]
        finish = "length"
    return words, finish


def _prefill(messages: list[Any]) -> str | None:
    """The text of a trailing assistant prefill (``{"role": "assistant", "prefix": True}``), if any."""
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") != "assistant" or not last.get("prefix"):
        return None
    return content_text(last.get("content"))[0]


def _continued(reply: Reply, prefill: str) -> Reply:
    """What a model continuing ``prefill`` says: the rest of its own answer when that starts with
    the prefill, else its answer after as many words as the prefill holds (the continuation of
    a text it did not write); limits count the continuation only."""
    if reply.content is None:
        return reply
    if reply.content.startswith(prefill):
        words = _split_words(reply.content[len(prefill) :])
    else:
        words = reply.words[len(_split_words(prefill)) :]
    return Reply("".join(words), words, reply.finish_reason, len(words))


def build_reply(body: Mapping[str, Any], deployment: str, text: str | None) -> Reply:
    """The reply to a chat request ``body``; a fixed ``text`` skips tool calls and structured output.
    A trailing assistant prefill is continued (see :func:`_continued`)."""
    raw_messages = body.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    prefill = _prefill(messages)
    if prefill is not None:
        reply = build_reply({**body, "messages": messages[:-1]}, deployment, text)
        return _continued(reply, prefill)
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    user_text = last_text(messages, "user")
    if text is None:
        if last.get("role") == "tool":
            text = f"The tool returned: {content_text(last.get('content'))[0]}."
        else:
            function = pick_tool(body.get("tools"), body.get("tool_choice", "auto"), user_text)
            if function is not None:
                arguments = tool_arguments(function, user_text)
                call = {"name": function["name"], "arguments": arguments}
                return Reply(
                    content=None,
                    words=[],
                    finish_reason="tool_calls",
                    completion_tokens=estimate_tokens(arguments) + 5,
                    tool_call=call,
                )
            text = structured_text(body, messages, user_text)
            if text is None:
                text = default_text(deployment, user_text)
    words, finish = _apply_limits(text, body)
    return Reply(content="".join(words), words=words, finish_reason=finish, completion_tokens=len(words))


def _usage(prompt_tokens: int, reply: Reply) -> JSONDict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": prompt_tokens + reply.completion_tokens,
    }


def _sse(payload: JSONDict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def completion_body(reply: Reply, *, number: int, model: str, prompt_tokens: int) -> JSONDict:
    """A ``chat.completion`` object for response ``number`` (ids ``chatcmpl-sim-<number>``)."""
    message: JSONDict = {"role": "assistant", "content": reply.content}
    if reply.tool_call is not None:
        message["tool_calls"] = [
            {"id": f"call_sim_{number}", "type": "function", "function": reply.tool_call}
        ]
    return {
        "id": f"chatcmpl-sim-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "sim",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": _usage(prompt_tokens, reply),
    }


def stream_events(
    reply: Reply,
    *,
    number: int,
    model: str,
    prompt_tokens: int,
    include_usage: bool,
    done: bool,
) -> tuple[list[bytes], list[bytes]]:
    """(content events, closing events: finish chunk, usage chunk, ``[DONE]``) as SSE bytes."""
    base: JSONDict = {
        "id": f"chatcmpl-sim-{number}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "sim",
    }

    def chunk(delta: JSONDict, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**base, "choices": [choice]})

    deltas: list[JSONDict]
    if reply.tool_call is not None:
        arguments = reply.tool_call["arguments"]
        first = {
            "index": 0,
            "id": f"call_sim_{number}",
            "type": "function",
            "function": {"name": reply.tool_call["name"], "arguments": ""},
        }
        deltas = [{"role": "assistant", "content": None, "tool_calls": [first]}]
        for i in range(0, len(arguments), _TOOL_ARG_FRAGMENT):
            fragment = arguments[i : i + _TOOL_ARG_FRAGMENT]
            deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})
    elif reply.words:
        deltas = [{"role": "assistant", "content": reply.words[0]}]
        deltas.extend({"content": word} for word in reply.words[1:])
    else:
        deltas = [{"role": "assistant", "content": ""}]
    events = [chunk(d) for d in deltas]
    closing = [chunk({}, reply.finish_reason)]
    if include_usage:
        closing.append(_sse({**base, "choices": [], "usage": _usage(prompt_tokens, reply)}))
    if done:
        closing.append(_DONE_EVENT)
    return events, closing
