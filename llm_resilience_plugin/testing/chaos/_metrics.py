"""A run's numbers (success, latency, upstream requests, requests to a dead route, time to recover,
spend) and the advice a config setting earns when it is the cause."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llm_resilience_plugin.policy import RouterSpec
from llm_resilience_plugin.testing._simulator import RequestRecord
from llm_resilience_plugin.testing.chaos._run import RunResult, call_tag
from llm_resilience_plugin.testing.chaos._target import Deployment

__all__ = ["Metrics", "advice", "behind", "measure", "percentile", "request_failed", "served_by", "unpriced"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def request_failed(record: RequestRecord) -> bool:
    """Whether an upstream request met a fault (an error status, a dropped or cut connection)."""
    return record.status != 200 or not record.behavior.endswith("ok")


@dataclass(frozen=True)
class Metrics:
    """One scenario on one system, as the table, the JSON and the thresholds read it."""

    calls: int
    success_rate: float
    p50_s: float
    p99_s: float
    upstream_per_call: float
    to_dead_route: int
    recover_s: float | None
    observed_after_recovery_s: float | None
    spend: float
    errors: dict[str, int]
    served: dict[str, int]
    paced_share: float = 0.0
    """The share of calls the plugin held back for a deployment's rate limit (queued)."""
    fallback_share: float = 0.0
    """The share of answered calls served outside the group they asked for."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return asdict(self)


def _price(dep: Deployment, prompt: int, completion: int) -> float:
    if dep.prices is not None:
        return dep.prices[0] * prompt + dep.prices[1] * completion
    try:
        import litellm

        cin, cout = litellm.cost_per_token(
            model=dep.model, prompt_tokens=prompt, completion_tokens=completion
        )
        return float(cin) + float(cout)
    except Exception:
        return 0.0


def unpriced(deployments: Sequence[Deployment]) -> list[Deployment]:
    """The deployments whose spend the scorecard cannot count (no price in the config, none in
    LiteLLM's bundled map): their answers show as $0."""
    out = []
    for dep in deployments:
        if dep.prices is not None:
            continue
        try:
            import litellm

            info = litellm.get_model_info(dep.model)
            # a Router registers an unmapped model at $0: that is no price either
            priced = bool(info.get("input_cost_per_token") or info.get("output_cost_per_token"))
        except Exception:
            priced = False
        if not priced:
            out.append(dep)
    return out


def _dead_route_requests(run: RunResult, spec: RouterSpec) -> int:
    """Failing requests sent to a deployment that had already failed ``fail_max`` times in a row
    (what its breaker, once open, exists to stop). A 429 is neither: a deployment answering 429 is
    alive, and a rate limit is paced, never broken."""
    count = 0
    for dep in run.target.deployments:
        fail_max = spec.policy.for_group(dep.group).breaker.fail_max
        streak = 0
        for r in run.requests:
            if r.deployment != dep.sim_name or r.status == 429:
                continue
            if not request_failed(r):
                streak = 0
                continue
            if streak >= fail_max:
                count += 1
            streak += 1
    return count


def served_by(run: RunResult) -> dict[str, Deployment]:
    """Each answered call's tag -> the deployment whose answer it got (its last 200)."""
    out: dict[str, Deployment] = {}
    for r in run.requests:
        tag = call_tag(r)
        dep = run.target.by_sim_name(r.deployment)
        if tag is not None and dep is not None and not request_failed(r):
            out[tag] = dep
    return out


def _recovery(run: RunResult) -> tuple[float | None, float | None]:
    at = run.scenario.recovers_at
    if at is None:
        return None, None
    faulted = {d.sim_name for selector in run.scenario.timeline for d in run.target.select(selector)}
    later = [
        run.offset(r)
        for r in run.requests
        if r.deployment in faulted and not request_failed(r) and run.offset(r) >= at
    ]
    end = max((c.end for c in run.calls), default=at)
    return (min(later) - at if later else None), max(0.0, end - at)


def measure(run: RunResult, spec: RouterSpec) -> Metrics:
    """The numbers of one run."""
    calls = run.calls
    lat = [c.latency for c in calls]
    served = served_by(run)
    spend = 0.0
    by_dep: Counter[str] = Counter()
    elsewhere = 0
    for c in calls:
        dep = served.get(c.tag)
        if c.ok and dep is not None:
            by_dep[dep.id] += 1
            elsewhere += dep.group != run.target.primary
            spend += _price(dep, c.prompt_tokens, c.completion_tokens)
    recover, observed = _recovery(run)
    return Metrics(
        calls=len(calls),
        success_rate=sum(c.ok for c in calls) / max(1, len(calls)),
        p50_s=percentile(lat, 50),
        p99_s=percentile(lat, 99),
        upstream_per_call=len(run.requests) / max(1, len(calls)),
        to_dead_route=_dead_route_requests(run, spec),
        recover_s=recover,
        observed_after_recovery_s=observed,
        spend=spend,
        errors=dict(Counter(c.error or "?" for c in calls if not c.ok)),
        served=dict(by_dep),
        paced_share=sum(1 for c in calls if c.queued > 0.01) / max(1, len(calls)),
        fallback_share=elsewhere / max(1, sum(by_dep.values())),
    )


def _fallback_answer_s(run: RunResult) -> float | None:
    """Median time a fallback deployment took to answer, from the simulator's log."""
    fallback = {d.sim_name for d in run.target.deployments if d.group in run.target.fallbacks}
    times = [
        r.finished_at - r.started_at
        for r in run.requests
        if r.deployment in fallback and not request_failed(r) and r.finished_at is not None
    ]
    return percentile(times, 50) if times else None


def advice(run: RunResult, m: Metrics, spec: RouterSpec) -> list[str]:
    """Concrete advice where a setting of the config is what the plugin's numbers show."""
    sc, primary = run.scenario.name, run.target.primary
    pol = spec.policy.for_group(primary)
    out: list[str] = []
    fb = _fallback_answer_s(run)
    timeout = pol.attempt_timeout
    if m.paced_share > 0:
        out.append(
            f"{sc}: {m.paced_share:.0%} of the calls waited for a deployment's rate limit (the "
            "plugin paces a 429 rather than fleeing it); a wait longer than "
            f"backoff.max_wait_with_fallback ({pol.backoff.max_wait_with_fallback} s) goes to the "
            "fallback, and the deployment's rpm/tpm in litellm_params pace at the stated limit from "
            "the first call"
        )
    elif fb is not None and m.p99_s >= 0.8 * timeout and m.p99_s > 4 * fb:
        out.append(
            f"attempt_timeout {timeout:g} s makes the {sc} scenario's p99 {m.p99_s:.1f} s; your fallback "
            f"answers in {fb:.2f} s: lower resilience.attempt_timeout (or turn on resilience.hedge)"
        )
    outage = run.scenario.recovers_at
    if outage and (m.recover_s is None or m.recover_s > 2 * outage):
        reset = pol.breaker.reset_timeout
        waited = "never" if m.recover_s is None else f"after {m.recover_s:.1f} s"
        seen = f" (watched {m.observed_after_recovery_s:.1f} s)" if m.recover_s is None else ""
        out.append(
            f"{sc}: the primary was healthy again at {outage:g} s but took traffic back {waited}{seen}; "
            f"breaker.reset_timeout {reset:g} s decides how soon a probe tries it"
        )
    if m.errors.get("StreamInterruptedError") and not pol.restart_broken_streams:
        how = (
            "no route continued nor reproduced them: a deployment that takes an assistant prefill "
            "(model_info.supports_assistant_prefill: true) continues them, a reproducible request "
            "(temperature 0 or a seed) is replayed"
            if pol.recover_broken_streams
            else "resilience.recover_broken_streams: true continues them where a route can"
        )
        out.append(
            f"{sc}: {m.errors['StreamInterruptedError']} stream(s) ended interrupted after content; {how}"
        )
    if m.success_rate < 1 and not run.target.fallbacks:
        out.append(f"{sc}: group {primary!r} has no fallbacks; a failure there reaches your callers")
    if sc.startswith("context") and m.success_rate < 1 and not spec.context_window_fallbacks.get(primary):
        out.append(f"{sc}: add context_window_fallbacks for {primary!r} (a group with a larger window)")
    return out


def behind(scenario: str, plugin: Metrics, plain: Metrics, *, min_sample: int) -> list[str]:
    """One advice line for each number where the plugin does worse than the plain Router (a
    latency gap on fewer than ``min_sample`` calls is called inconclusive, not a loss)."""
    out: list[str] = []
    small = min(plugin.calls, plain.calls) < min_sample
    lead = f"{scenario}: behind the plain Router on"
    if plugin.success_rate < plain.success_rate:
        out.append(
            f"{lead} success ({plugin.success_rate:.0%} vs {plain.success_rate:.0%}): the errors "
            f"{dict(sorted(plugin.errors.items()))} say which class gave up; check that class's "
            "action and max_retries, the deadline and the fallbacks (llm-resilience check prints them)"
        )
    answered_more = plugin.success_rate > plain.success_rate
    if plugin.p99_s > 1.2 * plain.p99_s and plugin.p99_s - plain.p99_s > 0.05:
        gap = f"p99 ({plugin.p99_s:.2f} s vs {plain.p99_s:.2f} s)"
        if answered_more:
            out.append(
                f"{scenario}: {gap} with more calls answered ({plugin.success_rate:.0%} vs "
                f"{plain.success_rate:.0%}): the plain Router's p99 ends at its failures, the plugin's "
                "at the waits (for capacity, a retry, a fallback) that answered them; a shorter "
                "resilience.deadline trades those answers for latency"
            )
        elif plugin.paced_share > 0:
            out.append(f"{scenario}: {gap}: {_paced_why(plugin, plain)}")
        elif small:
            out.append(
                f"{scenario}: {gap} on {min(plugin.calls, plain.calls)} calls is inconclusive "
                "(a scenario file with more calls tells)"
            )
        else:
            out.append(
                f"{lead} {gap}: the slow calls wait on attempt_timeout or backoff; lower "
                "resilience.attempt_timeout, backoff.maximum, or turn on resilience.hedge"
            )
    if (
        plugin.upstream_per_call > 1.1 * plain.upstream_per_call
        and plugin.upstream_per_call - (plain.upstream_per_call) > 0.1
    ):
        why = "retries cost requests; lower the class's max_retries or retry_budget.capacity"
        if plugin.paced_share > 0:
            why = (
                "the plugin met 429s finding the provider's limit (its first window is 32 requests, "
                "then the limit it learns); the deployment's rpm/tpm in litellm_params pace at the "
                "stated limit from the first call"
            )
        elif answered_more:
            why = (
                f"the extra requests are the retries and stream recoveries that answered "
                f"{plugin.success_rate:.0%} of the calls against {plain.success_rate:.0%}"
            )
        out.append(
            f"{lead} upstream requests per call ({plugin.upstream_per_call:.2f} vs "
            f"{plain.upstream_per_call:.2f}): {why}"
        )
    if plugin.to_dead_route > max(plain.to_dead_route * 1.2, plain.to_dead_route + 2):
        out.append(
            f"{lead} requests to a dead route ({plugin.to_dead_route} vs {plain.to_dead_route}): "
            "a lower breaker.fail_max opens the breaker sooner"
        )
    # Spend per answered call: answering more calls costs more, and is not a loss.
    per_plugin = plugin.spend / max(1e-9, plugin.success_rate * plugin.calls)
    per_plain = plain.spend / max(1e-9, plain.success_rate * plain.calls)
    if plain.success_rate > 0 and per_plugin > 1.05 * per_plain and plugin.spend - plain.spend > 1e-6:
        out.append(
            f"{lead} spend per answered call (${per_plugin:.7f} vs ${per_plain:.7f}): more calls were "
            "answered by a pricier fallback; order the fallbacks by price, or let the breaker reset sooner"
        )
    return out


def _paced_why(plugin: Metrics, plain: Metrics) -> str:
    """Why calls held back for a rate limit are slower than the plain Router's, and what moves it."""
    held = (
        f"the plugin held {plugin.paced_share:.0%} of the calls back to the provider's rate limit "
        "instead of sending them into 429s"
    )
    if plain.fallback_share > plugin.fallback_share:
        return (
            f"{held}, on the group they asked for; the plain Router answered "
            f"{plain.fallback_share:.0%} of them from the fallback ({plugin.fallback_share:.0%} for the "
            "plugin). A wait up to backoff.max_wait_with_fallback (3 s) is taken before a fallback: "
            "lower it to fail over sooner"
        )
    return (
        f"{held}; with the deployment's rpm/tpm in litellm_params it paces at the stated limit from "
        "the first call, else at one it learns from the 429s"
    )
