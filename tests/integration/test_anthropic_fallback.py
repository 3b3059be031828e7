"""An OpenAI primary failing over to an Anthropic fallback keeps the tool call: LiteLLM's real
``anthropic/`` translation over HTTP to the simulator's Messages dialect, plain and streamed, a
``tool_result`` round trip, and Anthropic's 529 ``overloaded_error`` retried like a 429/503."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience_plugin import ErrorClass, ResilientRouter, get_report
from llm_resilience_plugin.testing import Behavior, FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "integer"}, "carrier": {"type": "string"}},
            "required": ["order_id", "carrier"],
        },
    },
}
ASK = [{"role": "user", "content": "Where is order 42 shipped with 'DHL'?"}]
ARGS = {"order_id": 42, "carrier": "DHL"}


def _model_list(sim: ProviderSimulator) -> list[dict[str, Any]]:
    return [
        {
            "model_name": "primary",
            "litellm_params": {
                "model": "openai/gpt-4o-mini",
                "api_base": sim.api_base("oa"),
                "api_key": "sk-sim-openai",
            },
            "model_info": {"id": "oa"},
        },
        {
            "model_name": "fallback",
            "litellm_params": {
                "model": "anthropic/claude-3-5-haiku-latest",
                "api_base": sim.anthropic_base("an"),
                "api_key": "sk-ant-sim-secret",
            },
            "model_info": {"id": "an"},
        },
    ]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def router(sim: ProviderSimulator, clock: FakeClock) -> Iterator[ResilientRouter]:
    r = ResilientRouter(
        model_list=_model_list(sim),
        fallbacks=[{"primary": ["fallback"]}],
        policy=FAST_POLICY,
        clock=clock,
        seed=1234,
    )
    yield r
    r.close()


DOWN = pytest.mark.parametrize(
    "down", [Fault.server_error(503), Fault.reset()], ids=["primary-503", "primary-down"]
)


@DOWN
async def test_fallback_to_anthropic_keeps_the_tool_call(
    router: ResilientRouter, sim: ProviderSimulator, down: Behavior
) -> None:
    sim.set_default("oa", down)
    resp = await router.acompletion(model="primary", messages=ASK, tools=[TOOL], max_tokens=200)
    choice = resp.choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "lookup_order"
    assert json.loads(call.function.arguments) == ARGS
    assert call.id.startswith("toolu_sim_") and call.type == "function"
    assert choice.finish_reason == "tool_calls"
    report = get_report(resp)
    assert report is not None and report.served_group == "fallback" and report.deployment_id == "an"
    assert sim.count("oa") == 3  # the primary's first try and its two retries
    (sent,) = sim.requests("an")
    assert sent.headers["x-api-key"] == "***" and sent.headers["anthropic-version"] == "2023-06-01"
    (tool,) = sent.body["tools"]
    assert tool["name"] == "lookup_order" and tool["input_schema"] == TOOL["function"]["parameters"]
    # Usage is what the Anthropic dialect reported (input_tokens / output_tokens), in OpenAI's names.
    completion = -(-len(json.dumps(ARGS)) // 4) + 5
    assert resp.usage.prompt_tokens == 2 + 4 + -(-len(ASK[0]["content"]) // 4)
    assert resp.usage.completion_tokens == completion
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + completion


@DOWN
async def test_streamed_fallback_to_anthropic_keeps_the_tool_call(
    router: ResilientRouter, sim: ProviderSimulator, down: Behavior
) -> None:
    sim.set_default("oa", down)
    stream = await router.acompletion(
        model="primary",
        messages=ASK,
        tools=[TOOL],
        max_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
    )
    name, arguments, finish, usage = "", "", None, None
    ids: set[str] = set()
    async for chunk in stream:
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.id:
                ids.add(delta.id)
            name += delta.function.name or ""
            arguments += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert name == "lookup_order" and json.loads(arguments) == ARGS
    assert len(ids) == 1 and finish == "tool_calls"
    assert usage is not None and usage.completion_tokens == -(-len(json.dumps(ARGS)) // 4) + 5
    assert usage.prompt_tokens > 0
    (sent,) = sim.requests("an")
    assert sent.stream and sent.status == 200


async def test_a_tool_result_round_trip_is_accepted_by_the_anthropic_dialect(
    router: ResilientRouter, sim: ProviderSimulator
) -> None:
    sim.set_default("oa", Fault.server_error(503))
    first = await router.acompletion(model="primary", messages=ASK, tools=[TOOL], max_tokens=200)
    (call,) = first.choices[0].message.tool_calls
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "in transit, arrives Friday"},
    ]
    second = await router.acompletion(model="primary", messages=history, tools=[TOOL], max_tokens=200)
    assert second.choices[0].message.content == "The tool returned: in transit, arrives Friday."
    assert second.choices[0].finish_reason == "stop"
    last = sim.requests("an")[-1]
    assert last.status == 200  # the dialect checks every tool_use has its tool_result, and back
    assistant, result = last.body["messages"][1:]
    assert assistant["content"][-1] == {
        "type": "tool_use",
        "id": call.id,
        "name": "lookup_order",
        "input": ARGS,
    }
    assert result["role"] == "user"
    assert result["content"][0]["type"] == "tool_result" and result["content"][0]["tool_use_id"] == call.id


async def test_a_broken_round_trip_is_refused_like_anthropic_refuses_it(sim: ProviderSimulator) -> None:
    import litellm

    # A tool_result whose tool_use is missing: Anthropic's 400, surfaced by LiteLLM as a BadRequest.
    sim.script("an", Fault.rate_limit())
    with pytest.raises(litellm.BadRequestError, match="tool_use_id"):
        await litellm.acompletion(
            model="anthropic/claude-3-5-haiku-latest",
            api_base=sim.anthropic_base("an"),
            api_key="sk-ant-sim",
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok"},
                {"role": "tool", "tool_call_id": "toolu_nowhere", "content": "x"},
            ],
            max_tokens=20,
        )
    assert [r.behavior for r in sim.requests("an")] == ["bad_request"]  # no script consumed


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        (Fault.overloaded(retry_after=2), 529),
        (Fault.rate_limit(retry_after=2), 429),
        (Fault.http_error(503, retry_after=2), 503),
    ],
    ids=["529-overloaded", "429", "503"],
)
async def test_anthropic_overloaded_is_retried_like_a_429_or_503(
    sim: ProviderSimulator, clock: FakeClock, fault: Behavior, status: int
) -> None:
    router = ResilientRouter(model_list=_model_list(sim)[1:], policy=FAST_POLICY, clock=clock, seed=1)
    try:
        sim.script("an", fault)
        resp = await router.acompletion(model="fallback", messages=ASK, max_tokens=50)
        assert resp.choices[0].message.content
        assert sim.count("an") == 2
        # the Retry-After, whatever the status (a 429's wait is its pace's: a 0 s retry sleep first)
        assert sum(clock.slept) == pytest.approx(2.0, abs=0.1) and max(clock.slept) == pytest.approx(
            2.0, abs=0.1
        )
        failed = get_report(resp).attempts[0]  # type: ignore[union-attr]
        expected = ErrorClass.RATE_LIMIT if status == 429 else ErrorClass.SERVER
        assert (failed.error_class, failed.status) == (expected, status)
    finally:
        router.close()
