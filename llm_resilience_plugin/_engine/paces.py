"""The paces of one router's deployments (see :mod:`._engine.pacing`): built from the policy and
each deployment's own ``rpm``/``tpm``, told of every answer and 429, and asked by admission."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.concurrency import Gradient
from llm_resilience_plugin._engine.core import CallState
from llm_resilience_plugin._engine.limits import configured_limits
from llm_resilience_plugin._engine.pacing import Grant, Pace, SharedPace
from llm_resilience_plugin.events import DeploymentInfo
from llm_resilience_plugin.policy import ResiliencePolicy

PaceFor = Callable[[DeploymentInfo], SharedPace | None]
_warmed: set[str] = set()
_warm_lock = threading.Lock()


def warm_token_counter(model: str) -> None:
    """Load LiteLLM's tokenizer for ``model`` on a background thread, once per process: a token
    limit counts every paced request's input, and the first count loads the tokenizer (a second
    or more), which would otherwise be the first paced call's wait."""
    with _warm_lock:
        if model in _warmed:
            return
        _warmed.add(model)

    def load() -> None:
        try:
            import litellm

            litellm.token_counter(model=model, text="warm")
        except Exception:  # a failed warm-up only means the first count loads it
            pass

    threading.Thread(target=load, name="llm-resilience-token-counter", daemon=True).start()


class Paces(dict[str, Pace]):
    """Every deployment's :class:`Pace`, by deployment id. ``on`` is False while nothing is paced:
    attempts then skip admission altogether (the fast path)."""

    def __init__(
        self,
        policy: ResiliencePolicy,
        deployments: Iterable[DeploymentInfo],
        clock: Clock,
        pace_for: PaceFor | None = None,
    ) -> None:
        super().__init__()
        # Paces of deployments taken out of the model list (routing/_model_list.py): only
        # ``paces[id]`` still finds one, for the attempts in flight there.
        self.retired: dict[str, Pace] = {}
        pacing = policy.pacing
        self.enabled = pacing.enabled
        for info in deployments:
            override = pacing.limits_for(info.id, info.model_group)
            limits = configured_limits(info.params, override.model_dump() if override else None)
            pace = Pace(
                info.id,
                clock,
                configured=limits,
                learn=pacing.learn,
                headroom=pacing.headroom,
                shared=pace_for(info) if pace_for is not None and limits is not None else None,
                fail_closed=pacing.on_shared_state_error == "fail_closed",
            )
            pace.tiers = len(policy.tiers)
            adaptive = pacing.concurrency_for(info.id, info.model_group)
            if adaptive is not None and pacing.enabled:
                pace.concurrency = Gradient(adaptive.initial, adaptive.min, adaptive.max, adaptive.tolerance)
            if not pacing.enabled:
                pace.end_slow_start()
            self[info.id] = pace
            if limits is not None and limits.tokens_per_s is not None and pacing.enabled:
                warm_token_counter(info.model)
        # While any deployment is paced (a limit, a 429 seen, its slow start) attempts ask for
        # admission; admission turns it off again once nothing is.
        self.on = pacing.enabled
        self._ranks = {name: i for i, name in enumerate(policy.tiers)}
        self._default_rank = self._ranks.get(policy.default_tier or "P1", len(self._ranks) // 2)

    def __missing__(self, dep: str) -> Pace:
        return self.retired[dep]

    def rank_of(self, call: CallState) -> int:
        """The call's priority tier as a queue rank (P0 first; no priority: the default tier)."""
        name = call.report.priority
        return self._ranks.get(name, self._default_rank) if name is not None else self._default_rank

    def answered(
        self,
        dep: str,
        grant: Grant | None,
        sent_at: float,
        hidden: Mapping[str, Any] | None,
        usage: Mapping[str, int] | None,
    ) -> None:
        """An answer from ``dep``: the deployment accepted the request (its first pace counts
        these), and its rate-limit headers (when near the limit, or once paced) set the pace."""
        pace = self.get(dep)
        if pace is None:
            return
        pace.answered_at(sent_at)
        if grant is not None:
            if pace.concurrency is not None and grant.counted:
                pace.concurrency.sample(pace.clock.monotonic() - sent_at, pace.inflight)
            pace.ended(grant)
        headers = hidden.get("additional_headers") if hidden else None
        if grant is None and not pace.wants_headers(headers):
            return  # the healthy path: nothing paced, no limit stated
        used = None
        if grant is not None and grant.tokens and usage:
            used = float(usage.get("total_tokens") or 0) or None
        if pace.on_answer(
            headers, grant.tokens if grant is not None else 0.0, used, grant.serial if grant else pace.granted
        ):
            self.on = True

    def rate_limited(
        self,
        dep: str,
        retry_after: float | None,
        headers: Mapping[str, Any] | None,
        latency: float,
        grant: Grant | None,
        siblings: Iterable[str] = (),
    ) -> None:
        """A provider's 429 from ``dep``: its pace holds and slows (see :meth:`Pace.on_rate_limited`);
        its ``siblings`` in the group still in slow start stop widening (:meth:`Pace.sibling_refused`)."""
        self[dep].on_rate_limited(retry_after, headers, latency, grant)
        for other in siblings:
            if other != dep and other in self:
                self[other].sibling_refused()
        self.on = True

    def finished(self, grant: Grant | None, sent: bool) -> None:
        """An admitted attempt ended without an answer: in flight, its place frees; never sent,
        its slot goes back."""
        if grant is None:
            return
        pace = self[grant.deployment_id]
        if sent:
            pace.ended(grant)
        else:
            pace.give_back(grant)

    def failover(self, deployments: Iterable[str]) -> None:
        """Calls are about to fail over to these deployments for a rate limit: the idle ones with
        no known limit ramp up (slow start) rather than take the whole surge at once."""
        if not self.enabled:
            return
        for dep in deployments:
            self[dep].restart_slow_start()
        self.on = True

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Each deployment's effective limits, their source, its queue and counters."""
        return {dep: pace.snapshot() for dep, pace in self.items()}
