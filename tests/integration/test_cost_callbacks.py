"""CostGuardCallbackHandler on LangChain chat models: a non-resilient ChatLiteLLM over real HTTP
to the simulator, and a minimal custom chat model (usage_metadata only). Blocks invoke, ainvoke,
stream and astream before any request; settles from usage_metadata / response_cost; releases
on errors; per-run budgets follow the root run."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_litellm import ChatLiteLLM

from llm_resilience_plugin import BudgetExceededError, ConfigError, ResilientRouter
from llm_resilience_plugin.cost._guard import Budget, CostGuard
from llm_resilience_plugin.langchain._callbacks import CostGuardCallbackHandler
from llm_resilience_plugin.testing import FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator, estimate_prompt_tokens
from tests.conftest import FAST_POLICY, deployment

IN, OUT = 1.5e-7, 6e-7  # gpt-4o-mini
PROMPT = "hello there friend"
PROMPT_TOKENS = estimate_prompt_tokens([{"role": "user", "content": PROMPT}])


def sim_counter(model: str, messages: list[dict[str, Any]]) -> int:
    return estimate_prompt_tokens(messages)


def chat(sim: ProviderSimulator, **kw: Any) -> ChatLiteLLM:
    return ChatLiteLLM(
        model="openai/gpt-4o-mini", api_base=sim.api_base("x"), api_key="sk-sim", max_retries=0, **kw
    )


class UsageOnlyChat(BaseChatModel):
    """A chat model that reports usage_metadata but no cost (like most LangChain integrations)."""

    model: str = "gpt-4o-mini"
    max_tokens: int | None = 8
    usage: dict[str, int] = {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}

    @property
    def _llm_type(self) -> str:
        return "usage-only"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "max_tokens": self.max_tokens}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        msg = AIMessage(content="ok", usage_metadata=dict(self.usage))  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for word in ("o", "k"):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager:
                run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk
        yield ChatGenerationChunk(message=AIMessageChunk(content="", usage_metadata=dict(self.usage)))  # type: ignore[arg-type]


def spent(guard: CostGuard, budget: str = "daily") -> tuple[float, float]:
    (u,) = [b for b in guard.report().budgets if b.budget == budget]
    return u.spent, u.reserved


def cfg(handler: CostGuardCallbackHandler, **kw: Any) -> RunnableConfig:
    return {"callbacks": [handler], **kw}  # type: ignore[typeddict-item]


# -- blocking before any request -------------------------------------------------------------------


async def test_over_budget_blocks_invoke_ainvoke_stream_and_astream_before_any_request(
    sim: ProviderSimulator,
):
    one = PROMPT_TOKENS * IN + 7 * OUT
    guard = CostGuard([Budget.daily(2.5 * one)], token_counter=sim_counter, prompt_margin=0)
    handler = CostGuardCallbackHandler(guard)
    model = chat(sim, max_tokens=7)
    model.invoke(PROMPT, config=cfg(handler))
    await model.ainvoke(PROMPT, config=cfg(handler))
    assert sim.count() == 2
    with pytest.raises(BudgetExceededError) as ei:
        model.invoke(PROMPT, config=cfg(handler))
    assert ei.value.budget.startswith("daily ")
    with pytest.raises(BudgetExceededError):
        await model.ainvoke(PROMPT, config=cfg(handler))
    with pytest.raises(BudgetExceededError):
        list(model.stream(PROMPT, config=cfg(handler)))
    with pytest.raises(BudgetExceededError):
        async for _ in model.astream(PROMPT, config=cfg(handler)):
            pass
    assert sim.count() == 2  # nothing was sent
    assert handler.pending == 0
    s, r = spent(guard)
    assert r == 0 and s == pytest.approx(2 * one, abs=1e-12)


async def test_a_request_whose_worst_case_does_not_fit_is_refused_up_front(sim: ProviderSimulator):
    guard = CostGuard([Budget.per_request(0.0005)])
    handler = CostGuardCallbackHandler(guard)
    with pytest.raises(BudgetExceededError) as ei:
        chat(sim, max_tokens=1000).invoke(PROMPT, config=cfg(handler))
    assert ei.value.budget == "per_request" and ei.value.reservation > 0.0005
    # no max_tokens: the model's maximum output (16384 for gpt-4o-mini) is the bound
    with pytest.raises(BudgetExceededError):
        chat(sim).invoke(PROMPT, config=cfg(handler))
    assert sim.count() == 0
    chat(sim, max_tokens=50).invoke(PROMPT, config=cfg(handler))
    assert sim.count() == 1


# -- settling ------------------------------------------------------------------------------------------


async def test_settles_invoke_and_stream_from_the_reported_cost_and_usage(sim: ProviderSimulator):
    guard = CostGuard([Budget.daily(1)])
    handler = CostGuardCallbackHandler(guard)
    model = chat(sim, max_tokens=7)
    msg = model.invoke(PROMPT, config=cfg(handler))
    assert msg.usage_metadata is not None
    first = msg.usage_metadata["input_tokens"] * IN + msg.usage_metadata["output_tokens"] * OUT
    assert msg.response_metadata["response_cost"] == pytest.approx(first)
    assert spent(guard) == (pytest.approx(first, abs=1e-12), 0)
    # ChatLiteLLM asks for stream_options={"include_usage": True} by default: the final chunk
    # carries usage_metadata (llm_output is None when streaming)
    chunks = list(model.stream(PROMPT, config=cfg(handler)))
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.usage_metadata is not None
    second = total.usage_metadata["input_tokens"] * IN + total.usage_metadata["output_tokens"] * OUT
    assert spent(guard) == (pytest.approx(first + second, abs=1e-12), 0)
    assert sim.requests()[-1].body["stream_options"] == {"include_usage": True}
    assert [e.estimated for e in guard.ledger.entries()] == [False, False]
    assert handler.pending == 0


async def test_any_chat_model_settles_from_usage_metadata_alone():
    guard = CostGuard([Budget.daily(1)])
    handler = CostGuardCallbackHandler(guard)
    model = UsageOnlyChat()
    model.invoke("hi", config=cfg(handler))
    list(model.stream("hi", config=cfg(handler)))
    await model.ainvoke("hi", config=cfg(handler))
    async for _ in model.astream("hi", config=cfg(handler)):
        pass
    assert spent(guard) == (pytest.approx(4 * (10 * IN + 3 * OUT), abs=1e-12), 0)
    rep = guard.report()
    assert rep.prompt_tokens == 40 and rep.completion_tokens == 12 and rep.calls == 4


async def test_llm_error_releases_the_reservation(sim: ProviderSimulator):
    guard = CostGuard([Budget.daily(1)])
    handler = CostGuardCallbackHandler(guard)
    # (a 500 would be retried once inside ChatLiteLLM even with max_retries=0: one LLM run)
    sim.script("x", Fault.http_error(400, message="bad request"))
    with pytest.raises(Exception, match="bad request"):
        chat(sim, max_tokens=7).invoke(PROMPT, config=cfg(handler))
    assert sim.count() == 1
    assert spent(guard) == (0, 0)
    assert handler.pending == 0


async def test_a_stream_cut_after_tokens_is_settled_at_the_estimate(sim: ProviderSimulator):
    guard = CostGuard([Budget.daily(1)])
    handler = CostGuardCallbackHandler(guard)
    sim.script("x", Fault.stream_cut(after_chunks=2))
    with pytest.raises(Exception):  # noqa: B017 - whatever LiteLLM raises for a cut stream
        list(chat(sim, max_tokens=7).stream(PROMPT, config=cfg(handler)))
    (entry,) = guard.ledger.entries()
    assert entry.estimated and entry.cost > 0  # the provider billed what it generated
    assert spent(guard)[1] == 0


# -- scopes, runs, concurrency --------------------------------------------------------------------------


def test_scoped_budgets_read_metadata_and_tags():
    guard = CostGuard([Budget.scoped("tenant", 1), Budget.scoped("user", 1, period="month")])
    handler = CostGuardCallbackHandler(guard)
    model = UsageOnlyChat()
    model.invoke("hi", config=cfg(handler, metadata={"tenant": "acme"}, tags=["user:ann"]))
    model.invoke("hi", config=cfg(handler, tags=["tenant=globex"]))
    rep = guard.report()
    one = 10 * IN + 3 * OUT
    assert rep.by_scope == {
        "tenant=acme": pytest.approx(one),
        "tenant=globex": pytest.approx(one),
        "user=ann": pytest.approx(one),
    }
    assert {(b.budget, b.scope) for b in rep.budgets} == {
        ("tenant/day", "tenant=acme"),
        ("tenant/day", "tenant=globex"),
        ("user/month", "user=ann"),
    }


def test_per_run_budget_covers_every_llm_call_under_one_root_run():
    one = 10 * IN + 8 * OUT  # estimate: prompt counted as 10 tokens, max_tokens 8
    guard = CostGuard([Budget.per_run(2.5 * one)], token_counter=lambda m, msgs: 10, prompt_margin=0)
    handler = CostGuardCallbackHandler(guard)
    model = UsageOnlyChat()
    calls: list[str] = []

    def agent(x: str, config: RunnableConfig) -> str:
        for _ in range(5):
            model.invoke(x, config=config)  # child runs of the agent's root run
            calls.append(x)
        return "done"

    with pytest.raises(BudgetExceededError) as ei:
        RunnableLambda(agent).invoke("hi", config=cfg(handler))
    assert len(calls) == 3  # 3 actual calls (10 in + 3 out each) fit under 2.5 estimates
    assert ei.value.budget.startswith("per_run[run=")
    # a new root run has its own budget
    with pytest.raises(BudgetExceededError):
        RunnableLambda(agent).invoke("again", config=cfg(handler))
    assert calls.count("again") == 3
    assert handler.pending == 0


def test_concurrent_batch_never_overspends():
    one = 10 * IN + 3 * OUT
    guard = CostGuard([Budget.daily(20 * one)], token_counter=lambda m, msgs: 10, prompt_margin=0)
    handler = CostGuardCallbackHandler(guard)
    model = UsageOnlyChat(max_tokens=3)
    out = model.batch(["hi"] * 60, config=cfg(handler, max_concurrency=16), return_exceptions=True)
    ok = [o for o in out if isinstance(o, AIMessage)]
    refused = [o for o in out if isinstance(o, BudgetExceededError)]
    assert len(ok) == 20 and len(refused) == 40
    assert spent(guard) == (pytest.approx(20 * one, abs=1e-12), 0)


# -- models, prices, copies ------------------------------------------------------------------------------


def test_handler_is_shared_not_copied():
    handler = CostGuardCallbackHandler(CostGuard([Budget.daily(1)]))
    assert copy.copy(handler) is handler
    assert copy.deepcopy(handler) is handler
    assert handler.raise_error and handler.run_inline


def test_unknown_model_is_a_config_error_before_any_request(sim: ProviderSimulator):
    handler = CostGuardCallbackHandler(CostGuard([Budget.daily(1)]))
    model = ChatLiteLLM(
        model="openai/my-private-model", api_base=sim.api_base("x"), api_key="sk-sim", max_retries=0
    )
    with pytest.raises(ConfigError, match="my-private-model"):
        model.invoke(PROMPT, config=cfg(handler))
    assert sim.count() == 0


def test_group_names_are_priced_by_a_bound_router_or_a_price_resolver(sim: ProviderSimulator):
    router = ResilientRouter(
        model_list=[
            deployment(sim, "primary", "a", input_cost_per_token=1e-6, output_cost_per_token=2e-6),
            deployment(sim, "primary", "b", input_cost_per_token=3e-6, output_cost_per_token=1e-6),
        ],
        policy=FAST_POLICY,
        clock=FakeClock(),
    )
    try:
        model = UsageOnlyChat(model="primary", max_tokens=8)
        g1 = CostGuard(
            [Budget.daily(1)], price_resolver=router, token_counter=lambda m, msgs: 10, prompt_margin=0
        )
        h1 = CostGuardCallbackHandler(g1)
        model.invoke("hi", config=cfg(h1))
        (u,) = g1.ledger.entries()
        assert g1.call_info(u.request_id)["estimate"] == pytest.approx(
            max(10 * 1e-6 + 8 * 2e-6, 10 * 3e-6 + 8 * 1e-6)
        )
        # no deployment reported: settled at the most expensive candidate's prices
        assert u.cost == pytest.approx(10 * 3e-6 + 3 * 1e-6)
        g2 = CostGuard(
            [Budget.daily(1)], price_resolver=lambda name: (1e-5, 1e-5) if name == "primary" else None
        )
        CostGuardCallbackHandler(g2)
        model.invoke("hi", config=cfg(CostGuardCallbackHandler(g2)))
        assert g2.ledger.entries()[0].cost == pytest.approx(13 * 1e-5)
    finally:
        router.close()


# -- ResilientChatModel --------------------------------------------------------------------------------


async def test_resilient_chat_model_is_priced_through_its_router(sim: ProviderSimulator):
    from llm_resilience_plugin.langchain import ResilientChatModel

    router = ResilientRouter(
        model_list=[deployment(sim, "primary", "a", input_cost_per_token=1e-6, output_cost_per_token=2e-6)],
        policy=FAST_POLICY,
        clock=FakeClock(),
    )
    try:
        llm = ResilientChatModel(router=router, model="primary", max_tokens=5)
        with pytest.raises(ConfigError, match=r"router=llm\.get_router"):
            llm.invoke(PROMPT, config=cfg(CostGuardCallbackHandler(CostGuard([Budget.daily(1)]))))
        assert sim.count() == 0
        guard = CostGuard([Budget.daily(1)], router=llm.get_router())
        handler = CostGuardCallbackHandler(guard)
        msg = await llm.ainvoke(PROMPT, config=cfg(handler))
        chunks = [c async for c in llm.astream(PROMPT, config=cfg(handler))]
        assert len(chunks) > 1
        entries = guard.ledger.entries()
        assert [e.deployment_id for e in entries] == ["a", "a"]
        u = msg.usage_metadata
        assert entries[0].cost == pytest.approx(u["input_tokens"] * 1e-6 + u["output_tokens"] * 2e-6)
        assert entries[1].cost > 0 and not entries[1].estimated
        assert spent(guard)[1] == 0 and handler.pending == 0
    finally:
        router.close()
