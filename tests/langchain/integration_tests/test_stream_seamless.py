"""The chat model's stream/astream/astream_events recover a stream broken after content the
router's seamless way: the chunks LangChain hands on add up to one answer, with no chunk taken
back; where nothing can continue or reproduce it, the typed error carries a replacement."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage

from llm_resilience_plugin import StreamInterruptedError, get_report
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import Fault
from tests.integration.test_stream_seamless import STORY, make

ASK = [HumanMessage("tell me a long story about cats and dogs and birds")]
WHOLE = "Hello from a. You said: tell me a long story about cats and dogs and birds."


def _breaks(llm: ResilientChatModel, seen: list[Any]) -> list[str]:
    (report,) = [e for e in seen if type(e).__name__ == "CallReport"]
    return [b.end for b in report.stream_breaks]


async def test_astream_continues_a_cut_stream_on_the_fallback(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    seen: list[Any] = []
    router.subscribe(seen.append)
    llm = ResilientChatModel(router=router, model="primary")
    sim.script("a", Fault.stream_cut(after_chunks=3))
    chunks = [c async for c in llm.astream(ASK)]
    assert "".join(str(c.content) for c in chunks) == WHOLE
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert isinstance(merged, AIMessageChunk) and merged.content == WHOLE
    assert merged.usage_metadata is not None  # one usage, from the stream that finished
    assert _breaks(llm, seen) == ["continued"]


def test_stream_continues_a_cut_stream_on_the_fallback(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    llm = ResilientChatModel(router=router, model="primary")
    sim.script("a", Fault.stream_cut(after_chunks=3))
    assert "".join(str(c.content) for c in llm.stream(ASK)) == WHOLE


async def test_astream_events_sees_one_answer(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    llm = ResilientChatModel(router=router, model="primary")
    sim.script("a", Fault.malformed_chunk(after_chunks=3))
    text = ""
    async for event in llm.astream_events(ASK, version="v2"):
        if event["event"] == "on_chat_model_stream":
            text += str(event["data"]["chunk"].content)
    assert text == WHOLE


async def test_astream_replays_a_reproducible_request_and_verifies_it(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}})
    llm = ResilientChatModel(router=router, model="primary", temperature=0)
    sim.script("a", dataclasses.replace(Fault.stream_cut(after_chunks=4), text=STORY))
    sim.set_default("b", Fault.ok(text=STORY))
    assert "".join([str(c.content) async for c in llm.astream(ASK)]) == STORY


@pytest.mark.parametrize("policy", [{}, {"restart_broken_streams": True}])
async def test_astream_with_no_way_on_raises_with_a_replacement(sim, routers, policy) -> None:
    # The marker protocol is the router's opt-in for chunk loops that can clear what they
    # showed; LangChain cannot, so its streams always recover seamlessly.
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, policy)
    llm = ResilientChatModel(router=router, model="primary")
    sim.script("a", Fault.stream_cut(after_chunks=3))
    shown = ""
    with pytest.raises(StreamInterruptedError) as info:
        async for c in llm.astream(ASK):
            shown += str(c.content)
    assert shown == info.value.partial_text == "Hello from a. "
    assert info.value.replacement.choices[0].message.content.startswith("Hello from b.")
    report = get_report(info.value.replacement)
    assert report is not None and [b.end for b in report.stream_breaks] == ["given_up"]
