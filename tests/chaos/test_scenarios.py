"""Scenario files and fault specs: the catalogue loads, mistakes name their field (no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.testing import Fault, FaultSpec
from llm_resilience_plugin.testing._fault_spec import behavior_from_data
from llm_resilience_plugin.testing.chaos import builtin_scenarios, load_scenario, scenario_from_mapping
from llm_resilience_plugin.testing.chaos._target import simulated_target

CATALOGUE = {
    "storm-429-retry-after", "storm-429", "deployment-down", "provider-down", "silent-provider",
    "slow-first-token", "stream-cut", "flapping", "context-overflow", "revoked-key", "quota",
    "three-providers-95", "budget-runs-out", "rate-limited",
}  # fmt: skip


def test_the_catalogue_is_complete_and_valid() -> None:
    assert {s.name for s in builtin_scenarios()} == CATALOGUE


def test_a_fault_spec_is_the_fault_constructor() -> None:
    assert behavior_from_data({"kind": "rate_limit", "retry_after": 2}) == Fault.rate_limit(retry_after=2)
    flaky = behavior_from_data({"kind": "flaky", "p": 0.1, "fault": {"kind": "server_error"}, "seed": 3})
    assert flaky == Fault.flaky(0.1, Fault.server_error(), seed=3)
    assert behavior_from_data({"kind": "quota"}).code == "insufficient_quota"
    assert FaultSpec(kind="silence").behavior() == Fault.silence()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"kind": "rate_limit", "status": 500}, "rate_limit does not take status"),
        ({"kind": "teapot"}, "kind"),
        ({"kind": "flaky", "p": 0.5}, "flaky needs p"),
        ({"kind": "http_error", "status": 99}, "status"),
    ],
)
def test_a_bad_fault_names_what_is_wrong(data: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        behavior_from_data(data)


def test_a_bad_scenario_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"timeline\.primary\.0: until"):
        scenario_from_mapping(
            {"name": "x", "timeline": {"primary": [{"at": 3, "until": 1, "fault": {"kind": "reset"}}]}}
        )
    with pytest.raises(ConfigError, match="concurrency"):
        scenario_from_mapping({"name": "x", "rate": 2, "concurrency": 3})
    with pytest.raises(ConfigError, match=r"limits\.primary: .*rpm, tpm or both"):
        scenario_from_mapping({"name": "x", "limits": {"primary": {"retry_after": 1}}})
    with pytest.raises(ConfigError, match=r"limits\.primary\.rpm"):
        scenario_from_mapping({"name": "x", "limits": {"primary": {"rpm": -5}}})
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ncalls: 3\ntimeline: {all: [{fault: {kind: auth}}]}\n")
    assert load_scenario(path).calls == 3
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "missing.yaml")


def test_selectors_and_secrets_never_reach_the_simulator() -> None:
    model_list = [
        {"model_name": "p", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-real"},
         "model_info": {"id": "a"}},
        {"model_name": "p", "litellm_params": {"model": "openai/gpt-4o", "api_key": "os.environ/K"}},
        {"model_name": "f", "litellm_params": {"model": "mistral/mistral-small", "api_key": "x"}},
    ]  # fmt: skip
    t = simulated_target(model_list, base_url="http://127.0.0.1:1", prefix="s", primary="p", fallbacks=["f"])
    assert [d.id for d in t.select("primary")] == ["a", "p-1"]
    assert [d.id for d in t.select("primary[1]")] == ["p-1"]
    assert [d.id for d in t.select("fallback")] == ["f-0"]
    assert [d.id for d in t.select("primary-provider")] == ["a", "p-1"]
    assert [d.id for d in t.select("provider:mistral")] == ["f-0"]
    assert all(e["litellm_params"]["api_key"] == "sk-chaos" for e in t.model_list)
    assert t.model_list[0]["litellm_params"]["api_base"] == "http://127.0.0.1:1/s-a/v1"
    with pytest.raises(ConfigError, match="names no deployment"):
        t.select("group:nope")
