"""The policy refuses what a user could be misread on, and names the field and the fix.

``deadline: true`` or ``"10"``, negative retries, NaN or infinite timeouts, fallbacks written as a
mapping, and cycles in ``context_window_fallbacks`` are refused before anything is built; every
problem of a config is reported at once. No sockets: only the pydantic models and the spec.
"""

from __future__ import annotations

from typing import Any

import pytest

import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
from llm_resilience_plugin import ConfigError
from llm_resilience_plugin._problems import ConfigProblems
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.policy import (
    ResiliencePolicy,
    build_policy,
    build_spec,
    config_problems,
    spec_problems,
)


def model_list(*groups: str) -> list[dict[str, Any]]:
    return [
        {
            "model_name": g,
            "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-unit-secret"},
            "model_info": {"id": f"{g}-1"},
        }
        for g in groups or ("primary", "backup")
    ]


@pytest.mark.parametrize(
    ("policy", "field", "hint"),
    [
        ({"deadline": True}, "resilience.deadline", "true/false is not a number"),
        ({"deadline": "10"}, "resilience.deadline", "write 10 without quotes"),
        ({"attempt_timeout": float("nan")}, "resilience.attempt_timeout", "finite number"),
        ({"first_chunk_timeout": float("inf")}, "resilience.first_chunk_timeout", "finite number"),
        ({"stream_idle_timeout": float("-inf")}, "resilience.stream_idle_timeout", "finite number"),
        ({"max_fallbacks": True}, "resilience.max_fallbacks", "valid integer"),
        ({"max_fallbacks": 2.5}, "resilience.max_fallbacks", "valid integer"),
        ({"breaker": {"fail_max": "3"}}, "resilience.breaker.fail_max", "without quotes"),
        ({"breaker": {"enabled": "yes"}}, "resilience.breaker.enabled", "true or false"),
        (
            {"classes": {"server": {"action": "retry", "max_retries": -1}}},
            "resilience.classes.server.max_retries",
            "greater than or equal to 0",
        ),
        ({"tiers": {"P9": {"max_retries": -2}}}, "resilience.tiers.P9.max_retries", "greater than or equal"),
        ({"hedge": {"delay": "0.5"}}, "resilience.hedge.delay", "'p95'"),
        ({"backoff": {"initial": float("nan")}}, "resilience.backoff.initial", "finite number"),
        ({"breaker": {"fail_mx": 3}}, "resilience.breaker.fail_mx", "did you mean 'fail_max'"),
        ({"classes": {"serve": {"action": "retry"}}}, "resilience.classes.serve", "did you mean 'server'"),
        ({"budgets": [{"period": "day", "limit": 5}]}, "resilience.budgets", "top-level cost: section"),
    ],
)
def test_policy_refuses_what_could_be_misread(policy: dict[str, Any], field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_policy(policy)
    assert info.value.field == field, str(info.value)
    assert hint in str(info.value)


def test_plain_yaml_values_still_pass() -> None:
    pol = build_policy(
        {
            "deadline": 10,  # an int is a number of seconds
            "attempt_timeout": 2.5,
            "hedge": {"delay": "p95"},
            "classes": {"rate_limit": {"action": "retry", "max_retries": 3}},  # class names as strings
            "degradation": {"levels": {1: {"max_tokens": 100}}},
            "breaker": {"enabled": False},
        }
    )
    assert pol.deadline == 10.0 and pol.classes[ErrorClass.RATE_LIMIT].max_retries == 3
    assert ResiliencePolicy().classes[ErrorClass.SERVER].action == "retry"


def test_fallbacks_as_a_mapping_are_refused_with_the_list_form() -> None:
    with pytest.raises(ConfigError) as info:
        build_spec(model_list(), fallbacks={"primary": ["backup"]})
    assert info.value.field == "fallbacks"
    assert "[{'primary': ['backup']}]" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_spec(model_list("a", "b", "c"), router_settings={"fallbacks": [{"a": ["b"], "b": ["c"]}]})
    assert info.value.field == "fallbacks[0]"
    assert "[{'a': ['b']}, {'b': ['c']}]" in str(info.value)


@pytest.mark.parametrize(
    ("chain", "ring"),
    [
        ([{"a": ["b"]}, {"b": ["a"]}], "a -> b -> a"),
        ([{"b": ["c"]}, {"a": ["b"]}, {"c": ["a"]}], "a -> b -> c -> a"),
    ],
)
def test_context_window_cycles_are_refused_naming_the_cycle(chain: list[Any], ring: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_spec(model_list("a", "b", "c"), context_window_fallbacks=chain)
    assert info.value.field == "context_window_fallbacks"
    assert f"cycle {ring}" in str(info.value)


def test_mutual_generic_fallbacks_pass_with_a_warning() -> None:
    spec, problems = spec_problems(model_list("a", "b"), fallbacks=[{"a": ["b"]}, {"b": ["a"]}])
    assert spec is not None and spec.fallbacks == {"a": ["b"], "b": ["a"]}
    assert [(p.severity, p.field) for p in problems] == [("warning", "fallbacks")]
    assert "cycle a -> b -> a" in problems[0].message and "never loops" in problems[0].message


def test_every_problem_is_reported_at_once() -> None:
    raw = {
        "model_list": [*model_list("primary"), {"model_name": "x", "litellm_params": {}}],
        "router_settings": {"falbacks": [{"primary": ["backup"]}], "num_retries": 3},
        "resilience": {"deadline": "5", "breaker": {"fail_mx": 2}},
        "resilence": {},
    }
    spec, problems = config_problems(raw)
    assert spec is None
    errors = {p.field: p.message for p in problems if p.severity == "error"}
    assert set(errors) == {
        "resilence",
        "model_list[1].litellm_params.model",
        "router_settings.falbacks",
        "resilience.deadline",
        "resilience.breaker.fail_mx",
    }
    assert "did you mean 'resilience'" in errors["resilence"]
    assert "did you mean 'fallbacks'" in errors["router_settings.falbacks"]
    warnings = [p.field for p in problems if p.severity == "warning"]
    assert warnings == ["router_settings.num_retries"]
    with pytest.raises(ConfigProblems) as info:
        build_spec(raw["model_list"], router_settings=raw["router_settings"], policy=raw["resilience"])
    assert len(info.value.problems) == 4
    assert "and 3 more" in str(info.value)
    assert "sk-unit-secret" not in str(info.value)


def test_a_timeout_longer_than_the_deadline_is_a_warning() -> None:
    _, problems = spec_problems(model_list(), policy={"deadline": 5, "attempt_timeout": 60})
    assert [(p.severity, p.field) for p in problems] == [("warning", "resilience.attempt_timeout")]
    assert "longer than the deadline (5 s)" in problems[0].message
    # Only what the user set: the default attempt timeout (30 s) under a 5 s deadline is fine.
    assert spec_problems(model_list(), policy={"deadline": 5})[1] == []
    _, problems = spec_problems(
        model_list(), policy={"groups": {"backup": {"deadline": 2, "attempt_timeout": 3}}}
    )
    assert [p.field for p in problems] == ["resilience.groups.backup.attempt_timeout"]
