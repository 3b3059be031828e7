"""A LiteLLM Router config that carries the policy: its settings, fallbacks and file loading,
checked all at once so ``llm-resilience check`` can list every problem."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from llm_resilience_plugin._problems import (
    Problem,
    closest,
    cycles,
    field_path,
    model_list_problems,
    pydantic_problems,
    raise_errors,
    shape_problems,
)
from llm_resilience_plugin.errors import ConfigError, ErrorClass
from llm_resilience_plugin.policy._models import Model, ResiliencePolicy

FallbackMap = dict[str, list[str]]

# Router settings this plugin owns: LiteLLM's own copies are switched off so attempts never multiply.
OWNED_ROUTER_SETTINGS = frozenset(
    {
        "num_retries",
        "retry_policy",
        "model_group_retry_policy",
        "allowed_fails",
        "allowed_fails_policy",
        "cooldown_time",
        "disable_cooldowns",
        "fallbacks",
        "context_window_fallbacks",
        "content_policy_fallbacks",
        "default_fallbacks",
        "retry_after",
        "max_fallbacks",
        "enable_weighted_failover",
        "enable_mid_stream_fallback_continuation",
    }
)
_FALLBACK_KEYS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks")
# Owned settings that are ignored (the fallback lists are read): where to say it instead.
_INSTEAD = {
    "num_retries": "resilience.classes.<class>.max_retries",
    "retry_policy": "resilience.classes",
    "model_group_retry_policy": "resilience.groups.<group>.classes",
    "allowed_fails": "resilience.breaker.fail_max",
    "allowed_fails_policy": "resilience.breaker.fail_max",
    "cooldown_time": "resilience.breaker.reset_timeout",
    "max_fallbacks": "resilience.max_fallbacks",
    "retry_after": "resilience.backoff",
}
TOP_LEVEL_KEYS = (
    "model_list",
    "router_settings",
    "resilience",
    "cost",
    "litellm_settings",
    "general_settings",
    "environment_variables",
    "chaos",  # llm-resilience chaos: thresholds (checked by testing.chaos, ignored by the router)
)


class RouterSpec(Model):
    """A LiteLLM Router config plus the plugin's policy, validated together."""

    model_list: list[dict[str, Any]] = Field(min_length=1)
    router_settings: dict[str, Any] = Field(default_factory=dict)
    fallbacks: FallbackMap = Field(default_factory=dict)
    context_window_fallbacks: FallbackMap = Field(default_factory=dict)
    content_policy_fallbacks: FallbackMap = Field(default_factory=dict)
    default_fallbacks: list[str] = Field(default_factory=list)
    policy: ResiliencePolicy = Field(default_factory=ResiliencePolicy)
    cost: dict[str, Any] | None = Field(
        default=None, description="The config's cost: section, validated by llm_resilience_plugin.cost."
    )

    @property
    def groups(self) -> list[str]:
        """Model group names in config order."""
        seen: dict[str, None] = {}
        for d in self.model_list:
            seen.setdefault(d["model_name"], None)
        return list(seen)

    def fallback_chain(self, group: str, error_class: ErrorClass | None) -> list[str]:
        """Fallback groups for ``group`` after a failure of ``error_class`` (LiteLLM's key semantics)."""
        if error_class is ErrorClass.CONTEXT_WINDOW:
            specific = self.context_window_fallbacks.get(group)
            if specific is not None:
                return list(specific)
        if error_class is ErrorClass.CONTENT_POLICY:
            # Content policy falls back only where configured: a generic fallback would resend it.
            return list(self.content_policy_fallbacks.get(group, []))
        if group in self.fallbacks:
            return list(self.fallbacks[group])
        return [g for g in self.default_fallbacks if g != group]


@cache
def router_setting_names() -> frozenset[str]:
    """The keyword arguments ``litellm.Router`` accepts (imported here, when a config needs it)."""
    import inspect

    import litellm

    return frozenset(inspect.signature(litellm.Router.__init__).parameters) - {"self", "model_list"}


def _fallback_map(value: Any, field: str, problems: list[Problem]) -> FallbackMap:
    """LiteLLM's list of single-key mappings, ``[{'primary': ['backup']}]``, as a mapping."""
    out: FallbackMap = {}
    if value is None:
        return out
    if isinstance(value, Mapping):
        fix = [{str(k): v} for k, v in value.items()] or [{"primary": ["backup"]}]
        problems.append(
            Problem(field, f"expected a list of single-key mappings, as LiteLLM reads it: write {fix}")
        )
        return out
    if not isinstance(value, list | tuple):
        problems.append(Problem(field, "expected a list like [{'primary': ['backup']}]"))
        return out
    for i, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            problems.append(
                Problem(
                    field_path(field, i),
                    f"expected a mapping like {{'primary': ['backup']}}, got {type(entry).__name__}",
                )
            )
            continue
        if len(entry) != 1:
            split = [{str(k): v} for k, v in entry.items()]
            problems.append(Problem(field_path(field, i), f"one group per entry: write {split}"))
            continue
        for src, targets in entry.items():
            if isinstance(targets, str):
                targets = [targets]
            if not isinstance(targets, list | tuple) or not all(isinstance(t, str) for t in targets):
                problems.append(Problem(f"{field}.{src}", "expected a list of model group names"))
                continue
            out.setdefault(str(src), []).extend(targets)
    return out


def _settings_problems(settings: Mapping[str, Any]) -> list[Problem]:
    """Unknown router settings (with the closest name), a bad timeout, owned settings ignored."""
    problems: list[Problem] = []
    t = settings.get("timeout")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf):
        problems.append(Problem("router_settings.timeout", "must be a positive number of seconds"))
    extra = [k for k in settings if k not in OWNED_ROUTER_SETTINGS]
    names = router_setting_names() if extra else frozenset()
    for key in extra:
        if key not in names:
            hint = closest(str(key), sorted(names | OWNED_ROUTER_SETTINGS))
            problems.append(Problem(f"router_settings.{key}", "unknown setting of litellm.Router" + hint))
    for key, instead in _INSTEAD.items():
        if key in settings:
            problems.append(
                Problem(
                    f"router_settings.{key}",
                    f"ignored: the plugin owns it (LiteLLM's copy is off); set {instead}",
                    "warning",
                )
            )
    return problems


def _timeout_problems(pol: ResiliencePolicy) -> list[Problem]:
    """Warnings for a timeout set longer than the deadline it can never outlast."""
    problems = []
    scopes: list[tuple[str, Any, str | None]] = [("resilience", pol, None)]
    scopes += [(f"resilience.groups.{g}", gp, g) for g, gp in pol.groups.items()]
    for name, own, group in scopes:
        deadline = pol.for_group(group).deadline if group is not None else pol.deadline
        for key in ("attempt_timeout", "first_chunk_timeout", "stream_idle_timeout"):
            value = getattr(own, key)
            if key in own.model_fields_set and value is not None and value > deadline:
                msg = f"{value:g} s is longer than the deadline ({deadline:g} s), which cuts every attempt"
                problems.append(Problem(f"{name}.{key}", msg + "; lower it or raise the deadline", "warning"))
    return problems


def build_policy(data: Any) -> ResiliencePolicy:
    """Validate a policy mapping (or pass a policy through)."""
    pol, problems = _policy(data)
    raise_errors(problems)
    assert pol is not None
    return pol


def _policy(data: Any) -> tuple[ResiliencePolicy | None, list[Problem]]:
    if data is None:
        return ResiliencePolicy(), []
    if isinstance(data, ResiliencePolicy):
        return data, []
    if not isinstance(data, Mapping):
        return None, [Problem("resilience", f"expected a mapping, got {type(data).__name__}")]
    try:
        return ResiliencePolicy.model_validate(dict(data)), []
    except ValidationError as e:
        return None, pydantic_problems(e, "resilience", data, ResiliencePolicy)


def spec_problems(
    model_list: Any,
    *,
    router_settings: Mapping[str, Any] | None = None,
    policy: Any = None,
    fallbacks: Any = None,
    context_window_fallbacks: Any = None,
    content_policy_fallbacks: Any = None,
    default_fallbacks: Any = None,
    cost: Mapping[str, Any] | None = None,
) -> tuple[RouterSpec | None, list[Problem]]:
    """Every problem of a Router config plus policy, and its :class:`RouterSpec` when none is an
    error (warnings: owned settings ignored, timeouts longer than the deadline, fallback cycles)."""
    settings = dict(router_settings or {})
    shapes = shape_problems(model_list, "model_list") + shape_problems(settings, "router_settings")
    shapes += shape_problems(cost, "cost") + shape_problems(policy, "resilience")
    if shapes:  # nothing below may walk a recursive value; a NaN would be ignored or refused later
        return None, shapes
    groups, problems = model_list_problems(model_list)
    pol, policy_problems = _policy(policy)
    problems += policy_problems + _settings_problems(settings)
    given = {"fallbacks": fallbacks, "context_window_fallbacks": context_window_fallbacks}
    given["content_policy_fallbacks"] = content_policy_fallbacks
    maps: dict[str, FallbackMap] = {}
    known = ", ".join(sorted(groups))
    for key in _FALLBACK_KEYS:
        value = given[key] if given[key] is not None else settings.get(key)
        maps[key] = fmap = _fallback_map(value, key, problems)
        for src, targets in fmap.items():
            if groups and src not in groups:
                problems.append(Problem(key, f"unknown model group {src!r}; known groups: {known}"))
            for t in targets:
                if groups and t not in groups:
                    problems.append(
                        Problem(f"{key}.{src}", f"unknown fallback group {t!r}; known groups: {known}")
                    )
                if t == src:
                    problems.append(Problem(f"{key}.{src}", "a group cannot fall back to itself"))
        for cycle in cycles({s: [t for t in ts if t != s] for s, ts in fmap.items()}):
            ring = " -> ".join(cycle)
            if key == "context_window_fallbacks":  # each must have a larger window than the last
                problems.append(
                    Problem(
                        key, f"cycle {ring}: context window fallbacks go to larger windows; drop one edge"
                    )
                )
            else:
                msg = f"cycle {ring}: accepted - a call walks only its own group's list, one level deep"
                problems.append(Problem(key, msg + ", so it never loops", "warning"))
    dfb = default_fallbacks if default_fallbacks is not None else settings.get("default_fallbacks")
    if dfb is not None and (not isinstance(dfb, list) or not all(isinstance(x, str) for x in dfb)):
        problems.append(Problem("default_fallbacks", "expected a list of model group names"))
        dfb = None
    for t in dfb or []:
        if groups and t not in groups:
            problems.append(Problem("default_fallbacks", f"unknown model group {t!r}; known groups: {known}"))
    if cost is not None and not isinstance(cost, Mapping):
        problems.append(Problem("cost", f"expected a mapping, got {type(cost).__name__}"))
    if pol is not None:
        for g in pol.groups:
            if groups and g not in groups:
                problems.append(
                    Problem("resilience.groups", f"unknown model group {g!r}; known groups: {known}")
                )
        # Honour the user's LiteLLM timeout as the attempt timeout when the policy is silent.
        timeout, bad = settings.get("timeout"), any(p.field == "router_settings.timeout" for p in problems)
        if timeout is not None and not bad and "attempt_timeout" not in (policy or {}):
            pol = pol.model_copy(update={"attempt_timeout": float(timeout)})
        problems += _timeout_problems(pol)
    if pol is None or any(p.severity == "error" for p in problems):
        return None, problems
    spec = RouterSpec(
        model_list=model_list,
        router_settings={k: v for k, v in settings.items() if k not in OWNED_ROUTER_SETTINGS},
        fallbacks=maps["fallbacks"],
        context_window_fallbacks=maps["context_window_fallbacks"],
        content_policy_fallbacks=maps["content_policy_fallbacks"],
        default_fallbacks=list(dfb or []),
        policy=pol,
        cost=dict(cost) if cost is not None else None,
    )
    return spec, problems


def build_spec(model_list: Any, **kwargs: Any) -> RouterSpec:
    """Validate a Router config plus policy into a :class:`RouterSpec` (raises ConfigError for the
    first error, naming the others). Keywords: those of :func:`spec_problems`."""
    spec, problems = spec_problems(model_list, **kwargs)
    raise_errors(problems)
    assert spec is not None
    return spec


def read_config(path: str | Path) -> Any:
    """The parsed YAML at ``path`` (``ConfigError`` for a missing file or invalid YAML)."""
    p = Path(path)
    try:
        return yaml.safe_load(p.read_text())
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError("path", f"config file not found: {p}") from None
    except yaml.YAMLError as e:
        raise ConfigError("path", f"{p} is not valid YAML: {e}") from None


def load_config(path: str | Path) -> RouterSpec:
    """Read a LiteLLM proxy-style YAML (``model_list``, ``router_settings``, ``resilience``, ``cost``)."""
    return spec_from_mapping(read_config(path), source=str(path))


def config_problems(raw: Any, source: str = "config") -> tuple[RouterSpec | None, list[Problem]]:
    """Every problem of a parsed config file (the YAML's top level), and its spec if it has no error."""
    if not isinstance(raw, Mapping):
        return None, [Problem(source, "the top level must be a mapping with model_list")]
    shapes = [p for k, v in raw.items() for p in shape_problems(v, str(k))]
    if shapes:
        return None, shapes
    expected = "; expected model_list, router_settings, resilience, cost"
    hints = {str(k): closest(str(k), TOP_LEVEL_KEYS) or expected for k in raw if k not in TOP_LEVEL_KEYS}
    problems = [Problem(k, "unknown top-level key" + hint) for k, hint in hints.items()]
    settings = raw.get("router_settings") or {}
    if not isinstance(settings, Mapping):
        problems.append(Problem("router_settings", "expected a mapping"))
        settings = {}
    spec, more = spec_problems(
        raw.get("model_list"), router_settings=settings, policy=raw.get("resilience"), cost=raw.get("cost")
    )
    problems += more
    return (None if any(p.severity == "error" for p in problems) else spec), problems


def spec_from_mapping(raw: Any, source: str = "config") -> RouterSpec:
    """Validate a parsed config mapping (the YAML's top level); ConfigError for the first error."""
    spec, problems = config_problems(raw, source)
    raise_errors(problems)
    assert spec is not None
    return spec
