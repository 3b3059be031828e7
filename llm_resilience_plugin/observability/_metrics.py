"""A metrics summary computed from router events.

::

    metrics = MetricsCollector(router)          # subscribes to router.subscribe(...)
    ...
    print(metrics.summary())                     # or .summary().to_dict()

The summary: calls, success rate, p50/p95/p99 latency (per call and per attempt) and TTFT,
upstream requests per logical request (retry amplification), retry and fallback rates, the error
distribution per deployment, tokens, and cost per call. It keeps the last ``max_calls`` calls.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin.events import AttemptRecord, CallReport

if TYPE_CHECKING:
    from llm_resilience_plugin.cost._guard import CostGuard
    from llm_resilience_plugin.observability._logs import RouterObserver
    from llm_resilience_plugin.routing._router import ResilientRouter


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in [0, 100]) of ``values``; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": (sum(values) / len(values)) if values else None,
        "max": max(values) if values else None,
    }


@dataclass(slots=True)
class MetricsSummary:
    calls: int
    successes: int
    failures: int
    success_rate: float | None
    latency_s: dict[str, float | None]
    attempt_latency_s: dict[str, float | None]
    ttft_s: dict[str, float | None]
    attempts: int
    upstream_requests: int
    upstream_per_call: float | None
    retries: int
    retry_rate: float | None
    fallbacks: int
    fallback_rate: float | None
    served_by_fallback: int
    errors_by_deployment: dict[str, dict[str, int]]
    errors_by_class: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    cost_total: float
    cost_per_call: float | None
    by_group: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]

    def __str__(self) -> str:
        def f(x: float | None, scale: float = 1000.0, unit: str = "ms") -> str:
            return "-" if x is None else f"{x * scale:.1f}{unit}"

        lat, ttft = self.latency_s, self.ttft_s
        lines = [
            f"calls {self.calls}  success rate "
            + ("-" if self.success_rate is None else f"{self.success_rate:.1%}"),
            f"latency p50 {f(lat['p50'])} p95 {f(lat['p95'])} p99 {f(lat['p99'])}",
            f"ttft    p50 {f(ttft['p50'])} p95 {f(ttft['p95'])} p99 {f(ttft['p99'])}",
            "upstream requests per call "
            + ("-" if self.upstream_per_call is None else f"{self.upstream_per_call:.2f}")
            + f"  retries {self.retries}  fallback rate "
            + ("-" if self.fallback_rate is None else f"{self.fallback_rate:.1%}"),
            f"cost ${self.cost_total:.6f} total, "
            + ("-" if self.cost_per_call is None else f"${self.cost_per_call:.6f}")
            + " per call",
        ]
        for dep, errs in sorted(self.errors_by_deployment.items()):
            lines.append(f"  errors {dep}: " + ", ".join(f"{k}={v}" for k, v in sorted(errs.items())))
        return "\n".join(lines)


class MetricsCollector:
    """Collects router events (``router.subscribe(collector)``) and summarises them.

    Costs come from the call's ``response_cost``, else the attempts' costs as the router's
    :class:`~llm_resilience_plugin.observability.RouterObserver` saw them (streams), else ``guard``'s
    record of the call.
    """

    def __init__(
        self,
        router: ResilientRouter | None = None,
        *,
        guard: CostGuard | None = None,
        max_calls: int = 100_000,
    ) -> None:
        self.max_calls = max_calls
        self.guard = guard
        self._lock = threading.Lock()
        self._calls: deque[tuple[CallReport, float | None]] = deque(maxlen=max_calls)
        self._attempts: deque[AttemptRecord] = deque(maxlen=max_calls * 4)
        self._observer: RouterObserver | None = None
        self._detach: Callable[[], None] | None = None
        if router is not None:
            self.attach(router)

    def attach(self, router: ResilientRouter) -> Callable[[], None]:
        """Subscribe to ``router``'s events; returns (and remembers) the detach function."""
        from llm_resilience_plugin.observability._logs import RouterObserver

        obs = RouterObserver.for_router(router, prices=self.guard.prices if self.guard is not None else None)
        obs.users += 1
        self._observer = obs
        unsubscribe = router.subscribe(self)

        def detach() -> None:
            unsubscribe()
            obs.users -= 1
            if obs.users <= 0:
                obs.remove()

        self._detach = detach
        return detach

    def detach(self) -> None:
        if self._detach is not None:
            self._detach()
            self._detach = None

    def __call__(self, event: Any) -> None:
        if isinstance(event, CallReport):
            self._calls.append((event, self._cost_of(event)))
        elif isinstance(event, AttemptRecord):
            self._attempts.append(event)

    def _cost_of(self, r: CallReport) -> float | None:
        if r.response_cost is not None and r.response_cost > 0:
            return r.response_cost
        if self._observer is not None:
            c = self._observer.call_cost(r.call_id)
            if c is not None:
                return c
        if self.guard is not None:
            info = self.guard.call_info(r.call_id)
            if info is not None:
                return float(info["cost"])
        return r.response_cost

    def reset(self) -> None:
        with self._lock:
            self._calls.clear()
            self._attempts.clear()

    def summary(self) -> MetricsSummary:
        with self._lock:
            calls = list(self._calls)
            attempts = list(self._attempts)
        return summarize(calls, attempts)


def summarize(
    calls: Iterable[tuple[CallReport, float | None]], attempts: Iterable[AttemptRecord]
) -> MetricsSummary:
    calls = list(calls)
    attempts = list(attempts)
    n = len(calls)
    ok = sum(1 for r, _ in calls if r.outcome == "success")
    failed = sum(1 for r, _ in calls if r.outcome == "failure")
    upstream = sum(r.upstream_requests for r, _ in calls)
    retries = sum(r.retries for r, _ in calls)
    fell_back = sum(1 for r, _ in calls if any(a.fallback_level > 0 for a in r.attempts))
    served_fb = sum(1 for r, _ in calls if r.outcome == "success" and r.fallback_level > 0)
    errors_dep: dict[str, dict[str, int]] = {}
    errors_cls: dict[str, int] = {}
    for a in attempts:
        if a.outcome in ("failure", "skipped") and a.error_class is not None:
            dep = a.deployment_id or f"{a.model_group}/-"
            cls = str(a.error_class)
            errors_dep.setdefault(dep, {})
            errors_dep[dep][cls] = errors_dep[dep].get(cls, 0) + 1
            errors_cls[cls] = errors_cls.get(cls, 0) + 1
    costs = [c for _, c in calls if c is not None]
    pt = sum(int((r.usage or {}).get("prompt_tokens") or 0) for r, _ in calls)
    ct = sum(int((r.usage or {}).get("completion_tokens") or 0) for r, _ in calls)
    by_group: dict[str, dict[str, Any]] = {}
    for r, c in calls:
        g = by_group.setdefault(
            r.requested_group, {"calls": 0, "successes": 0, "upstream_requests": 0, "cost": 0.0}
        )
        g["calls"] += 1
        g["successes"] += r.outcome == "success"
        g["upstream_requests"] += r.upstream_requests
        g["cost"] += c or 0.0
    return MetricsSummary(
        calls=n,
        successes=ok,
        failures=failed,
        success_rate=(ok / n) if n else None,
        latency_s=_dist([r.total_latency_s for r, _ in calls]),
        attempt_latency_s=_dist([a.latency_s for a in attempts if a.outcome != "skipped"]),
        ttft_s=_dist(
            [r.ttft_s for r, _ in calls if r.ttft_s is not None]
            or [a.ttft_s for a in attempts if a.ttft_s is not None]
        ),
        attempts=len(attempts),
        upstream_requests=upstream,
        upstream_per_call=(upstream / n) if n else None,
        retries=retries,
        retry_rate=(sum(1 for r, _ in calls if r.retries > 0) / n) if n else None,
        fallbacks=fell_back,
        fallback_rate=(fell_back / n) if n else None,
        served_by_fallback=served_fb,
        errors_by_deployment=errors_dep,
        errors_by_class=errors_cls,
        prompt_tokens=pt,
        completion_tokens=ct,
        cost_total=sum(costs),
        cost_per_call=(sum(costs) / len(costs)) if costs else None,
        by_group=by_group,
    )


__all__ = ["MetricsCollector", "MetricsSummary", "percentile", "summarize"]
