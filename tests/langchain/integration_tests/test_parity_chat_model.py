"""Drop-in parity of the chat model: ResilientChatModel and langchain-litellm's ChatLiteLLMRouter
over the same deployment give the same message shapes for invoke, stream and tool calls.

Allowed differences, each deliberate: ``response_metadata["model_name"]`` is the model that
answered (ChatLiteLLMRouter puts the group name there; ours keeps it under ``model_group``);
ours adds ``model_group``, ``resilience`` (the call report) and, on streams,
``system_fingerprint``; ``model_provider`` names the provider that answered (``"openai"``; issue
#15) where ChatLiteLLMRouter says ``"litellm"``; a ChatLiteLLMRouter stream carries LiteLLM's
local token estimate (with ``output_token_details``) where ours carries the provider's count;
chunk counts differ by empty chunks (the count of chunks with content is equal).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import litellm
import pytest
from langchain_core.messages import AIMessage, BaseMessageChunk
from langchain_litellm import ChatLiteLLMRouter

from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing._simulator import ProviderSimulator
from tests.conftest import FAST_POLICY, deployment

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PROMPT = "what is the weather in 'Paris'?"
USAGE = ("input_tokens", "output_tokens", "total_tokens")


@pytest.fixture
def models(sim: ProviderSimulator) -> Iterator[tuple[Any, ResilientChatModel]]:
    model_list = [deployment(sim, "g", "a")]
    plain = ChatLiteLLMRouter(router=litellm.Router(model_list=[dict(d) for d in model_list]), model_name="g")
    ours = ResilientChatModel(model_list=model_list, model="g", policy=FAST_POLICY)
    yield plain, ours
    ours.close()


def _same_metadata(plain: AIMessage, ours: AIMessage) -> None:
    assert set(plain.response_metadata) - {"token_usage"} <= set(ours.response_metadata)
    for key in ("finish_reason", "model_id"):
        assert ours.response_metadata[key] == plain.response_metadata[key], key
    # issue #15: the provider that answered, where ChatLiteLLMRouter says "litellm"
    assert (plain.response_metadata["model_provider"], ours.response_metadata["model_provider"]) == (
        "litellm",
        "openai",
    )
    assert ours.response_metadata["model_group"] == plain.response_metadata["model_name"] == "g"
    assert plain.usage_metadata and ours.usage_metadata
    assert {k: ours.usage_metadata[k] for k in USAGE} == {k: plain.usage_metadata[k] for k in USAGE}  # type: ignore[literal-required]


def test_invoke_gives_the_same_message(models) -> None:
    plain, ours = models
    a, b = plain.invoke(PROMPT), ours.invoke(PROMPT)
    assert type(a) is type(b) is AIMessage
    assert a.content == b.content and a.tool_calls == b.tool_calls == []
    _same_metadata(a, b)
    assert set(a.response_metadata) <= set(b.response_metadata)


def test_tool_calls_are_the_same(models) -> None:
    a, b = (m.bind_tools([TOOL]).invoke(PROMPT) for m in models)
    strip = [{k: v for k, v in c.items() if k != "id"} for c in a.tool_calls]
    assert strip == [{k: v for k, v in c.items() if k != "id"} for c in b.tool_calls]
    assert strip == [{"name": "get_weather", "args": {"city": "Paris"}, "type": "tool_call"}]
    assert a.content == b.content == ""
    _same_metadata(a, b)


@pytest.mark.parametrize("tools", [False, True])
def test_stream_gives_the_same_message(models, tools: bool) -> None:
    runs = []
    for m in models:
        chunks = list((m.bind_tools([TOOL]) if tools else m).stream(PROMPT))
        full: BaseMessageChunk = chunks[0]
        for c in chunks[1:]:
            full = full + c
        runs.append((chunks, full))
    (pc, a), (oc, b) = runs
    assert a.content == b.content
    assert sum(1 for c in pc if c.content) == sum(1 for c in oc if c.content)
    assert [(t["name"], t["args"]) for t in a.tool_calls] == [(t["name"], t["args"]) for t in b.tool_calls]  # type: ignore[attr-defined]
    _same_metadata(a, b)  # type: ignore[arg-type]
