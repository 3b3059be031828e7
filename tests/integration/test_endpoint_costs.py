"""The cost guard prices text completions, embeddings and Responses calls from LiteLLM's bundled
price map (offline), over real HTTP to the simulator: an ``openai/gpt-3.5-turbo-instruct``
deployment needs no ``base_model``; reservations bound the call before sending, settlements
match what LiteLLM reports."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin import BudgetExceededError, ResilientRouter
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.events import hidden_params_of
from llm_resilience_plugin.testing import FakeClock, ProviderSimulator

from ..conftest import FAST_POLICY


def router_for(sim: ProviderSimulator, model: str, mode: str, guard: CostGuard) -> ResilientRouter:
    return ResilientRouter(
        [
            {
                "model_name": "g",
                "litellm_params": {"model": model, "api_base": sim.api_base("a"), "api_key": "sk-sim"},
                "model_info": {"id": "a", "mode": mode},
            }
        ],
        policy=FAST_POLICY,
        clock=FakeClock(),
        guards=[guard],
    )


async def test_an_openai_completion_model_is_reserved_and_settled_from_litellms_map(sim):
    guard = CostGuard([Budget.daily(10)])
    router = router_for(sim, "openai/gpt-3.5-turbo-instruct", "completion", guard)  # no base_model
    try:
        resp = await router.atext_completion(model="g", prompt="Say hello", max_tokens=20)
        (entry,) = guard.ledger.entries()
        usage = resp.usage
        by_price = usage.prompt_tokens * 1.5e-06 + usage.completion_tokens * 2e-06
        assert not entry.estimated
        assert entry.cost == pytest.approx(by_price) == pytest.approx(hidden_params_of(resp)["response_cost"])
    finally:
        router.close()


async def test_a_completion_is_bounded_by_its_prompts_and_output_limit_before_sending(sim):
    guard = CostGuard([Budget.per_request(3e-5)])
    router = router_for(sim, "openai/gpt-3.5-turbo-instruct", "completion", guard)
    try:
        with pytest.raises(BudgetExceededError):  # 20 output tokens x $2e-6 alone is $4e-5
            await router.atext_completion(model="g", prompt="Say hello", max_tokens=20)
        with pytest.raises(BudgetExceededError):  # two prompts x 5 tokens x n=2
            await router.atext_completion(model="g", prompt=["Say hello", "Hi"], max_tokens=5, n=2)
        assert sim.count() == 0
        await router.atext_completion(model="g", prompt="Say hello", max_tokens=5)
        assert sim.count() == 1
    finally:
        router.close()


@pytest.mark.parametrize(
    ("model", "mode", "call"),
    [
        ("openai/text-embedding-3-small", "embedding", {"input": ["one two three", "four"]}),
        ("openai/gpt-4o-mini", "responses", {"input": "Say hello", "max_output_tokens": 30}),
    ],
)
async def test_embeddings_and_responses_settle_to_what_litellm_reports(
    sim, model, mode, call: dict[str, Any]
):
    guard = CostGuard([Budget.daily(10)])
    router = router_for(sim, model, mode, guard)
    try:
        fn = router.aembedding if mode == "embedding" else router.aresponses
        resp = await fn(model="g", **call)
        (entry,) = guard.ledger.entries()
        assert not entry.estimated and entry.cost > 0
        assert entry.cost == pytest.approx(hidden_params_of(resp)["response_cost"])
        assert entry.completion_tokens == 0 if mode == "embedding" else entry.completion_tokens > 0
    finally:
        router.close()
