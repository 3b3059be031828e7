"""A deadline carried by a LangChain RunnableConfig reaches the router and resilient() steps."""

from __future__ import annotations

import time

import pytest
from langchain_core.runnables import RunnableLambda

from llm_resilience_plugin import DeadlineExceededError
from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin.langchain import ResilientChatModel, resilient
from llm_resilience_plugin.testing._simulator import Fault
from tests.conftest import RouterFactory


@pytest.mark.parametrize(
    "config",
    [
        {"configurable": {"deadline": 0.5}},
        {"metadata": {"timeout": 0.5}},
        {"configurable": {"deadline_at": "now+0.5"}},
    ],
)
def test_chat_model_honours_the_config_deadline(make_router: RouterFactory, sim, config) -> None:
    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 5, "deadline": 30}, clock=Clock())
    sim.set_default("a", Fault.silence(max_hold=5))
    llm = ResilientChatModel(router=router, model="primary")
    if config.get("configurable", {}).get("deadline_at") == "now+0.5":
        config = {"configurable": {"deadline_at": time.time() + 0.5}}
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        llm.invoke("hello", config=config)
    assert time.monotonic() - t0 < 2.5
    assert sim.count("a") == 1


async def test_chain_deadline_reaches_a_nested_chat_model(make_router: RouterFactory, sim) -> None:
    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 5, "deadline": 30}, clock=Clock())
    sim.set_default("a", Fault.silence(max_hold=5))
    chain = RunnableLambda(lambda x: x) | ResilientChatModel(router=router, model="primary")
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await chain.ainvoke("hello", config={"configurable": {"deadline": 0.5}})
    assert time.monotonic() - t0 < 2.5


async def test_resilient_step_honours_the_config_deadline() -> None:
    import asyncio

    async def slow(x: str) -> str:
        await asyncio.sleep(3)
        return x

    step = resilient(RunnableLambda(slow), policy={"deadline": 30, "attempt_timeout": 10})
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await step.ainvoke("x", config={"metadata": {"deadline": 0.3}})
    assert time.monotonic() - t0 < 2.5


@pytest.mark.parametrize(
    ("model_timeout", "call_kwargs", "config"),
    [
        # The model's own timeout is shorter than what the run has left: the model's applies.
        (0.5, {}, {"configurable": {"deadline": 30}}),
        # A per-call deadline longer than what the run has left: the run's deadline caps it.
        (None, {"deadline": 30}, {"configurable": {"deadline": 0.5}}),
        (None, {"timeout": 30}, {"metadata": {"deadline": 0.5}}),
    ],
)
async def test_the_shorter_of_the_calls_deadline_and_the_runs_applies(
    make_router: RouterFactory, sim, model_timeout, call_kwargs, config
) -> None:
    """One rule (``call_budget``): the call's own deadline (per call, else the model's timeout,
    else the policy's), never past what the run's config has left."""
    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 5, "deadline": 30}, clock=Clock())
    sim.set_default("a", Fault.silence(max_hold=5))
    llm = ResilientChatModel(router=router, model="primary", timeout=model_timeout)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await llm.ainvoke("hello", config=config, **call_kwargs)
    assert time.monotonic() - t0 < 2.5


def test_embeddings_inside_a_run_keep_to_the_runs_deadline(sim) -> None:
    """A retriever's embed_query inside a chain with a deadline is bounded by what the run has left."""
    from llm_resilience_plugin import ResilientRouter
    from llm_resilience_plugin.langchain import ResilientEmbeddings

    model_list = [
        {
            "model_name": "g",
            "litellm_params": {
                "model": "openai/text-embedding-3-small",
                "api_base": sim.api_base("e"),
                "api_key": "sk-sim",
            },
            "model_info": {"id": "e", "mode": "embedding"},
        }
    ]
    router = ResilientRouter(model_list, policy={"deadline": 10, "attempt_timeout": 8})
    emb = ResilientEmbeddings(router=router, model="g")
    sim.set_default("e", Fault.ok(latency=1.5))
    step = RunnableLambda(lambda x: len(emb.embed_query(x)))
    t0 = time.monotonic()
    try:
        with pytest.raises(DeadlineExceededError):
            step.invoke("hello", config={"configurable": {"deadline": 0.5}})
        assert time.monotonic() - t0 < 1.2
        assert len(emb.embed_query("hello")) > 0  # outside a run: the policy's deadline
    finally:
        router.close()
