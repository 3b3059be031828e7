"""Chaos keeps an anthropic/ deployment's dialect: tests/chaos/router.yaml's fallback is Anthropic,
so a dead OpenAI primary hands the call (tools included) to the simulator's Messages endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_resilience_plugin.policy import load_config
from llm_resilience_plugin.testing.chaos import load_chaos_config, run_scenario, scenario_from_mapping
from llm_resilience_plugin.testing.chaos._target import simulated_target

CONFIG = Path(__file__).parent / "router.yaml"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}},
    },
}


def test_an_anthropic_deployment_is_pointed_at_the_messages_endpoint() -> None:
    spec = load_config(CONFIG)
    t = simulated_target(
        spec.model_list, base_url="http://127.0.0.1:1", prefix="s", primary="primary", fallbacks=["fallback"]
    )
    spare = t.model_list[1]["litellm_params"]
    assert spare["model"] == "anthropic/claude-haiku-4-5"
    assert (spare["api_base"], spare["api_key"]) == ("http://127.0.0.1:1/s-spare", "sk-chaos")
    assert [d.dialect for d in t.deployments] == ["openai", "anthropic"]


@pytest.mark.llm_resilience(config="router.yaml", scenario="deployment-down")
def test_the_harness_falls_back_to_anthropic_with_the_tool_call(llm_chaos) -> None:
    reply = llm_chaos.router.completion(
        model="primary", messages=[{"role": "user", "content": "order 42"}], tools=[TOOL], max_tokens=100
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "lookup_order" and json.loads(call.function.arguments) == {"order_id": 42}
    (sent,) = llm_chaos.requests("fallback")
    assert sent.headers["anthropic-version"] and sent.body["tools"][0]["input_schema"]["type"] == "object"


async def test_the_chaos_runner_keeps_tool_calls_through_the_anthropic_fallback(llm_simulator) -> None:
    config = load_chaos_config(str(CONFIG))
    scenario = scenario_from_mapping(
        {
            "name": "down-tools",
            "calls": 4,
            "concurrency": 2,
            "stream": True,
            "tools": True,
            "timeline": {"primary": [{"fault": {"kind": "server_error", "status": 503}}]},
        }
    )
    for system in ("plugin", "litellm"):
        run = await run_scenario(
            llm_simulator, config.spec, config.router_settings, scenario, system, primary="primary", warmup=0
        )
        assert [c.ok for c in run.calls] == [True] * 4, (system, [c.error for c in run.calls])
        answered = [r for r in run.requests if r.status == 200]
        assert answered and all(r.deployment.endswith("-spare") for r in answered)
        assert all(r.body["tools"][0]["name"] == "lookup_order" for r in answered)
