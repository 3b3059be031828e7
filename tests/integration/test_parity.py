"""Drop-in parity: the same calls through a plain ``litellm.Router`` and through
``ResilientRouter`` (same model_list, the simulator) give the caller the same thing.

Responses and chunk sequences are compared field by field after :func:`normalize`, which only
replaces the allow-listed volatile fields (ids, ``created``) by their checked shape; see
``tests/integration/_parity.py`` for the allow-list and the reason for each entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import litellm
import pytest

from llm_resilience_plugin import ResilientRouter
from tests.integration._parity import chunk_shapes, close_all, hidden_view, normalize, router_pair, usage_only

MSG = [{"role": "user", "content": "tell me about the weather in 'Paris' for 3 days"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "forecast",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "high": {"type": "number"},
                "sunny": {"type": "boolean"},
            },
            "required": ["city", "high", "sunny"],
            "additionalProperties": False,
        },
    },
}

CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "tools": {"tools": TOOLS},
    "tool_choice": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "structured": {"response_format": SCHEMA},
    "n2": {"n": 2},
    "max_tokens": {"max_tokens": 3},
    "stop": {"stop": ["weather"]},
}


@pytest.fixture
def pair(sim) -> Iterator[tuple[litellm.Router, ResilientRouter]]:
    routers = router_pair(sim)
    yield routers
    close_all(routers)


def _same_response(plain: Any, ours: Any) -> None:
    assert type(ours) is type(plain)
    assert normalize(ours) == normalize(plain)
    assert hidden_view(ours) == hidden_view(plain)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sync_completion_matches(pair, case: str) -> None:
    plain, ours = pair
    kwargs = CASES[case]
    _same_response(
        plain.completion(model="g", messages=MSG, **kwargs),
        ours.completion(model="g", messages=MSG, **kwargs),
    )


@pytest.mark.parametrize("case", sorted(CASES))
async def test_async_completion_matches(pair, case: str) -> None:
    plain, ours = pair
    kwargs = CASES[case]
    expected = await plain.acompletion(model="g", messages=MSG, **kwargs)
    got = await ours.acompletion(model="g", messages=MSG, **kwargs)
    _same_response(expected, got)


async def test_structured_output_and_tool_arguments_parse_the_same(pair) -> None:
    plain, ours = pair
    for kwargs in (CASES["structured"], CASES["tools"]):
        a = await plain.acompletion(model="g", messages=MSG, **kwargs)
        b = await ours.acompletion(model="g", messages=MSG, **kwargs)
        if "tools" in kwargs:
            args = [json.loads(r.choices[0].message.tool_calls[0].function.arguments) for r in (a, b)]
            assert args[0] == args[1] == {"city": "Paris", "days": 3}
        else:
            assert json.loads(a.choices[0].message.content) == json.loads(b.choices[0].message.content)


async def _achunks(router: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
    stream = await router.acompletion(model="g", messages=MSG, stream=True, **kwargs)
    return stream, [c async for c in stream]


def _chunks(router: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
    stream = router.completion(model="g", messages=MSG, stream=True, **kwargs)
    return stream, list(stream)


STREAM_CASES: dict[str, dict[str, Any]] = {
    **{k: v for k, v in CASES.items() if k not in ("tool_choice",)},
    "include_usage": {"stream_options": {"include_usage": True}},
    "no_usage_asked": {"stream_options": {"include_usage": False}},
}


def _same_stream(plain_chunks: list[Any], our_chunks: list[Any]) -> None:
    assert [type(c) for c in our_chunks] == [type(c) for c in plain_chunks]
    assert chunk_shapes(our_chunks) == chunk_shapes(plain_chunks)
    # what a `chunk.choices[0].delta.content` loop sees: never an IndexError unless the plain one has it
    assert [bool(c.choices) for c in our_chunks] == [bool(c.choices) for c in plain_chunks]
    with_content = [
        sum(1 for c in cs if c.choices and c.choices[0].delta.content) for cs in (plain_chunks, our_chunks)
    ]
    assert with_content[0] == with_content[1]


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
async def test_async_stream_chunks_match(pair, case: str) -> None:
    plain, ours = pair
    kwargs = STREAM_CASES[case]
    _, expected = await _achunks(plain, **kwargs)
    _, got = await _achunks(ours, **kwargs)
    _same_stream(expected, got)
    usage_chunks = [c for c in got if usage_only(c)]
    asked = bool(kwargs.get("stream_options", {}).get("include_usage"))
    assert bool(usage_chunks) is asked  # the usage-only last chunk only when the caller asked
    if asked:
        assert usage_chunks[-1] is got[-1] and got[-1].usage.total_tokens > 0


@pytest.mark.parametrize("case", ["plain", "tools", "include_usage", "n2"])
def test_sync_stream_chunks_match(pair, case: str) -> None:
    plain, ours = pair
    _, expected = _chunks(plain, **STREAM_CASES[case])
    _, got = _chunks(ours, **STREAM_CASES[case])
    _same_stream(expected, got)


@pytest.mark.parametrize("case", ["plain", "tools", "structured", "include_usage"])
async def test_stream_chunk_builder_gives_the_same_message(pair, case: str) -> None:
    """Callers rebuild a response from chunks with ``litellm.stream_chunk_builder``."""
    plain, ours = pair
    _, expected = await _achunks(plain, **STREAM_CASES[case])
    _, got = await _achunks(ours, **STREAM_CASES[case])
    a = litellm.stream_chunk_builder(expected, messages=MSG)
    b = litellm.stream_chunk_builder(got, messages=MSG)
    assert normalize(b.choices) == normalize(a.choices)
    if STREAM_CASES[case].get("stream_options", {}).get("include_usage"):
        assert normalize(b.usage) == normalize(a.usage)
    else:
        # Allowed difference: without include_usage a plain Router's stream carries LiteLLM's own
        # token *estimate* (hidden in the last chunk); the plugin asked the provider, so it carries
        # the provider's count. Same fields, the values may differ; the plugin's is priced (a
        # plain Router's estimate is priced from LiteLLM 1.109 on).
        assert set(normalize(b.usage)) == set(normalize(a.usage)) | {"cost"}
        assert b.usage.total_tokens > 0 and b.usage.cost
