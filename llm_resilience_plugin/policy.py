"""Validated configuration: the resilience policy, and a LiteLLM Router config that carries it.

Everything a user can get wrong is checked here, before a request is sent, and reported as a
:class:`ConfigError` that names the field and says how to fix it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llm_resilience_plugin.errors import ConfigError, ErrorClass

Action = Literal["retry", "failover", "fail"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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
        default=0.5,
        ge=0,
        description="When a fallback group exists, a Retry-After wait longer than this fails over "
        "instead of waiting (latency over staying on the preferred group). None: always wait.",
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
    reset_timeout: float = Field(default=30.0, gt=0, le=86400)
    success_threshold: int = Field(default=1, ge=1, le=100)
    half_open_max_probes: int = Field(default=1, ge=1, le=100)


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
    levels: dict[int, LevelDegradation] = Field(default_factory=dict)

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
    classes: dict[ErrorClass, ClassPolicy] = Field(default_factory=dict)


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
        description="Streams: seconds to the first chunk (default: attempt_timeout).",
    )
    stream_idle_timeout: float | None = Field(
        default=None, gt=0, description="Streams: longest silence between chunks (default: attempt_timeout)."
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
    classes: dict[ErrorClass, ClassPolicy] = Field(default_factory=_default_class_policies)
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
            first_chunk_timeout=pick("first_chunk_timeout") or attempt,
            stream_idle_timeout=pick("stream_idle_timeout") or attempt,
            connect_timeout=pick("connect_timeout"),
            min_attempt_time=self.min_attempt_time,
            backoff=pick("backoff"),
            breaker=pick("breaker"),
            retry_budget=pick("retry_budget"),
            hedge=pick("hedge"),
            degradation=pick("degradation"),
            restart_broken_streams=pick("restart_broken_streams"),
            continue_streams_with_prefill=pick("continue_streams_with_prefill"),
            classes={**self.classes, **g.classes},
        )


class EffectivePolicy(_Model):
    """A group's resolved policy (what ``llm-resilience check`` prints)."""

    deadline: float
    attempt_timeout: float
    first_chunk_timeout: float
    stream_idle_timeout: float
    connect_timeout: float | None
    min_attempt_time: float
    backoff: BackoffPolicy
    breaker: BreakerPolicy
    retry_budget: RetryBudgetPolicy
    hedge: HedgePolicy | None
    degradation: DegradationPolicy
    restart_broken_streams: bool
    continue_streams_with_prefill: bool
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


class RouterSpec(_Model):
    """A LiteLLM Router config plus the plugin's policy, validated together."""

    model_list: list[dict[str, Any]] = Field(min_length=1)
    router_settings: dict[str, Any] = Field(default_factory=dict)
    fallbacks: FallbackMap = Field(default_factory=dict)
    context_window_fallbacks: FallbackMap = Field(default_factory=dict)
    content_policy_fallbacks: FallbackMap = Field(default_factory=dict)
    default_fallbacks: list[str] = Field(default_factory=list)
    policy: ResiliencePolicy = Field(default_factory=ResiliencePolicy)

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


def _check_spec(self: RouterSpec) -> None:
    """Cross-field checks, each raising ConfigError(field, fix)."""
    for i, d in enumerate(self.model_list):
        if not isinstance(d, Mapping):
            raise ConfigError(f"model_list[{i}]", "must be a mapping with model_name and litellm_params")
        if not isinstance(d.get("model_name"), str) or not d["model_name"]:
            raise ConfigError(f"model_list[{i}].model_name", "is required (the model group name)")
        params = d.get("litellm_params")
        if not isinstance(params, Mapping) or not isinstance(params.get("model"), str):
            raise ConfigError(
                f"model_list[{i}].litellm_params.model", "is required, e.g. 'openai/gpt-4o-mini'"
            )
        info = d.get("model_info")
        if info is not None and not isinstance(info, Mapping):
            raise ConfigError(f"model_list[{i}].model_info", "must be a mapping")
    groups = set(self.groups)
    known = ", ".join(sorted(groups))
    ids = [(d.get("model_info") or {}).get("id") for d in self.model_list]
    dup = {i for i in ids if i is not None and ids.count(i) > 1}
    if dup:
        raise ConfigError("model_list", f"model_info.id must be unique, repeated: {sorted(dup)}")
    for key in ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks"):
        for src, targets in getattr(self, key).items():
            if src not in groups:
                raise ConfigError(f"{key}", f"unknown model group {src!r}; known groups: {known}")
            for t in targets:
                if t not in groups:
                    raise ConfigError(f"{key}.{src}", f"unknown fallback group {t!r}; known groups: {known}")
                if t == src:
                    raise ConfigError(f"{key}.{src}", "a group cannot fall back to itself")
    for t in self.default_fallbacks:
        if t not in groups:
            raise ConfigError("default_fallbacks", f"unknown model group {t!r}; known groups: {known}")
    for g in self.policy.groups:
        if g not in groups:
            raise ConfigError("resilience.groups", f"unknown model group {g!r}; known groups: {known}")


def _fallback_map(value: Any, field: str) -> FallbackMap:
    """Accept LiteLLM's list-of-single-key-dicts form as well as a plain mapping."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str):
        items = []
        for i, entry in enumerate(value):
            if not isinstance(entry, Mapping):
                raise ConfigError(
                    f"{field}[{i}]",
                    f"expected a mapping like {{'primary': ['backup']}}, got {type(entry).__name__}",
                )
            items.extend(entry.items())
    else:
        raise ConfigError(field, "expected a list like [{'primary': ['backup']}]")
    out: FallbackMap = {}
    for src, targets in items:
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, Sequence) or not all(isinstance(t, str) for t in targets):
            raise ConfigError(f"{field}.{src}", "expected a list of model group names")
        out.setdefault(str(src), []).extend(targets)
    return out


def _format_validation_error(err: ValidationError, prefix: str) -> ConfigError:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if p != "__root__")
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "config")
    msg = first["msg"].removeprefix("Value error, ")
    hint = ""
    if first["type"] == "extra_forbidden":
        hint = " (unknown field: check the spelling against README 'Configuration')"
    if len(err.errors()) > 1:
        hint += f" (+{len(err.errors()) - 1} more problem(s))"
    return ConfigError(field, msg + hint)


def build_policy(data: Any) -> ResiliencePolicy:
    """Validate a policy mapping (or pass a policy through)."""
    if data is None:
        return ResiliencePolicy()
    if isinstance(data, ResiliencePolicy):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError("resilience", f"expected a mapping, got {type(data).__name__}")
    try:
        return ResiliencePolicy.model_validate(dict(data))
    except ValidationError as e:
        raise _format_validation_error(e, "resilience") from None


def build_spec(
    model_list: Any,
    *,
    router_settings: Mapping[str, Any] | None = None,
    policy: Any = None,
    fallbacks: Any = None,
    context_window_fallbacks: Any = None,
    content_policy_fallbacks: Any = None,
    default_fallbacks: Any = None,
) -> RouterSpec:
    """Validate a Router config plus policy into a :class:`RouterSpec` (raises ConfigError)."""
    settings = dict(router_settings or {})
    if not isinstance(model_list, list) or not model_list:
        raise ConfigError("model_list", "expected a non-empty list of deployments")
    pol = build_policy(policy)
    # Honour the user's LiteLLM retry/timeout settings as our defaults when the policy is silent.
    overrides: dict[str, Any] = {}
    if "timeout" in settings and settings["timeout"] is not None:
        t = settings["timeout"]
        if not isinstance(t, int | float) or isinstance(t, bool) or t <= 0 or math.isnan(t):
            raise ConfigError("router_settings.timeout", "must be a positive number of seconds")
        if policy is None or "attempt_timeout" not in (policy if isinstance(policy, Mapping) else {}):
            overrides["attempt_timeout"] = float(t)
    if overrides:
        pol = pol.model_copy(update=overrides)
    fb = _fallback_map(fallbacks if fallbacks is not None else settings.get("fallbacks"), "fallbacks")
    cw = _fallback_map(
        context_window_fallbacks
        if context_window_fallbacks is not None
        else settings.get("context_window_fallbacks"),
        "context_window_fallbacks",
    )
    cp = _fallback_map(
        content_policy_fallbacks
        if content_policy_fallbacks is not None
        else settings.get("content_policy_fallbacks"),
        "content_policy_fallbacks",
    )
    dfb = default_fallbacks if default_fallbacks is not None else settings.get("default_fallbacks")
    if dfb is not None and (not isinstance(dfb, list) or not all(isinstance(x, str) for x in dfb)):
        raise ConfigError("default_fallbacks", "expected a list of model group names")
    passthrough = {k: v for k, v in settings.items() if k not in OWNED_ROUTER_SETTINGS}
    for i, d in enumerate(model_list):
        if not isinstance(d, Mapping):
            raise ConfigError(f"model_list[{i}]", "must be a mapping with model_name and litellm_params")
    try:
        spec = RouterSpec(
            model_list=model_list,
            router_settings=passthrough,
            fallbacks=fb,
            context_window_fallbacks=cw,
            content_policy_fallbacks=cp,
            default_fallbacks=list(dfb or []),
            policy=pol,
        )
    except ValidationError as e:
        raise _format_validation_error(e, "") from None
    _check_spec(spec)
    return spec


def load_config(path: str | Path) -> RouterSpec:
    """Read a LiteLLM proxy-style YAML (``model_list``, ``router_settings``, ``resilience``)."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError("path", f"config file not found: {p}") from None
    except yaml.YAMLError as e:
        raise ConfigError("path", f"{p} is not valid YAML: {e}") from None
    return spec_from_mapping(raw, source=str(p))


def spec_from_mapping(raw: Any, source: str = "config") -> RouterSpec:
    """Validate a parsed config mapping (the YAML's top level)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(source, "the top level must be a mapping with model_list")
    unknown = set(raw) - {
        "model_list",
        "router_settings",
        "resilience",
        "litellm_settings",
        "general_settings",
        "environment_variables",
    }
    if unknown:
        raise ConfigError(
            ", ".join(sorted(unknown)),
            "unknown top-level key(s); expected model_list, router_settings, resilience",
        )
    settings = raw.get("router_settings") or {}
    if not isinstance(settings, Mapping):
        raise ConfigError("router_settings", "expected a mapping")
    return build_spec(raw.get("model_list"), router_settings=settings, policy=raw.get("resilience"))
