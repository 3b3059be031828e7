"""The chat model never splices a broken stream onto a restarted one, and invoke/ainvoke (one
message to the caller) recover a stream broken after content by asking again without streaming."""

from __future__ import annotations

from typing import Any

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


@pytest.mark.parametrize("sync", [True, False])
async def test_a_cost_handler_carries_the_reservation_to_the_answer(sim, sync: bool) -> None:
    """The answer of a broken stream's call is already paid for when LangChain's second run
    starts: the handler does not reserve again (a refusal would throw the answer away and drop its
    spend); it settles the broken stream (at its estimate) and the answer once, at the end."""
    from llm_resilience_plugin import Budget, CostGuard, ResilientRouter
    from llm_resilience_plugin.langchain import CostGuardCallbackHandler
    from tests.conftest import FAST_POLICY, deployment

    def priced(group: str, dep: str) -> dict[str, object]:
        return deployment(sim, group, dep, input_cost_per_token=2e-6, output_cost_per_token=8e-6)

    router = ResilientRouter(
        [priced("primary", "a"), priced("backup", "b")],
        fallbacks=[{"primary": ["backup"]}],
        policy=FAST_POLICY,
    )
    llm = ResilientChatModel(router=router, model="primary", streaming=True, max_tokens=50)
    probe = CostGuard(budgets=[Budget.daily(100.0)], ledger="memory", router=router)
    estimate = probe.reserve(
        probe.candidates_for_model("primary"),
        messages=[{"role": "user", "content": str(ASK[0].content)}],
        max_tokens=50,
    ).estimate
    guard = CostGuard(
        budgets=[Budget.daily(estimate * 1.5)], ledger="memory", router=router
    )  # one reservation fits
    handler = CostGuardCallbackHandler(guard)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    config: Any = {"callbacks": [handler]}
    msg = llm.invoke(ASK, config=config) if sync else await llm.ainvoke(ASK, config=config)
    assert isinstance(msg.content, str) and msg.content.startswith("Hello from b")
    answer_cost = msg.response_metadata["response_cost"]
    report = guard.report()
    assert report.total == pytest.approx(estimate + answer_cost)  # nothing of what was paid dropped
    assert handler.pending == 0
    assert [(r.deployment, r.stream) for r in sim.requests()] == [("a", True), ("b", False)]
    router.close()


def test_the_log_handler_says_the_broken_run_was_answered_again(
    make_router: RouterFactory, sim, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from llm_resilience_plugin.langchain import StructuredLogCallbackHandler

    handler = StructuredLogCallbackHandler()
    caplog.set_level(logging.INFO, logger=handler.logger.name)
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    sim.script("a", Fault.stream_cut(after_chunks=3))
    llm.invoke(ASK, config={"callbacks": [handler]})
    runs = [r for r in caplog.records if getattr(r, "llm_event_name", None) == "llm_run"]
    assert [(r.llm_event["outcome"], r.levelno) for r in runs] == [  # type: ignore[attr-defined]
        ("answered_again", logging.INFO),
        ("success", logging.INFO),
    ]
