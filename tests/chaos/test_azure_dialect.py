"""Azure OpenAI deployments keep their dialect: LiteLLM's azure/ provider against the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIG = """
model_list:
  - model_name: primary
    litellm_params: {model: azure/my-gpt, api_key: os.environ/AZURE_API_KEY, api_base: https://x.openai.azure.com}
    model_info: {id: az}
  - model_name: fallback
    litellm_params: {model: openai/gpt-4o-mini, api_key: os.environ/OPENAI_API_KEY}
    model_info: {id: oa}
router_settings: {fallbacks: [{primary: [fallback]}]}
resilience:
  attempt_timeout: 5
  backoff: {initial: 0.01, maximum: 0.05}
  breaker: {fail_max: 3, reset_timeout: 5}
"""


@pytest.fixture
def azure_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "azure.yaml"
    path.write_text(CONFIG)
    return path


def test_an_azure_deployment_is_served_in_azures_dialect(llm_simulator, azure_yaml: Path) -> None:
    from llm_resilience_plugin.testing import ChaosHarness

    harness = ChaosHarness.from_config(azure_yaml, llm_simulator)
    try:
        tool = {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"order_id": {"type": "integer"}}}}}  # fmt: skip
        reply = harness.router.completion(
            model="primary", messages=[{"role": "user", "content": "order 42"}], tools=[tool], user="t1"
        )
        assert reply.choices[0].message.tool_calls[0].function.arguments == '{"order_id": 42}'
        assert reply.usage.total_tokens > 0
        (record,) = harness.requests("primary")
        assert record.headers["api-key"] == "***" and record.body["model"] == "my-gpt"
        harness.fault("primary", {"kind": "rate_limit", "retry_after": 0})
        reply = harness.router.completion(model="primary", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
        assert harness.count("fallback") == 1
    finally:
        harness.close()
