"""The resilience policy's models: per-class actions, backoff, breakers, budgets, hedging,
degradation and tiers, and the per-group policy they resolve to."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.policy._observability import ObservabilityPolicy

Action = Literal["retry", "failover", "fail"]
ReplayRule = Literal["auto", "always", "never"]
# Error classes are keys written as strings in YAML: matched by value, everything else is strict.
ClassKey = Annotated[ErrorClass, Strict(False)]


class Model(BaseModel):
    """Strict: ``true`` or ``"10"`` is not a number, ``"yes"`` not a bool, NaN/inf not a time."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False
    )


# Streams: the first-chunk and idle timeouts when none is configured and the call can go elsewhere.
STREAM_TIMEOUT_DEFAULT = 10.0


class ClassPolicy(Model):
    """What to do with one class of failure: retry in the group, fail over, or fail."""

    action: Action
    max_retries: int = Field(default=0, ge=0, le=20)
    same_deployment: bool = Field(
        default=True,
        description="May a retry go back to the deployment that just failed (if nothing else is healthy)?",
    )


def _default_class_policies() -> dict[ErrorClass, ClassPolicy]:
    return {
        # A 429 under pacing costs the provider little and the next attempt waits for its slot.
        ErrorClass.RATE_LIMIT: ClassPolicy(action="retry", max_retries=4),
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


class BackoffPolicy(Model):
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


class BreakerPolicy(Model):
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
    probe_interval: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="The longest a breaker stays open between probes, whatever the growing window "
        "says: one probe per interval, never two in flight (Envoy's unhealthy_interval). None: "
        "2 s for deployments of a group with a fallback - while open, "
        "their callers are served a degradation - and the growing window alone elsewhere.",
    )
    success_threshold: int = Field(default=1, ge=1, le=100)
    half_open_max_probes: int = Field(default=1, ge=1, le=100)
    rate_limit_fail_max: int | None = Field(
        default=10,
        ge=1,
        le=10000,
        description="429s in a row (no success between) that, spanning rate_limit_open_after "
        "seconds, open the breaker. A rate limit is not an outage: a deployment that answers some "
        "calls while refusing others is paced, never ejected. None: 429s never open it.",
    )
    rate_limit_open_after: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="A deployment that has answered nothing but 429s for this long (and at least "
        "rate_limit_fail_max of them) is treated as down (an exhausted quota, a revoked tier).",
    )

    def open_for(self, streak: int) -> float:
        """Seconds a breaker stays open after its ``streak``-th trip in a row (1 = first)."""
        first = min(self.min_reset_timeout, self.reset_timeout)
        return min(self.reset_timeout, first * 2 ** max(0, streak - 1))

    def window(self, streak: int) -> float:
        """Seconds a breaker stays open after its ``streak``-th trip in a row: the growing window,
        at most ``probe_interval`` when one is set."""
        grown = self.open_for(streak)
        return grown if self.probe_interval is None else min(grown, self.probe_interval)


class RetryBudgetPolicy(Model):
    """Token bucket per model group that bounds retry amplification during an outage."""

    enabled: bool = True
    capacity: float = Field(default=20.0, gt=0)
    refund_per_success: float = Field(default=0.1, ge=0)
    min_fraction: float = Field(
        default=0.5, ge=0, le=1, description="No retries while tokens < capacity * min_fraction."
    )


class HedgePolicy(Model):
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


class LevelDegradation(Model):
    """What changes at one fallback level (1 = first fallback group, ...)."""

    max_tokens: int | None = Field(default=None, ge=1)
    drop_tools: bool = False
    deadline: float | None = Field(default=None, gt=0, description="Cap on the time left, in seconds.")


class DegradationPolicy(Model):
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


class TierPolicy(Model):
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


class GroupPolicy(Model):
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
    recover_broken_streams: bool | None = None
    replay_broken_streams: ReplayRule | None = None
    restart_broken_streams: bool | None = None
    continue_streams_with_prefill: bool | None = None
    classes: dict[ClassKey, ClassPolicy] = Field(default_factory=dict)


# -- shared state on Redis (issue #6; see docs/scaling-out.md) --------------------------------------


class SharedStatePolicy(Model):
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


class DeploymentLimits(Model):
    """A deployment's (or every deployment of a group's) rate limits, per minute."""

    rpm: float | None = Field(default=None, gt=0, description="Requests per minute.")
    tpm: float | None = Field(default=None, gt=0, description="Tokens (input + output) per minute.")
    burst: float | None = Field(
        default=None, gt=0, description="Requests that may go at once (default: one second's worth)."
    )


class AdaptiveConcurrency(Model):
    """An in-flight limit that follows latency (Gradient2): it grows while answers come back as
    fast as usual and shrinks when they slow down, so a slowing provider is not piled onto."""

    initial: int = Field(default=20, ge=1, le=100_000, description="The limit to start from.")
    min: int = Field(default=1, ge=1, le=100_000, description="The limit never goes below this.")
    max: int = Field(default=1000, ge=1, le=100_000, description="The limit never goes above this.")
    tolerance: float = Field(
        default=1.5,
        ge=1.0,
        le=10.0,
        description="How much slower than its long-run latency a deployment may answer before the "
        "limit shrinks.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveConcurrency:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not be above max ({self.max})")
        return self


class PacingPolicy(Model):
    """Client-side pacing of rate-limited deployments (docs/rate-limits.md)."""

    enabled: bool = Field(
        default=True,
        description="Pace deployments with a limit (configured or learned); False: 429s are retried "
        "with backoff and Retry-After holds only.",
    )
    learn: bool = Field(
        default=True,
        description="Learn limits from 429s and x-ratelimit-* / anthropic-ratelimit-* headers "
        "(configured limits cap what is learned).",
    )
    headroom: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="Configured and header-given limits are paced at this share (clock skew, latency).",
    )
    limits: dict[str, DeploymentLimits] = Field(
        default_factory=dict,
        description="Limits by deployment id or model group, over LiteLLM's rpm/tpm in litellm_params.",
    )
    concurrency: dict[str, AdaptiveConcurrency] = Field(
        default_factory=dict,
        description='Adaptive in-flight limits by deployment id or model group ("*": every '
        "deployment); none by default.",
    )
    on_shared_state_error: Literal["local_share", "fail_closed"] = Field(
        default="local_share",
        description="Redis unreachable while the fleet shares paces: pace on this process's own "
        "buckets (the limit divided by the workers last seen), or send nothing.",
    )

    def limits_for(self, deployment_id: str | None, group: str) -> DeploymentLimits | None:
        """The ``limits`` entry that applies to a deployment (its id first, then its group)."""
        return self.limits.get(deployment_id or "") or self.limits.get(group)

    def concurrency_for(self, deployment_id: str | None, group: str) -> AdaptiveConcurrency | None:
        """The ``concurrency`` entry that applies to a deployment (its id, its group, then "*")."""
        c = self.concurrency
        return c.get(deployment_id or "") or c.get(group) or c.get("*")


class ResiliencePolicy(Model):
    """The whole policy. Each default and why: the manual's "Policy and error classes" page."""

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
    recover_broken_streams: bool = Field(
        default=True,
        description="Streams broken after content go on seamlessly (prefill continuation, verified "
        "replay; no marker); else, or when nothing works, StreamInterruptedError (docs/streaming.md).",
    )
    replay_broken_streams: ReplayRule = Field(
        default="auto",
        description="Seamless recovery: when a broken stream is replayed from scratch and checked "
        "against what was shown. 'auto': only a reproducible request (temperature 0 or a seed, one "
        "choice) on a deployment of the same model; 'always'; 'never'.",
    )
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
    pacing: PacingPolicy = Field(default_factory=PacingPolicy)
    # Exporters turned on when the router is built (policy/_observability.py); None: only an
    # explicit instrument(router) call does.
    observability: ObservabilityPolicy | None = None
    dispatch: Literal["auto", "router", "direct"] = Field(
        default="auto",
        description="How attempts are sent: 'direct' through litellm.acompletion with the arguments "
        "the Router would send (refused for a group where that is not proven equivalent), 'router' "
        "through litellm.Router, 'auto' direct wherever equivalent (see `llm-resilience check`).",
    )

    embedding_batch_concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="How many batches of one split embedding call are in flight at once (never more "
        "than the smallest max_parallel_requests among the group's deployments); 1 sends them in turn.",
    )

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
            recover_broken_streams=pick("recover_broken_streams"),
            replay_broken_streams=pick("replay_broken_streams"),
            restart_broken_streams=pick("restart_broken_streams"),
            continue_streams_with_prefill=pick("continue_streams_with_prefill"),
            max_stream_restarts=self.max_stream_restarts,
            classes={**self.classes, **g.classes},
        )


class EffectivePolicy(Model):
    """A group's resolved policy (what ``llm-resilience check`` prints).

    The timeouts are the static values. Where a ``learn_*`` flag is true, the engine applies per
    attempt the value learned from the group's traffic instead (4 x the p95, at least 1 s, at most
    the attempt timeout, once 20 samples are known) and, for a stream with nowhere else to go, the
    attempt timeout: the limit applied can differ from the one shown here (docs/streaming.md).
    """

    deadline: float
    attempt_timeout: float
    first_chunk_timeout: float = Field(
        description="Static limit to a stream's first chunk; learned over when learn_stream_timeouts."
    )
    stream_idle_timeout: float = Field(
        description="Static limit of the silence between two chunks; learned over when learn_idle_timeouts."
    )
    learn_stream_timeouts: bool = False  # the first-chunk timeout adapts to observed TTFT
    learn_idle_timeouts: bool = False  # the idle timeout adapts to observed gaps between chunks
    learn_answer_timeouts: bool = True  # a non-stream attempt's limit adapts to observed answer times
    connect_timeout: float | None
    min_attempt_time: float
    backoff: BackoffPolicy
    breaker: BreakerPolicy
    retry_budget: RetryBudgetPolicy
    hedge: HedgePolicy | None
    degradation: DegradationPolicy
    recover_broken_streams: bool = True
    replay_broken_streams: ReplayRule = "auto"
    restart_broken_streams: bool
    continue_streams_with_prefill: bool
    max_stream_restarts: int = 3
    classes: dict[ErrorClass, ClassPolicy]
