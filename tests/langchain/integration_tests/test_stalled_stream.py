"""A stream that stalls after content, read by the chat model's ``invoke``/``ainvoke`` (which
stream internally): the call fails over after about the stream idle timeout, never the attempt
timeout, and never waits on the deployment that just stalled again."""

from __future__ import annotations

import time

from langchain_core.messages import HumanMessage

from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import Fault
from tests.conftest import RouterFactory

ASK = [HumanMessage("tell me a long story about cats and dogs and birds")]
# The attempt timeout is 3 s, the idle timeout 0.3 s; the stall lasts longer than both.
POLICY = {"attempt_timeout": 3, "stream_idle_timeout": 0.3}


async def test_ainvoke_fails_over_after_the_idle_timeout_not_the_attempt_timeout(
    make_router: RouterFactory, sim
) -> None:
    router = make_router(
        {"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], policy=POLICY
    )
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    await llm.ainvoke(ASK)  # warm (imports, HTTP clients): the timing below is the failover's
    sim.set_default("a", Fault.stream_stall(after_chunks=3, seconds=6))  # every request to "a" stalls
    t = time.monotonic()
    msg = await llm.ainvoke(ASK)
    elapsed = time.monotonic() - t
    assert isinstance(msg.content, str) and msg.content.endswith("cats and dogs and birds.")
    assert msg.content.count("Hello from") == 1
    assert msg.response_metadata["model_group"] == "backup"
    assert sim.count("a") == 2  # the warm-up, then the stall: not asked again in this call
    assert elapsed < 2.0, elapsed  # ~0.3 s idle timeout plus the backup's answer, not 3 s


def test_invoke_fails_over_after_the_idle_timeout_not_the_attempt_timeout(
    make_router: RouterFactory, sim
) -> None:
    router = make_router(
        {"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}], policy=POLICY
    )
    llm = ResilientChatModel(router=router, model="primary", streaming=True)
    llm.invoke(ASK)  # warm
    sim.set_default("a", Fault.stream_stall(after_chunks=3, seconds=6))
    t = time.monotonic()
    msg = llm.invoke(ASK)
    elapsed = time.monotonic() - t
    assert isinstance(msg.content, str) and msg.content.count("Hello from") == 1
    assert msg.response_metadata["model_group"] == "backup"
    assert sim.count("a") == 2
    assert elapsed < 2.0, elapsed
