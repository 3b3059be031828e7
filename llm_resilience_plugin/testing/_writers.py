"""Putting one exchange on the wire: error bodies, JSON answers, SSE streams, dropped sockets.

The generic writers (:func:`send_error_body`, :func:`send_json`, :func:`send_events`) apply a
behaviour's delays, truncation, cut, stall and malformed event to any dialect's payload; the chat
writers build OpenAI's payloads on top of them. Each writer stamps the request record (status,
finish time) before the last byte leaves, so the log is complete by the time the client sees the
end of the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from dataclasses import dataclass

from aiohttp import web

from llm_resilience_plugin.testing._faults import Behavior, default_message
from llm_resilience_plugin.testing._messages import JSONDict
from llm_resilience_plugin.testing._replies import (
    MALFORMED_EVENT,
    Reply,
    completion_body,
    stream_events,
)
from llm_resilience_plugin.testing._state import MutableRecord

__all__ = [
    "MALFORMED_WITHOUT_TEXT",
    "Call",
    "abort",
    "format_retry_after",
    "send_behavior_error",
    "send_completion",
    "send_error",
    "send_error_body",
    "send_events",
    "send_json",
    "send_stream",
    "sse_event",
]


@dataclass
class Call:
    """Everything a writer needs about one chat request."""

    request: web.Request
    record: MutableRecord
    behavior: Behavior
    body: JSONDict
    deployment: str
    model: str
    stream: bool
    prompt_tokens: int
    number: int


def sse_event(payload: JSONDict, event: str | None = None) -> bytes:
    """One server-sent event: ``data: <compact JSON>``, after ``event: <event>`` when named."""
    data = b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    return (f"event: {event}\n".encode() + data) if event else data


def format_retry_after(value: float | str) -> str:
    """A ``Retry-After`` header value: seconds as given (``2``, ``0.5``), a string as is."""
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def abort(request: web.BaseRequest, *, rst: bool) -> None:
    """Drop the connection: RST (SO_LINGER 0, unsent data discarded) or a flushed FIN close."""
    transport = request.transport
    if transport is None:
        return
    if rst:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()


async def send_error(
    request: web.Request,
    record: MutableRecord,
    deployment: str,
    status: int,
    error: JSONDict,
    retry_after: float | str | None,
) -> web.StreamResponse:
    """An OpenAI-shaped ``{"error": ...}`` body with ``status`` and an optional ``Retry-After``."""
    return await send_error_body(request, record, deployment, status, {"error": error}, retry_after)


async def send_error_body(
    request: web.Request,
    record: MutableRecord,
    deployment: str,
    status: int,
    payload: JSONDict,
    retry_after: float | str | None,
) -> web.StreamResponse:
    """Any dialect's JSON error ``payload`` with ``status`` and an optional ``Retry-After``."""
    headers = {"x-simulator-deployment": deployment, **record.limit_headers}
    if retry_after is not None:
        headers["Retry-After"] = format_retry_after(retry_after)
    response = web.Response(
        status=status,
        reason="Overloaded" if status == 529 else None,
        body=json.dumps(payload, ensure_ascii=False).encode(),
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )
    record.status = status
    record.finish()
    await response.prepare(request)
    await response.write_eof()
    return response


async def send_behavior_error(call: Call) -> web.StreamResponse:
    """The error an ``http_error`` behaviour describes (messages filled in per error code)."""
    behavior = call.behavior
    message = behavior.message
    if message is None:
        if behavior.context_limit is not None:
            message = (
                f"This model's maximum context length is {behavior.context_limit} tokens. "
                f"However, your messages resulted in {call.prompt_tokens} tokens. "
                "Please reduce the length of the messages."
            )
        elif behavior.code == "model_not_found":
            message = (
                f"The model `{call.model or call.deployment}` does not exist or you do not have access to it."
            )
        else:
            message = default_message(behavior.status)
    error = {
        "message": message,
        "type": behavior.error_type,
        "param": None,
        "code": behavior.code,
    }
    return await send_error(
        call.request, call.record, call.deployment, behavior.status, error, behavior.retry_after
    )


# ``malformed_chunk(content=False)``'s event in every dialect: invalid JSON that shows no text value
MALFORMED_WITHOUT_TEXT = b'data: {"id": "broken", "choices": [{"index": 0, "delta": {"role": "assistant"\n\n'


async def send_json(call: Call, body: JSONDict) -> web.StreamResponse:
    """A 200 JSON ``body`` after ``latency + ttft`` (cut in half for ``malformed_chunk``)."""
    behavior = call.behavior
    delay = behavior.latency + behavior.ttft
    if delay > 0:
        await asyncio.sleep(delay)
    payload = json.dumps(body, ensure_ascii=False).encode()
    if behavior.kind == "malformed_chunk":
        payload = payload[: max(1, len(payload) // 2)]
    response = web.Response(
        status=200,
        body=payload,
        content_type="application/json",
        charset="utf-8",
        headers={"x-simulator-deployment": call.deployment, **call.record.limit_headers},
    )
    call.record.status = 200
    call.record.finish()  # before the last byte, so the log is complete when the client sees it
    await response.prepare(call.request)
    await response.write_eof()
    return response


async def send_completion(call: Call, reply: Reply) -> web.StreamResponse:
    """A non-stream ``chat.completion`` after ``latency + ttft`` (truncated for malformed_chunk)."""
    body = completion_body(reply, number=call.number, model=call.model, prompt_tokens=call.prompt_tokens)
    return await send_json(call, body)


async def send_stream(call: Call, reply: Reply) -> web.StreamResponse:
    """The reply as OpenAI SSE chunks, with the behaviour's delays, cut, stall or malformed event."""
    options = call.body.get("stream_options")
    events, closing = stream_events(
        reply,
        number=call.number,
        model=call.model,
        prompt_tokens=call.prompt_tokens,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        done=call.behavior.kind != "no_done",
    )
    return await send_events(call, events, closing, malformed=MALFORMED_EVENT)


async def send_events(
    call: Call,
    events: list[bytes],
    closing: list[bytes],
    *,
    malformed: bytes,
    done: bytes | None = None,
) -> web.StreamResponse:
    """An SSE stream: ``events`` (what ``after_chunks`` counts) then ``closing``, with the
    behaviour's delays, cut, stall, ``malformed`` event, or (``no_done``) without ``done``."""
    behavior = call.behavior
    kind = behavior.kind
    request = call.request
    if kind in ("stream_cut", "stream_stall"):
        events, closing = events[: behavior.after_chunks], []
    elif kind == "malformed_chunk":
        events = list(events)
        bad = malformed if behavior.carries_content else MALFORMED_WITHOUT_TEXT
        for i in reversed(range(behavior.repeat)):  # one good chunk between two bad ones
            at = min(behavior.after_chunks + i * (2 if behavior.replace else 1), len(events))
            if behavior.replace and at < len(events):
                events[at] = bad  # that event's text is lost with it
            else:
                events.insert(at, bad)
    elif kind == "no_done" and done is not None:
        closing = [c for c in closing if c != done]
    if behavior.latency > 0:
        await asyncio.sleep(behavior.latency)
    response = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-simulator-deployment": call.deployment,
            **call.record.limit_headers,
        },
    )
    if kind == "no_done":
        response.force_close()
    await response.prepare(request)
    call.record.status = 200
    if behavior.ttft > 0:
        await asyncio.sleep(behavior.ttft)
    if behavior.chunk_delay > 0:
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(behavior.chunk_delay)
            await response.write(event)
        tail = b"".join(closing)
    else:
        tail = b"".join(events + closing)
    if kind == "stream_cut":
        if tail:
            await response.write(tail)
        call.record.finish()
        abort(request, rst=False)
        return response
    if kind == "stream_stall":
        if tail:
            await response.write(tail)
        await asyncio.sleep(behavior.seconds)
        call.record.finish()
        abort(request, rst=True)
        return response
    call.record.finish()  # before the last byte, so the log is complete when the client sees it
    await response.write_eof(tail)
    return response
