"""The SSE event skipper (routing/_sse_skip.py) over the OpenAI SDK's own decoder, socket-free:
which invalid events it drops, what it never touches, and its swap into an unread SDK stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI, AsyncStream
from openai._streaming import SSEDecoder

import llm_resilience_plugin  # noqa: F401  (offline switches first)
from llm_resilience_plugin.routing._sse_skip import EventSkipper, shows_content, skip_malformed_events

CHUNK = '{"choices": [{"index": 0, "delta": {"content": "%s"}, "finish_reason": null}]}'
FINISH = '{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}'
NO_TEXT_BAD = '{"id": "broken", "choices": [{"index": 0, "delta": {"role": "assistant"'
TEXT_BAD = '{"id": "broken", "choices": [{"delta": {"content": "oops"'


def sse(*datas: str, end: str = "\n") -> bytes:
    return "".join(f"data: {d}{end}{end}" for d in datas).encode()


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def events(raw: bytes | list[bytes], skipper: EventSkipper | None = None) -> list[Any]:
    """The events the skipper hands the SDK, each decoded as the SDK does (``json()``)."""
    sk = skipper or EventSkipper(SSEDecoder())
    parts = raw if isinstance(raw, list) else [raw]
    out: list[Any] = []
    async for ev in sk.aiter_bytes(_chunks(*parts)):
        out.append("[DONE]" if ev.data.startswith("[DONE]") else ev.json())
    return out


def split_every(raw: bytes, n: int) -> list[bytes]:
    return [raw[i : i + n] for i in range(0, len(raw), n)]


async def test_one_text_free_invalid_event_is_dropped_and_counted() -> None:
    sk = EventSkipper(SSEDecoder())
    got = await events(sse(CHUNK % "a", NO_TEXT_BAD, CHUNK % "b", FINISH, "[DONE]"), sk)
    assert got == [json.loads(CHUNK % "a"), json.loads(CHUNK % "b"), json.loads(FINISH), "[DONE]"]
    assert sk.skipped == 1


@pytest.mark.parametrize("size", [1, 3, 7, 64])
@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
async def test_event_boundaries_split_across_byte_chunks_and_any_line_ending(size: int, end: str) -> None:
    sk = EventSkipper(SSEDecoder())
    raw = sse(CHUNK % "a", NO_TEXT_BAD, CHUNK % "b", FINISH, "[DONE]", end=end)
    got = await events(split_every(raw, size), sk)
    assert [g if g == "[DONE]" else g["choices"][0]["delta"].get("content") for g in got] == [
        "a",
        "b",
        None,
        "[DONE]",
    ]
    assert sk.skipped == 1


async def test_multi_line_data_and_comments_are_the_sdks_own() -> None:
    sk = EventSkipper(SSEDecoder())
    raw = (
        b": keep-alive comment\n\n"
        b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": "x"}}]}\n\n'  # one event, two lines
        b'data: {"id": "broken",\ndata: "choices": [\n\n'  # invalid over two lines, no text
        + sse(FINISH, "[DONE]")
    )
    got = await events(raw, sk)
    assert got[0]["choices"][0]["delta"]["content"] == "x" and got[1] == json.loads(FINISH)
    assert got[2] == "[DONE]" and sk.skipped == 1


async def test_an_invalid_event_that_may_carry_text_reaches_the_sdk_unchanged() -> None:
    sk = EventSkipper(SSEDecoder())
    with pytest.raises(json.JSONDecodeError):
        await events(sse(CHUNK % "a", TEXT_BAD, CHUNK % "b", FINISH), sk)
    assert sk.skipped == 0


async def test_over_the_cap_the_next_invalid_event_breaks_the_stream() -> None:
    sk = EventSkipper(SSEDecoder())
    with pytest.raises(json.JSONDecodeError):
        await events(sse(CHUNK % "a", NO_TEXT_BAD, CHUNK % "b", NO_TEXT_BAD, FINISH), sk)
    assert sk.skipped == 1


async def test_no_finish_reason_after_a_drop_breaks_at_done_and_at_the_end() -> None:
    for raw in (sse(CHUNK % "a", NO_TEXT_BAD, CHUNK % "b", "[DONE]"), sse(CHUNK % "a", NO_TEXT_BAD)):
        sk = EventSkipper(SSEDecoder())
        with pytest.raises(json.JSONDecodeError):
            await events(raw, sk)
        assert sk.skipped == 0  # it turned out to be a break, not a skip


async def test_a_drop_after_the_finish_reason_stands() -> None:
    sk = EventSkipper(SSEDecoder())
    got = await events(sse(CHUNK % "a", FINISH, NO_TEXT_BAD, "[DONE]"), sk)
    assert got[-1] == "[DONE]" and sk.skipped == 1


async def test_done_and_valid_events_pass_untouched() -> None:
    sk = EventSkipper(SSEDecoder())
    got = await events(sse(CHUNK % "a", FINISH, "[DONE]", CHUNK % "late"), sk)
    assert got == [json.loads(CHUNK % "a"), json.loads(FINISH), "[DONE]", json.loads(CHUNK % "late")]
    assert sk.skipped == 0


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (TEXT_BAD, True),
        (NO_TEXT_BAD, False),
        ('{"choices": [{"delta": {"content": ""}', False),
        ('{"choices": [{"delta": {"content": null, "role": "assis', False),
        ('{"choices": [{"delta": {"cont', True),  # cut inside a key that could be "content"
        ('{"choices": [{"delta": {"content"', True),
        ('{"choices": [{"delta": {"content": ', True),
        ('{"choices": [{"delta": {"tool_calls": [{"index": 0', True),
        ('{"choices": [{"delta": {"function_call": {"arguments": "{\\"a', True),
        ('{"type": "content_block_delta", "delta": {"partial_json": "{\\"c', True),
        ('{"error": {"message": "overloaded"', True),
        ('{"type": "text", "ind', False),  # "text" as a value, not a key
        ('{"id": "chatcmpl-1', False),
        ("", False),
        ("Hello there", True),  # plain text could be the answer itself
    ],
)
def test_shows_content(raw: str, shown: bool) -> None:
    assert shows_content(raw) is shown


def _sdk_stream(body: bytes) -> Any:
    """LiteLLM's view of an OpenAI stream: an object whose ``completion_stream`` is the SDK's
    ``AsyncStream`` over an in-memory response."""
    response = httpx2.Response(
        200,
        content=body,
        headers={"content-type": "text/event-stream"},
        request=httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions"),
    )
    client = AsyncOpenAI(api_key="sk-unit", base_url="http://127.0.0.1/v1")
    stream = AsyncStream(cast_to=dict, response=response, client=client)

    class Wrapper:
        completion_stream = stream

    return Wrapper()


async def test_swapped_into_an_unread_sdk_stream() -> None:
    wrapper = _sdk_stream(sse(CHUNK % "a", NO_TEXT_BAD, CHUNK % "b", FINISH, "[DONE]"))
    sk = skip_malformed_events(wrapper)
    assert sk is not None and skip_malformed_events(wrapper) is sk  # once per stream
    got = [c async for c in wrapper.completion_stream]
    assert [c["choices"][0]["delta"].get("content") for c in got] == ["a", "b", None]
    assert sk.skipped == 1


async def test_not_swapped_into_a_started_stream_or_a_foreign_one() -> None:
    wrapper = _sdk_stream(sse(CHUNK % "a", FINISH, "[DONE]"))
    await wrapper.completion_stream.__anext__()
    assert skip_malformed_events(wrapper) is None
    assert skip_malformed_events(object()) is None

    class NotSdk:
        completion_stream = _chunks(b"")

    assert skip_malformed_events(NotSdk()) is None
