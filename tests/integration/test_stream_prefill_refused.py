"""A route that declares assistant prefill but refuses it (the 400 Anthropic's newer models send
for a request ending in an assistant message, ``Fault.refuse_prefill``): a stream broken after
content still ends in one answer - by a verified replay (on the refuser itself, asked from
scratch, or elsewhere) or by continuing on the next route that takes the prefill - through a
plain chunk loop (async and sync), LangChain ``astream`` and ``ainvoke``. The refusal never
reaches the caller nor a breaker, and the refuser is not offered a prefill again."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from llm_resilience_plugin import StreamInterruptedError, get_report
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import Fault
from tests.integration.test_stream_seamless import LONG, SAME, STORY, breaker_counts, breaks, cut, make, read

WHOLE_A = "Hello from a. You said: tell me a long story about cats and dogs and birds."


def behaviors(sim: Any, dep: str) -> list[str]:
    return [r.behavior for r in sim.requests(dep)]


async def test_a_refused_prefill_is_replayed_on_the_refuser_from_scratch(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.refuse_prefill(Fault.ok(text=STORY)))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, **SAME)
    assert await read(stream) == STORY
    assert breaks(stream) == [("replayed", "a", "b")]
    assert behaviors(sim, "b") == ["prefill_refused", "ok"]
    report = get_report(stream)
    assert report is not None and report.outcome == "success" and report.error_class is None
    assert breaker_counts(router)["b"] == 0  # a refused prefill says nothing about b's health
    # the next broken stream goes straight to the replay: b is not offered a prefill again
    sim.clear_log()
    sim.script("a", cut(4, STORY))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, **SAME)
    assert await read(stream) == STORY
    assert behaviors(sim, "b") == ["ok"]


async def test_a_refused_prefill_continues_on_the_next_route_that_takes_one(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}, "last": {"c": True}})
    sim.script("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.refuse_prefill())
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    assert await read(stream) == WHOLE_A  # sampling request: continued, never replayed
    assert breaks(stream) == [("continued", "a", "c")]
    assert behaviors(sim, "b") == ["prefill_refused"]
    assert get_report(stream).outcome == "success"  # type: ignore[union-attr]


def test_a_sync_stream_goes_through_a_refusal_to_a_verified_replay(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.refuse_prefill(Fault.ok(text=STORY)))
    stream = router.completion(model="primary", messages=LONG, stream=True, **SAME)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == STORY
    assert breaks(stream) == [("replayed", "a", "b")]
    assert behaviors(sim, "b") == ["prefill_refused", "ok"]


async def test_a_sampling_request_gets_the_typed_error_never_the_refusal(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.refuse_prefill(Fault.ok(text=STORY)))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, temperature=0.7)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert info.value.partial_text == "Once upon a time "
    assert info.value.replacement.choices[0].message.content == STORY  # b asked whole, from scratch
    assert behaviors(sim, "b") == ["prefill_refused", "ok"]
    assert [b[0] for b in breaks(stream)] == ["given_up"]


# -- LangChain -----------------------------------------------------------------------------------

ASK = [HumanMessage(LONG[0]["content"])]


@pytest.mark.parametrize("caller", ["astream", "ainvoke"])
async def test_langchain_goes_through_a_refusal_to_a_verified_replay(sim, routers, caller) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    seen: list[Any] = []
    router.subscribe(seen.append)
    llm = ResilientChatModel(router=router, model="primary", temperature=0, streaming=True)
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.refuse_prefill(Fault.ok(text=STORY)))
    if caller == "astream":
        text = "".join([str(c.content) async for c in llm.astream(ASK)])
    else:
        text = str((await llm.ainvoke(ASK)).content)
    assert text == STORY
    # astream continues (by prefill where it may) or replays; ainvoke asks the rest whole
    assert behaviors(sim, "b") == (["prefill_refused", "ok"] if caller == "astream" else ["ok"])
    (report,) = [e for e in seen if type(e).__name__ == "CallReport"]
    assert report.outcome == "success" and report.error_class is None
