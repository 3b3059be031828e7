"""Bad input is refused before any request, with an error naming the field and the fix."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from llm_resilience_plugin import ConfigError, ResilientRouter, get_report
from llm_resilience_plugin.errors import UnknownModelGroupError
from tests.conftest import MSG, deployment


def dep(group: str = "primary", dep_id: str = "a") -> dict[str, Any]:
    return {
        "model_name": group,
        "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "k"},
        "model_info": {"id": dep_id},
    }


@pytest.mark.parametrize(
    ("kwargs", "field", "hint"),
    [
        ({"fallbacks": [{"primary": ["bakup"]}]}, "fallbacks.primary", "unknown fallback group 'bakup'"),
        ({"fallbacks": [{"nope": ["primary"]}]}, "fallbacks", "unknown model group 'nope'"),
        (
            {"context_window_fallbacks": [{"primary": ["primary"]}]},
            "context_window_fallbacks.primary",
            "itself",
        ),
        ({"fallbacks": ["primary"]}, "fallbacks[0]", "expected a mapping"),
        ({"default_fallbacks": ["ghost"]}, "default_fallbacks", "unknown model group 'ghost'"),
        ({"policy": {"deadline": -1}}, "resilience.deadline", "greater than 0"),
        ({"policy": {"attempt_timeout": "soon"}}, "resilience.attempt_timeout", "valid number"),
        (
            {"policy": {"breaker": {"fail_max": 0}}},
            "resilience.breaker.fail_max",
            "greater than or equal to 1",
        ),
        (
            {"policy": {"breaker": {"reset_timeout": -5}}},
            "resilience.breaker.reset_timeout",
            "greater than 0",
        ),
        (
            {"policy": {"retry_budget": {"min_fraction": 2}}},
            "resilience.retry_budget.min_fraction",
            "less than or equal to 1",
        ),
        (
            {"policy": {"backoff": {"initial": 5, "maximum": 1}}},
            "resilience.backoff",
            "maximum must be >= backoff.initial",
        ),
        ({"policy": {"dealine": 3}}, "resilience.dealine", "unknown field"),
        (
            {"policy": {"classes": {"rate_limit": {"action": "pray"}}}},
            "resilience.classes.rate_limit.action",
            "'retry', 'failover' or 'fail'",
        ),
        (
            {"policy": {"groups": {"ghost": {"deadline": 1}}}},
            "resilience.groups",
            "unknown model group 'ghost'",
        ),
        ({"router_settings": {"timeout": -3}}, "router_settings.timeout", "positive"),
    ],
)
def test_bad_config_names_field_and_fix(kwargs: dict[str, Any], field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        ResilientRouter(model_list=[dep("primary", "a"), dep("backup", "b")], **kwargs)
    assert info.value.field == field, str(info.value)
    assert hint in str(info.value)


@pytest.mark.parametrize(
    ("model_list", "field"),
    [
        ([], "model_list"),
        ("primary", "model_list"),
        ([{"litellm_params": {"model": "x"}}], "model_list"),
        ([{"model_name": "g", "litellm_params": {}}], "model_list"),
        ([dep("g", "a"), dep("g", "a")], "model_list"),
    ],
)
def test_bad_model_list(model_list: Any, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ResilientRouter(model_list=model_list)
    assert info.value.field.startswith(field) or field in str(info.value)


async def test_unknown_group_and_bad_arguments_fail_before_sending(sim) -> None:
    router = ResilientRouter(model_list=[deployment(sim, "primary", "a")])
    with pytest.raises(UnknownModelGroupError) as info:
        await router.acompletion(model="primay", messages=MSG)
    assert "known groups: primary" in str(info.value)
    with pytest.raises(ConfigError, match="messages"):
        await router.acompletion(model="primary", messages=[])
    with pytest.raises(ConfigError, match="deadline"):
        await router.acompletion(model="primary", messages=MSG, deadline=-1)
    with pytest.raises(UnknownModelGroupError):
        router.completion(model="nope", messages=MSG)
    assert sim.count() == 0
    router.close()


def test_from_yaml_config(tmp_path, sim) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            model_list:
              - model_name: primary
                litellm_params:
                  model: openai/gpt-4o-mini
                  api_base: {sim.api_base("a")}
                  api_key: sk-sim
                model_info: {{id: primary-a}}
              - model_name: backup
                litellm_params:
                  model: openai/gpt-4o-mini
                  api_base: {sim.api_base("b")}
                  api_key: sk-sim
                model_info: {{id: backup-b}}
            router_settings:
              routing_strategy: simple-shuffle
              num_retries: 7          # owned by the plugin: LiteLLM's retries stay off
              fallbacks: [{{primary: [backup]}}]
              timeout: 12
            resilience:
              deadline: 20
              breaker: {{fail_max: 2}}
              groups:
                backup: {{deadline: 5}}
            """
        )
    )
    router = ResilientRouter.from_config(path)
    assert router.effective_policy("primary").attempt_timeout == 12
    assert router.effective_policy("primary").deadline == 20
    assert router.effective_policy("backup").deadline == 5
    assert router.effective_policy("primary").breaker.fail_max == 2
    assert router.spec.fallbacks == {"primary": ["backup"]}
    assert router.litellm_router.num_retries == 0
    sim.set_default("a", __import__("llm_resilience_plugin.testing").testing.Fault.auth())
    resp = router.completion(model="primary", messages=MSG)
    assert get_report(resp).served_group == "backup"  # type: ignore[union-attr]
    assert (sim.count("a"), sim.count("b")) == (1, 1)
    router.close()


def test_yaml_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        ResilientRouter.from_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_list: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        ResilientRouter.from_config(bad)
    odd = tmp_path / "odd.yaml"
    odd.write_text("model_lst: []\n")
    with pytest.raises(ConfigError, match="unknown top-level"):
        ResilientRouter.from_config(odd)
