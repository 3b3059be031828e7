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


def test_from_yaml_config(tmp_path, llm_simulator) -> None:
    sim = llm_simulator  # the pytest plugin's simulator (reset per test), as a user's test gets it
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


def _cost_yaml(sim: Any, cost: str) -> str:
    return textwrap.dedent(
        f"""
        model_list:
          - model_name: primary
            litellm_params:
              model: openai/gpt-4o-mini
              api_base: {sim.api_base("a")}
              api_key: sk-sim
            model_info: {{id: a}}
        """
    ) + textwrap.dedent(cost)


def test_cost_section_attaches_a_guard_that_refuses_before_sending(tmp_path, sim) -> None:
    from llm_resilience_plugin import BudgetExceededError
    from llm_resilience_plugin.cost import CostGuard

    ledger = tmp_path / "spend.db"
    path = tmp_path / "router.yaml"
    path.write_text(
        _cost_yaml(
            sim,
            f"""
            cost:
              ledger: sqlite:///{ledger}
              alert_at: [0.5]
              budgets:
                - {{period: day, limit: 0.0001}}
                - {{period: request, limit: 0.05, name: one-call}}
            """,
        )
    )
    router = ResilientRouter.from_config(path)
    guards = [g for g in router.guards if isinstance(g, CostGuard)]
    assert len(guards) == 1
    guard = guards[0]
    assert [b.name for b in guard.budgets] == ["daily", "one-call"] and guard.alert_at == (0.5,)
    refused = 0
    for _ in range(20):
        try:
            router.completion(model="primary", messages=MSG, max_tokens=50)
        except BudgetExceededError:
            refused += 1
    assert refused > 0
    assert sim.count("a") == 20 - refused  # a refused call sends nothing
    assert 0 < guard.report().total <= 0.0001
    assert ledger.exists()
    router.close()
    guard.close()


@pytest.mark.parametrize(
    ("cost", "field", "hint"),
    [
        ("cost: {budgets: [{period: day, limit: '5'}]}", "cost.budgets[0].limit", "without quotes"),
        ("cost: {budgets: [{period: dayly, limit: 5}]}", "cost.budgets[0].period", "'day'"),
        ("cost: {budget: []}", "cost.budget", "did you mean 'budgets'"),
        ("cost: {ledger: spend.txt}", "cost.ledger", "sqlite:///"),
        ("cost: {alert_at: 80}", "cost.alert_at", "fractions of a limit"),
        ("resilience: {budgets: [{period: day, limit: 5}]}", "resilience.budgets", "top-level cost:"),
    ],
)
def test_bad_cost_section_names_field_and_fix(tmp_path, sim, cost: str, field: str, hint: str) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(_cost_yaml(sim, cost))
    with pytest.raises(ConfigError) as info:
        ResilientRouter.from_config(path)
    assert info.value.field == field, str(info.value)
    assert hint in str(info.value)
    assert sim.count() == 0
