"""The chat model never splices a broken stream onto a restarted one, and invoke/ainvoke (one
message to the caller) recover a stream broken after content by asking again without streaming."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from llm_resilience_plugin import StreamInterruptedError
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import Fault
from tests.conftest import RouterFactory

ASK = [HumanMessage("tell me a long story about cats and dogs and birds")]


async def test_ainvoke_over_a_streaming_model_recovers_a_cut_stream(make_router: RouterFactory, sim) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    msg = await llm.ainvoke(ASK)
    assert isinstance(msg.content, str) and msg.content.endswith("cats and dogs and birds.")
    assert msg.content.count("Hello from") == 1  # one whole answer, nothing of the broken one spliced in


def test_invoke_over_a_streaming_model_recovers_a_cut_stream(make_router: RouterFactory, sim) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    msg = llm.invoke(ASK)
    assert isinstance(msg.content, str) and msg.content.endswith("cats and dogs and birds.")
    assert msg.content.count("Hello from") == 1  # one whole answer, nothing of the broken one spliced in


async def test_a_restart_after_content_is_never_spliced_into_a_stream(
    make_router: RouterFactory, sim
) -> None:
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"restart_broken_streams": True},
    )
    llm = ResilientChatModel(router=router, model="primary")
    sim.script("a", Fault.stream_cut(after_chunks=3))
    with pytest.raises(StreamInterruptedError):
        _ = "".join([str(c.content) async for c in llm.astream(ASK)])
