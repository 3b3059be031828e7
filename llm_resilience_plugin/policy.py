"""Validated configuration: the resilience policy, and a LiteLLM Router config that carries it.

Everything a user can get wrong is checked here, before a request is sent, and reported as a
:class:`ConfigError` that names the field and says how to fix it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

from llm_resilience_plugin._problems import (
    Problem,
    closest,
    cycles,
    field_path,
    model_list_problems,
    pydantic_problems,
    raise_errors,
)
from llm_resilience_plugin.errors import ConfigError, ErrorClass

Action = Literal["retry", "failover", "fail"]
# Error classes are keys written as strings in YAML: matched by value, everything else is strict.
ClassKey = Annotated[ErrorClass, Strict(False)]


class _Model(BaseModel):
    """Strict: ``true`` or ``"10"`` is not a number, ``"yes"`` not a bool, NaN/inf not a time."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False
    )


# Streams: the first-chunk and idle timeouts when none is configured and the call can go elsewhere.
STREAM_TIMEOUT_DEFAULT = 10.0


class ClassPolicy(_Model):
    """What to do with one class of failure: retry in the group, fail over, or fail."""

    action: Action
    max_retries: int = Field(default=0, ge=0, le=20)
    same_deployment: bool = Field(
        default=True,
        description="May a retry go back to the deployment that just failed (if nothing else is healthy)?",
    )


def _default_class_policies() -> dict[ErrorClass, ClassPolicy]:
    return {
        ErrorClass.RATE_LIMIT: ClassPolicy(action="retry", max_retries=2),
        ErrorClass.SERVER: ClassPolicy(action="retry", max_retries=2),
        ErrorClass.CONNECTION: ClassPolicy(action="retry", max_retries=2),
        # A silent provider costs one attempt timeout; never wait on it twice in the same call.
        ErrorClass.TIMEOUT: ClassPolicy(action="retry", max_retries=1, same_deployment=False),
        ErrorClass.CIRCUIT_OPEN: ClassPolicy(action="failover"),
        ErrorClass.AUTH: ClassPolicy(action="failover"),
        ErrorClass.CONTEXT_WINDOW: ClassPolicy(action="failover"),
        ErrorClass.CONTENT_POLICY: ClassPolicy(action="failover"),
        ErrorClass.BAD_REQUEST: ClassPolicy(action="fail"),
        # Refused before sending: a cheaper fallback may still fit; the budget error is kept.
        ErrorClass.BUDGET: ClassPolicy(action="failover"),
        ErrorClass.UNKNOWN: ClassPolicy(action="fail"),
    }


class BackoffPolicy(_Model):
    """Exponential backoff with full jitter: sleep uniform(0, min(max, initial * 2**n))."""

    initial: float = Field(default=0.25, gt=0, le=60)
    maximum: float = Field(default=8.0, gt=0, le=600)
    respect_retry_after: bool = True
    max_retry_after: float = Field(
        default=30.0,
        ge=0,
        description="A Retry-After longer than this (or than the time left) fails over at once.",
    )
    max_wait_with_fallback: float | None = Field(
        default=3.0,
        ge=0,
        description="When a fallback group exists, a Retry-After wait up to this long (that fits "
        "the deadline, with no other deployment of the group free) is waited out on the group the "
        "caller asked for; a longer one fails over. A fallback is a degradation. None: always wait.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BackoffPolicy:
        if self.maximum < self.initial:
            raise ValueError("backoff.maximum must be >= backoff.initial")
        return self


class BreakerPolicy(_Model):
    """Per-deployment circuit breaker settings (pybreaker semantics)."""

    enabled: bool = True
    fail_max: int = Field(default=5, ge=1, le=1000)
    reset_timeout: float = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="The longest a breaker stays open before a probe (the cap of the growing window).",
    )
    min_reset_timeout: float = Field(
        default=2.0,
        gt=0,
        le=86400,
        description="How long a breaker first stays open; each failed probe doubles it up to "
        "reset_timeout, a success starts again here (a blip costs seconds, an outage one probe a window).",
    )
    success_threshold: int = Field(default=1, ge=1, le=100)
    half_open_max_probes: int = Field(default=1, ge=1, le=100)
    rate_limit_fail_max: int | None = Field(
        default=10,
        ge=1,
        le=10000,
        description="429s in a row (no success between) that open the breaker. A rate limit is not "
        "an outage: fewer only hold the deployment for its Retry-After, so a burst of 429s never "
        "ejects a deployment that answers the rest. None: 429s never open it.",
    )

    def open_for(self, streak: int) -> float:
        """Seconds a breaker stays open after its ``streak``-th trip in a row (1 = first)."""
        first = min(self.min_reset_timeout, self.reset_timeout)
        return min(self.reset_timeout, first * 2 ** max(0, streak - 1))


class RetryBudgetPolicy(_Model):
    """Token bucket per model group that bounds retry amplification during an outage."""

    enabled: bool = True
    capacity: float = Field(default=20.0, gt=0)
    refund_per_success: float = Field(default=0.1, ge=0)
    min_fraction: float = Field(
        default=0.5, ge=0, le=1, description="No retries while tokens < capacity * min_fraction."
    )


class HedgePolicy(_Model):
    """Hedged requests: after ``delay`` send a second request to another healthy deployment;
    the first complete answer wins and the other is cancelled."""

    enabled: bool = True
    delay: float | Literal["p95"] = Field(
        default="p95", description="Seconds, or 'p95': the group's recent p95 latency (TTFT for streams)."
    )
    initial_delay: float = Field(default=1.0, gt=0, description="Delay until enough samples for p95.")
    min_delay: float = Field(default=0.05, ge=0)
    min_samples: int = Field(default=20, ge=1)
    max_extra_fraction: float = Field(
        default=0.1, gt=0, le=1, description="Hedges never exceed this fraction of calls."
    )


class LevelDegradation(_Model):
    """What changes at one fallback level (1 = first fallback group, ...)."""

    max_tokens: int | None = Field(default=None, ge=1)
    drop_tools: bool = False
    deadline: float | None = Field(default=None, gt=0, description="Cap on the time left, in seconds.")


class DegradationPolicy(_Model):
    """Graceful degradation; everything here is off by default."""

    trim_context_on_overflow: bool = Field(
        default=False,
        description="Context window exceeded and no larger fallback: trim history and retry once.",
    )
    keep_last_messages: int = Field(default=2, ge=1, description="Never trim below this many turns.")
    static_answers: dict[str, str] = Field(
        default_factory=dict, description="Scenario key -> text returned when every route fails."
    )
    levels: dict[Annotated[int, Strict(False)], LevelDegradation] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _levels_positive(self) -> DegradationPolicy:
        for level in self.levels:
            if level < 1:
                raise ValueError("degradation.levels keys are fallback levels, starting at 1")
        return self


class TierPolicy(_Model):
    """A priority tier: how hard to try, and when to shed it."""

    max_retries: int | None = Field(default=None, ge=0, le=20, description="Caps retries per class.")
    deadline: float | None = Field(default=None, gt=0)
    hedge: bool = True
    max_fallback_level: int | None = Field(default=None, ge=0)
    shed_below: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Refuse the call while the retry budget (or a cost budget) is below this fraction.",
    )


def _default_tiers() -> dict[str, TierPolicy]:
    return {
        "P0": TierPolicy(),
        "P1": TierPolicy(shed_below=0.1),
        "P2": TierPolicy(shed_below=0.25, max_retries=1),
        "P3": TierPolicy(shed_below=0.5, max_retries=0, hedge=False, max_fallback_level=1),
    }


class GroupPolicy(_Model):
    """Overrides for one model group; unset fields inherit from the top-level policy."""

    deadline: float | None = Field(default=None, gt=0)
    attempt_timeout: float | None = Field(default=None, gt=0)
    first_chunk_timeout: float | None = Field(default=None, gt=0)
    stream_idle_timeout: float | None = Field(default=None, gt=0)
    connect_timeout: float | None = Field(default=None, gt=0)
    backoff: BackoffPolicy | None = None
    breaker: BreakerPolicy | None = None
    retry_budget: RetryBudgetPolicy | None = None
    hedge: HedgePolicy | None = None
    degradation: DegradationPolicy | None = None
    restart_broken_streams: bool | None = None
    continue_streams_with_prefill: bool | None = None
    classes: dict[ClassKey, ClassPolicy] = Field(default_factory=dict)


# -- shared state on Redis (issue #6; see docs/scaling-out.md) --------------------------------------


class SharedStatePolicy(_Model):
    """Breakers, retry budgets (and a Redis cost ledger) shared by every worker on one Redis.

    Switched on by ``router_settings.redis_url`` (LiteLLM's own key); this section only tunes it.
    """

    enabled: bool = Field(default=True, description="False keeps state local even with a redis_url.")
    namespace: str = Field(
        default="llm-resilience", min_length=1, description="Key prefix (one per application)."
    )
    router_name: str | None = Field(
        default=None, min_length=1, description="Key part per router (default: a hash of its deployments)."
    )
    socket_timeout: float = Field(default=0.1, gt=0, le=5, description="Seconds per Redis call.")
    connect_timeout: float = Field(default=0.1, gt=0, le=5, description="Seconds to connect to Redis.")
    sync_interval: float = Field(
        default=0.1, gt=0, le=10, description="Seconds between background refreshes of breakers/budgets."
    )
    retry_interval: float = Field(
        default=1.0, gt=0, le=300, description="After a Redis error, seconds on local state before retrying."
    )
    probe_lease: float | None = Field(
        default=None, gt=0, description="Seconds a half-open probe slot is held at most (default: deadline)."
    )
    ledger_on_error: Literal["fail_closed", "local"] = Field(
        default="fail_closed",
        description="Redis unreachable: refuse metered calls, or spend on a local ledger and reconcile.",
    )


class ResiliencePolicy(_Model):
    """The whole policy. Defaults are explained in README ("Policy defaults")."""

    deadline: float = Field(default=60.0, gt=0, le=3600, description="Total seconds per call.")
    attempt_timeout: float = Field(default=30.0, gt=0, le=3600, description="Seconds per attempt.")
    first_chunk_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Streams: seconds to the first chunk. Default: 10 s (at most attempt_timeout) "
        "while the call has somewhere else to go, then learned from the group's observed time to "
        "first token; attempt_timeout when it has nowhere else.",
    )
    stream_idle_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Streams: longest silence between chunks. Default: 10 s (at most attempt_timeout) "
        "while the call has somewhere else to go, then learned from observed gaps between chunks.",
    )
    connect_timeout: float | None = Field(default=5.0, gt=0, description="TCP/TLS connect, per attempt.")
    min_attempt_time: float = Field(
        default=0.05, ge=0, description="Do not start an attempt with less time than this left."
    )
    backoff: BackoffPolicy = Field(default_factory=BackoffPolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    retry_budget: RetryBudgetPolicy = Field(default_factory=RetryBudgetPolicy)
    hedge: HedgePolicy | None = None
    degradation: DegradationPolicy = Field(default_factory=DegradationPolicy)
    restart_broken_streams: bool = False
    continue_streams_with_prefill: bool = False
    max_stream_restarts: int = Field(
        default=3,
        ge=0,
        le=20,
        description="How many times one call's broken stream may resume elsewhere (within the deadline).",
    )
    classes: dict[ClassKey, ClassPolicy] = Field(default_factory=_default_class_policies)
    tiers: dict[str, TierPolicy] = Field(default_factory=_default_tiers)
    default_tier: str | None = None
    max_fallbacks: int = Field(default=5, ge=0, le=50)
    groups: dict[str, GroupPolicy] = Field(default_factory=dict)
    shared_state: SharedStatePolicy = Field(default_factory=SharedStatePolicy)

    @model_validator(mode="after")
    def _fill_classes(self) -> ResiliencePolicy:
        merged = {**_default_class_policies(), **self.classes}
        object.__setattr__(self, "classes", merged)
        if self.default_tier is not None and self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of tiers: {sorted(self.tiers)}")
        return self

    def for_group(self, group: str) -> EffectivePolicy:
        """The policy in force for ``group``: the group's overrides over the top-level values."""
        g = self.groups.get(group) or GroupPolicy()

        def pick(name: str) -> Any:
            value = getattr(g, name)
            return value if value is not None else getattr(self, name)

        attempt = pick("attempt_timeout")
        return EffectivePolicy(
            deadline=pick("deadline"),
            attempt_timeout=attempt,
            first_chunk_timeout=pick("first_chunk_timeout") or min(STREAM_TIMEOUT_DEFAULT, attempt),
            stream_idle_timeout=pick("stream_idle_timeout") or min(STREAM_TIMEOUT_DEFAULT, attempt),
            learn_stream_timeouts=pick("first_chunk_timeout") is None,
            learn_idle_timeouts=pick("stream_idle_timeout") is None,
            connect_timeout=pick("connect_timeout"),
            min_attempt_time=self.min_attempt_time,
            backoff=pick("backoff"),
            breaker=pick("breaker"),
            retry_budget=pick("retry_budget"),
            hedge=pick("hedge"),
            degradation=pick("degradation"),
            restart_broken_streams=pick("restart_broken_streams"),
            continue_streams_with_prefill=pick("continue_streams_with_prefill"),
            max_stream_restarts=self.max_stream_restarts,
            classes={**self.classes, **g.classes},
        )


class EffectivePolicy(_Model):
    """A group's resolved policy (what ``llm-resilience check`` prints)."""

    deadline: float
    attempt_timeout: float
    first_chunk_timeout: float
    stream_idle_timeout: float
    learn_stream_timeouts: bool = False  # the first-chunk timeout adapts to observed TTFT
    learn_idle_timeouts: bool = False  # the idle timeout adapts to observed gaps between chunks
    connect_timeout: float | None
    min_attempt_time: float
    backoff: BackoffPolicy
    breaker: BreakerPolicy
    retry_budget: RetryBudgetPolicy
    hedge: HedgePolicy | None
    degradation: DegradationPolicy
    restart_broken_streams: bool
    continue_streams_with_prefill: bool
    max_stream_restarts: int = 3
    classes: dict[ErrorClass, ClassPolicy]


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
)


class RouterSpec(_Model):
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
