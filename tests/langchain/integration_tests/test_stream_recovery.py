"""The chat model never splices a broken stream onto a restarted one, and invoke/ainvoke (one
message to the caller) recover a stream broken after content by asking again without streaming."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from llm_resilience_plugin import StreamInterruptedError
from llm_resilience_plugin.events import CallReport
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


def _reports(seen: list[object]) -> list[CallReport]:
    return [e for e in seen if isinstance(e, CallReport)]


@pytest.mark.parametrize("policy", [{}, {"restart_broken_streams": True}])
async def test_ainvoke_recovery_is_one_call_with_one_report(make_router: RouterFactory, sim, policy) -> None:
    seen: list[object] = []
    router = make_router(
        {"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], policy=policy
    )
    router.subscribe(seen.append)
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    msg = await llm.ainvoke(ASK)
    assert isinstance(msg.content, str) and msg.content.count("Hello from b") == 1
    (report,) = _reports(seen)  # the broken stream and its recovery are one call
    assert report.outcome == "success" and report.stream_restarts == 1
    assert [(a.deployment_id, a.outcome) for a in report.attempts] == [("a", "failure"), ("b", "success")]
    assert msg.response_metadata["resilience"]["call_id"] == report.call_id
    # The broken stream, then the answer asked again without streaming: nothing opened and dropped.
    assert [(r.deployment, r.stream) for r in sim.requests()] == [("a", True), ("b", False)]


def test_invoke_recovery_is_one_call_with_one_report(make_router: RouterFactory, sim) -> None:
    seen: list[object] = []
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    router.subscribe(seen.append)
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    msg = llm.invoke(ASK)
    assert isinstance(msg.content, str) and msg.content.count("Hello from b") == 1
    (report,) = _reports(seen)
    assert report.stream_restarts == 1 and msg.response_metadata["resilience"]["call_id"] == report.call_id


async def test_recovery_lives_inside_the_calls_deadline(make_router: RouterFactory, sim) -> None:
    """The recovery is the same call: when its deadline is spent, the break is surfaced."""
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    sim.script("a", Fault.stream_stall(after_chunks=3, seconds=5))
    with pytest.raises(StreamInterruptedError):
        await llm.ainvoke(ASK, deadline=0.6, stream_idle_timeout=0.5)
    assert sim.count("b") == 0  # no time left for the answer: nothing more was sent
