"""The engine of one router: the state every decision reads (breakers, retry budgets, holds,
hedging) and the bookkeeping of each attempt (admission, outcome, records, guards).

The drivers (:mod:`._engine.drivers`) walk a call's routes with it; a
:class:`~._engine.dispatch.Dispatcher` sends each attempt.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.breakers import (
    Admission,
    BreakerBackend,
    BreakerRegistry,
    DeploymentBreaker,
)
from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.core import (
    CallState,
    attempt_limit,
    provider_error_as_itself,
    streams_recovered,
)
from llm_resilience_plugin._engine.dispatch import Dispatcher
from llm_resilience_plugin._engine.hedging import HedgeState
from llm_resilience_plugin._engine.holds import HoldQueue
from llm_resilience_plugin._engine.learned import StreamTimings
from llm_resilience_plugin._engine.paces import PaceFor, Paces
from llm_resilience_plugin._engine.retry import RetryBudget, SharedTokens
from llm_resilience_plugin._engine.taxonomy import headers_of
from llm_resilience_plugin.errors import ErrorClass, Failure
from llm_resilience_plugin.events import (
    AttemptGuard,
    AttemptRecord,
    BreakerTransition,
    DeploymentInfo,
    Event,
    EventBus,
    hidden_params_of,
)
from llm_resilience_plugin.policy import EffectivePolicy, ResiliencePolicy, RouterSpec

_log = logging.getLogger("llm_resilience")

# Failures after which the request may have been processed (and billed) with no answer seen.
_NO_ANSWER = frozenset({ErrorClass.TIMEOUT, ErrorClass.CONNECTION, ErrorClass.SERVER})

BackendFor = Callable[[DeploymentInfo, EffectivePolicy], BreakerBackend | None]
BucketFor = Callable[[str, EffectivePolicy], SharedTokens | None]


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        return None
    return float(value)


def own_timeouts(
    policies: Mapping[str, EffectivePolicy],
    deployments: Mapping[str, DeploymentInfo],
    groups: Mapping[str, list[str]],
) -> dict[str, EffectivePolicy]:
    """The user's own LiteLLM settings win: a group whose deployments all set ``timeout`` (and
    ``stream_timeout``) in their ``litellm_params`` gets that as its attempt (first-chunk) timeout
    instead of the policy's default - the largest, when they differ, since the engine cannot know
    which one LiteLLM will pick."""
    out: dict[str, EffectivePolicy] = {}
    for group, ids in groups.items():
        update: dict[str, float] = {}
        for param, field in (("timeout", "attempt_timeout"), ("stream_timeout", "first_chunk_timeout")):
            values = [_seconds(deployments[d].params.get(param)) for d in ids]
            if values and all(v is not None for v in values):
                update[field] = max(v for v in values if v is not None)
        if update:
            pol = policies[group]
            changes: dict[str, Any] = dict(update)
            if "attempt_timeout" in update:
                changes["learn_answer_timeouts"] = False  # likewise for a whole answer
            if "first_chunk_timeout" in update:
                changes["learn_stream_timeouts"] = False  # the deployment said how long: keep it
            else:
                changes["first_chunk_timeout"] = min(pol.first_chunk_timeout, update["attempt_timeout"])
            out[group] = pol.model_copy(update=changes)
    return out


# The probe interval of a deployment whose group has a fallback (its breaker's probe_interval
# unset): while it is open its callers get a degradation, so it is probed this often.
PROBE_INTERVAL = 2.0


def preferred_routes(
    policies: Mapping[str, EffectivePolicy], spec: RouterSpec | None
) -> dict[str, EffectivePolicy]:
    """A group with a fallback whose breaker leaves ``probe_interval`` unset gets
    :data:`PROBE_INTERVAL`: an open breaker there sends its callers to a degradation, so the
    preferred route is probed at a short fixed interval, whatever its growing window says."""
    out: dict[str, EffectivePolicy] = {}
    for group, pol in policies.items():
        if pol.breaker.probe_interval is None and spec is not None and spec.fallback_chain(group, None):
            breaker = pol.breaker.model_copy(update={"probe_interval": PROBE_INTERVAL})
            out[group] = pol.model_copy(update={"breaker": breaker})
    return out


def group_policies(
    policy: ResiliencePolicy,
    spec: RouterSpec | None,
    deployments: Mapping[str, DeploymentInfo],
    groups: Mapping[str, list[str]],
    overrides: Mapping[str, EffectivePolicy] | None = None,
) -> dict[str, EffectivePolicy]:
    """The effective policy of each group: the policy's own for it, the deployments' LiteLLM
    timeouts (:func:`own_timeouts`), ``overrides``, then :func:`preferred_routes`."""
    policies = {g: policy.for_group(g) for g in groups}
    policies.update(own_timeouts(policies, deployments, groups))
    policies.update(overrides or {})
    policies.update(preferred_routes(policies, spec))
    return policies


class Retiring(dict[str, Any]):
    """A dict whose ``retired`` keys (taken out of the model list) still answer ``d[key]`` - for
    the attempts in flight there - while ``in``, ``get`` and iteration see the live keys only."""

    def __init__(self, *args: Any, retired: dict[str, Any] | None = None) -> None:
        super().__init__(*args)
        self.retired: dict[str, Any] = retired if retired is not None else {}

    def __missing__(self, key: str) -> Any:
        return self.retired[key]


def make_breaker(
    engine: Engine, info: DeploymentInfo, eff: EffectivePolicy, backend: BreakerBackend | None
) -> DeploymentBreaker:
    """The breaker of one deployment of ``engine`` under its group's policy ``eff``."""
    return DeploymentBreaker(
        info.id,
        info.model_group,
        eff.breaker,
        clock=engine.clock.wall,
        on_transition=engine.on_transition,
        probe_lease=eff.deadline,  # a probe no one reports on frees its slot by then
        backend=backend,
    )


class Engine:
    """Breakers per deployment, a retry budget and hedging state per group, and one attempt's
    bookkeeping. Public to the package: routing, streams and drivers use it, users do not."""

    def __init__(
        self,
        spec: RouterSpec | None,
        deployments: Mapping[str, DeploymentInfo],
        *,
        clock: Clock,
        seed: int | None,
        guards: list[AttemptGuard],
        policy: ResiliencePolicy | None = None,
        policies: Mapping[str, EffectivePolicy] | None = None,
        backend_for: BackendFor | None = None,
        bucket_for: BucketFor | None = None,
        pace_for: PaceFor | None = None,
        shared_breakers: bool = False,
        retry_on: Callable[[BaseException], bool] | None = None,
        retry_on_max: int = 2,
        degrades: bool = True,
        as_itself: Callable[[CallState, Failure], bool] | None = None,
        avoid_failed: bool = True,
    ) -> None:
        """``spec`` gives the fallback chains (None: no fallbacks); ``policies`` overrides the
        effective policy per group; ``retry_on`` marks caller exceptions retryable (they then
        count against the breaker); ``degrades`` allows context trimming and static answers
        (chat messages only)."""
        self.spec = spec
        policy = policy if policy is not None else (spec.policy if spec is not None else None)
        assert policy is not None, "an engine needs a spec or a policy"
        self.policy = policy
        self.retry_on = retry_on
        self.retry_on_max = retry_on_max
        self.degrades = degrades
        # Keep a call off a deployment after a failure its class says not to repeat there (a
        # router has others; a wrapped Runnable has only itself, so it retries in place).
        self.avoid_failed = avoid_failed
        # Which failure, if any, the caller sees as itself (see core.final_error).
        self.as_itself: Callable[[CallState, Failure], bool] = as_itself or provider_error_as_itself
        self.clock = clock
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.events = EventBus()
        self.guards = guards
        # By id and by group; a model-list change (routing/_model_list.py) swaps in new ones.
        self.deployments: dict[str, DeploymentInfo] = Retiring(deployments)
        self.group_deployments: dict[str, list[str]] = Retiring()
        for info in self.deployments.values():
            self.group_deployments.setdefault(info.model_group, []).append(info.id)
        self.policies = group_policies(self.policy, spec, self.deployments, self.group_deployments, policies)
        self.dispatcher: Dispatcher | None = None
        self._not_closed: set[str] = set()
        self.hold_until = 0.0  # when the last honoured Retry-After hold ends (0.0: none yet)
        self._hold_wave = 0.0  # when the last hold some call is waiting for ends
        # Shared (multi-process) breaker state can change without a local transition event.
        self._shared_breakers = shared_breakers
        self._epochs = itertools.count(1)
        self.epoch = 0  # the last breaker transition's number; changed_at: per deployment
        self.changed_at: dict[str, int] = {}
        self.breakers = BreakerRegistry()
        for info in self.deployments.values():
            eff = self.policies[info.model_group]
            backend = backend_for(info, eff) if backend_for is not None else None
            self.breakers.add(make_breaker(self, info, eff, backend))
        self.budgets: dict[str, RetryBudget] = {
            g: RetryBudget(p.retry_budget, shared=bucket_for(g, p) if bucket_for is not None else None)
            for g, p in self.policies.items()
        }
        self.timings = {g: StreamTimings() for g in self.policies}
        self.hold_queue = HoldQueue()  # who waits out a Retry-After hold, who fails over
        self.hedges = {
            g: HedgeState(p.hedge)
            for g, p in self.policies.items()
            if p.hedge is not None and p.hedge.enabled
        }
        self.paces = Paces(self.policy, self.deployments.values(), clock, pace_for)

    # -- state the filter and the drivers read ---------------------------------------------------

    def on_transition(self, event: BreakerTransition) -> None:
        """A breaker changed state: stamp it, keep the fast path's set current, tell observers."""
        if event.deployment_id not in self.deployments:
            return  # a retired breaker (its deployment left the model list): no one's concern
        epoch = next(self._epochs)  # stamped before _not_closed changes: see attempt()
        self.changed_at[event.deployment_id] = epoch
        self.epoch = epoch
        if event.new_state == "closed":
            self._not_closed.discard(event.deployment_id)
        else:
            self._not_closed.add(event.deployment_id)
        self.events.emit(event)

    def retire(self, deployment_ids: Iterable[str]) -> None:
        """These deployments left the model list: their breakers no longer hold the fast path off."""
        for dep in deployment_ids:
            self._not_closed.discard(dep)

    def all_clear(self) -> bool:
        """Every breaker closed and no Retry-After hold pending (the filter's fast path)."""
        hold = self.hold_until  # 0.0 until some Retry-After was honoured
        return not self._not_closed and not self._shared_breakers and (not hold or self.clock.wall() >= hold)

    def emit(self, call: CallState, event: Event) -> None:
        """Publish ``event`` to subscribers and to the call's own listener (which never breaks a call)."""
        self.events.emit(event)
        if call.listener is not None:
            try:
                call.listener(event)
            except Exception:
                _log.exception("call listener failed")

    def admissible(self, call: CallState, group: str, now: float) -> list[str]:
        """Deployments of ``group`` this call may still try whose breakers would admit it."""
        return [
            d
            for d in self.group_deployments[group]
            if d not in call.never_again and self.breakers[d].could_admit(now)
        ]

    def earliest_free(self, call: CallState, group: str) -> float:
        """Seconds until some admissible deployment of ``group`` is free of its Retry-After hold."""
        now = self.clock.wall()
        waits = [self.breakers[d].held_for(now) for d in self.admissible(call, group, now)]
        return min(waits) if waits else 0.0

    def hold_slot(self, call: CallState, group: str) -> float | None:
        """A place in the queue of the held deployment of ``group`` that frees first and has room
        (see _engine.holds): the seconds to wait; None when every queue is full; 0 if one is free."""
        now = self.clock.wall()
        holds = [(d, self.breakers[d].held_for(now)) for d in self.admissible(call, group, now)]
        if not holds or any(h <= 0 for _, h in holds):
            return 0.0
        return self.hold_queue.try_wait(holds, now)

    def spread_hold(self, hold: float, most: float) -> float:
        """The wait of a call held ``hold`` seconds by a Retry-After (at most ``most``). A call
        that is the only one waiting for a hold comes back when it ends; while other calls are
        already waiting, it comes back at a random time over up to twice the hold more (full
        jitter after the hold), so a rate limit that lifts is not tripped again at once by the
        whole queue."""
        now = self.clock.wall()
        with self.rng_lock:
            alone = self._hold_wave <= now  # no other call is waiting for a hold to end
            self._hold_wave = max(self._hold_wave, now + hold)
            if alone or most <= hold:
                return hold
            return hold + self.rng.uniform(0.0, min(2 * hold, most - hold))

    def fallback_chain(self, group: str, error_class: ErrorClass | None) -> list[str]:
        """The fallback groups of ``group`` after a failure of ``error_class``."""
        return self.spec.fallback_chain(group, error_class) if self.spec is not None else []

    def has_fallback(self, call: CallState, group: str) -> bool:
        """Is there a generic fallback group this call could still move to?"""
        requested = call.report.requested_group
        return any(g != group for g in self.fallback_chain(requested, ErrorClass.RATE_LIMIT))

    def can_go_elsewhere(self, call: CallState, group: str) -> bool:
        """Could this call still try another deployment of ``group`` or another group?"""
        if not call.never_again and len(self.group_deployments[group]) > 1:
            return True  # the common case, without building the list below
        others = [d for d in self.group_deployments[group] if d not in call.never_again]
        return len(others) > 1 or self.has_fallback(call, group)

    def first_chunk_timeout(self, call: CallState, group: str) -> float:
        """The first-chunk limit of a stream attempt in ``group`` (see core.attempt_limit)."""
        pol = self.policies[group]
        attempt = call.opts.attempt_timeout or pol.attempt_timeout
        learned = self.timings[group].first_chunk(pol.first_chunk_timeout, attempt)
        return attempt_limit(call, pol, elsewhere=self.can_go_elsewhere(call, group), learned=learned)

    def answer_timeout(self, call: CallState, group: str) -> float:
        """A non-stream attempt's limit: the attempt timeout, or - while the call can go elsewhere
        and no timeout was set - one learned from the group's answer times (never above it)."""
        pol = self.policies[group]
        limit = attempt_limit(call, pol) if call.stream else call.opts.attempt_timeout or pol.attempt_timeout
        if call.opts.attempt_timeout or not pol.learn_answer_timeouts:
            return limit
        learned = self.timings[group].answer(limit)
        if learned >= limit or not self.can_go_elsewhere(call, group):
            return limit
        return learned

    def idle_timeout(self, call: CallState, group: str) -> float:
        """The longest silence a stream in ``group`` may keep between chunks."""
        pol = self.policies[group]
        if call.opts.stream_idle_timeout:
            return call.opts.stream_idle_timeout
        attempt = call.opts.attempt_timeout or pol.attempt_timeout
        if not pol.learn_idle_timeouts:
            return pol.stream_idle_timeout
        if not self.can_go_elsewhere(call, group):
            return attempt
        if not streams_recovered(call, self.policies[call.report.requested_group]):
            return min(pol.stream_idle_timeout, attempt)
        return self.timings[group].idle(pol.stream_idle_timeout, attempt)

    def counts_against(self, failure: Failure) -> bool:
        """Is this failure evidence against the deployment (and a spend of the retry budget)?"""
        if failure.counts_against_deployment:
            return True
        return (
            self.retry_on is not None
            and failure.error_class is not ErrorClass.CIRCUIT_OPEN
            and bool(self.retry_on(failure.exception))
        )

    def hedge_for(self, call: CallState, group: str) -> HedgeState | None:
        """The group's hedging state, unless this call may not be hedged."""
        hedge = self.hedges.get(group)
        if hedge is not None and (
            not call.opts.idempotent or (call.tier is not None and not call.tier.hedge)
        ):
            return None
        return hedge

    def release(self, admission: Admission | None) -> None:
        """Hand back a breaker ticket without an outcome (cancelled, or closed early)."""
        if admission is not None:
            self.breakers[admission.deployment_id].release(admission)

    def breaker_state(self, dep: str | None) -> str | None:
        """The state of ``dep``'s breaker, or None for no deployment."""
        if dep is None or dep not in self.deployments:
            return None
        if dep not in self._not_closed and not self._shared_breakers:
            return "closed"  # transitions keep _not_closed current for in-process breakers
        return self.breakers[dep].state

    def attempt_succeeded(
        self,
        call: CallState,
        group: str,
        level: int,
        actx: AttemptContext,
        started_wall: float,
        latency: float,
        wait_before: float,
        ttft: float | None = None,
        response: Any | None = None,
        usage: Mapping[str, int] | None = None,
        served_model: str | None = None,
        cost: float | None = None,
    ) -> None:
        """Count a success: breaker ticket, retry budget, hedging latency, guards, the record
        (with the served model, usage and cost, read from ``response`` unless given)."""
        if actx.admission is not None:
            self.breakers[actx.admission.deployment_id].record_success(actx.admission)
        self.budgets[group].on_success()
        hidden = (actx.hidden or hidden_params_of(response)) if response is not None else None
        if actx.picked is not None:
            self.hold_queue.answered(actx.picked, self.clock.wall())
            if self.paces.enabled:
                self.paces.answered(actx.picked, actx.grant, self.clock.monotonic() - latency, hidden, usage)
        if not call.stream:
            self.timings[group].observe_answer(latency)
        hedge = self.hedges.get(group) if self.hedges else None
        if hedge is not None:
            hedge.observe(ttft if ttft is not None else latency)
        if actx.guard_tokens:
            actx.settle_guards(response, usage, None)
        if response is not None:
            model = getattr(response, "model", None)
            served_model = served_model or (str(model) if model else None)
            reported = (hidden or {}).get("response_cost")
            if cost is None and isinstance(reported, int | float) and not isinstance(reported, bool):
                cost = float(reported)
        self.record(
            call,
            group,
            level,
            actx,
            None,
            started_wall,
            latency,
            wait_before,
            "success",
            ttft,
            served_model=served_model,
            usage=dict(usage) if usage else None,
            cost=cost,
        )

    def attempt_failed(
        self,
        call: CallState,
        group: str,
        level: int,
        actx: AttemptContext,
        failure: Failure,
        started_wall: float,
        latency: float,
        wait_before: float,
    ) -> None:
        """Count a failure: breaker (only if it is the deployment's fault), Retry-After hold,
        retry budget, where this call may go next, guards, the record."""
        call.add_failure(failure)
        if actx.guard_tokens:
            billable = actx.sent and failure.status is None and failure.error_class in _NO_ANSWER
            actx.settle_guards(None, None, failure, billable=billable)
        dep = actx.picked
        adm = actx.admission
        counts = self.counts_against(failure)
        pol = self.policies[group]
        paced = self.paces.enabled and failure.error_class is ErrorClass.RATE_LIMIT
        if adm is not None:
            b = self.breakers[adm.deployment_id]
            if failure.error_class is ErrorClass.RATE_LIMIT:
                b.record_rate_limited(adm)  # a 429 is not an outage: see rate_limit_open_after
            elif counts:
                b.record_failure(adm)
            else:
                b.release(adm)
            if paced and failure.status is not None:  # the provider's 429: the pace takes it
                headers = headers_of(failure.exception)
                self.paces.rate_limited(
                    adm.deployment_id,
                    failure.retry_after,
                    headers,
                    latency,
                    actx.grant,
                    self.group_deployments.get(group, ()),
                )
            elif failure.retry_after:
                b.hold(failure.retry_after)
                self.hold_queue.held(adm.deployment_id, self.clock.wall(), failure.retry_after, call.call_id)
                self.hold_until = max(self.hold_until, self.clock.wall() + failure.retry_after)
        self.paces.finished(actx.grant, actx.sent)
        if counts and not paced:  # paced 429s are bounded by the pace, not the retry budget
            self.budgets[group].on_failure()
        if dep is not None:
            call.mark_failed(dep)
            # A long silence then an error is a silent deployment whatever the class says (a
            # connection held 15 s then dropped): never wait on it twice in one call.
            # (A 429 is an answer, however slowly it came: the pace handles it.)
            silent = (
                actx.timeout_s > 0
                and latency > actx.timeout_s / 2
                and failure.error_class is not ErrorClass.RATE_LIMIT
            )
            if self.avoid_failed and (silent or not pol.classes[failure.error_class].same_deployment):
                call.avoid(dep)
        sent = actx.sent or (dep is not None and failure.error_class is not ErrorClass.CIRCUIT_OPEN)
        outcome = "failure" if sent else "skipped"
        self.record(call, group, level, actx, failure, started_wall, latency, wait_before, outcome)

    def record(
        self,
        call: CallState,
        group: str,
        level: int,
        actx: AttemptContext | None,
        failure: Failure | None,
        started_wall: float,
        latency: float,
        wait_before: float,
        outcome: Any,
        ttft: float | None = None,
        *,
        served_model: str | None = None,
        usage: dict[str, int] | None = None,
        cost: float | None = None,
    ) -> None:
        """One attempt record: built now if someone listens, else when the report is read."""
        dep = actx.picked if actx is not None else None
        values = (  # AttemptRecord's fields, in order
            call.call_id,
            actx.number if actx is not None else call.attempt_no,
            group,
            dep,
            level,
            outcome,
            failure.error_class if failure else None,
            failure.status if failure else None,
            failure.message if failure else None,
            started_wall,
            latency,
            wait_before,
            self.breaker_state(dep),
            ttft,
            bool(actx and actx.admission and actx.admission.probe),
            served_model,
            usage,
            cost,
            call.operation,
        )
        if call.listener is None and not self.events.active:
            call.report.defer_attempt(values)  # nobody takes it now: built if the report is read
            return
        rec = AttemptRecord(*values)
        call.report.attempts.append(rec)
        self.emit(call, rec)
