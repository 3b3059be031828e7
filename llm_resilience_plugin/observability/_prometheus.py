"""Prometheus metrics of router events through ``prometheus-client``.

Calls by outcome and error class, attempts, retries, fallbacks, upstream requests per call,
call duration, time to first token, tokens, breaker state per deployment (0 closed, 1 half-open,
2 open), breaker transitions, hedges sent and won, stream breaks by how they ended, spend in
dollars and each cost-guard budget's limit; read at scrape time: retry-budget tokens and capacity
per group, and each cost budget's spent and remaining dollars in its current window. Labels stay
low-cardinality: group, deployment, outcome, error class, budget (never a call id; a tenant only
when asked). The metrics are registered once per ``CollectorRegistry`` and shared by every
router instrumented into it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llm_resilience_plugin.events import (
    AttemptRecord,
    BreakerTransition,
    CallReport,
    Event,
    FallbackTaken,
    HedgeSent,
    Paced,
    RetryScheduled,
    StreamBreak,
)
from llm_resilience_plugin.observability import _semconv as sc
from llm_resilience_plugin.observability._gauges import budget_rows, hedge_won, pace_rows, retry_budget_rows

if TYPE_CHECKING:
    from llm_resilience_plugin.routing._router import ResilientRouter

PREFIX = "llm_resilience"
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
UPSTREAM_BUCKETS = (1, 2, 3, 4, 6, 8, 12)


@dataclass(frozen=True, slots=True)
class PrometheusMetrics:
    """The metric families, registered in one registry."""

    calls: Counter
    attempts: Counter
    retries: Counter
    fallbacks: Counter
    upstream: Histogram
    duration: Histogram
    ttft: Histogram
    tokens: Counter
    breaker_state: Gauge
    breaker_transitions: Counter
    spend: Counter
    budget_limit: Gauge
    hedges: Counter
    hedges_won: Counter
    stream_breaks: Counter
    pacing_wait: Histogram
    scraped: ScrapedGauges

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PrometheusMetrics:
        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, labels, registry=registry, buckets=buckets)

        return cls(
            calls=counter(
                "calls", "Logical calls by outcome and error class", ("group", "outcome", "error_class")
            ),
            attempts=counter(
                "attempts",
                "Attempts by deployment and outcome",
                ("group", "deployment", "outcome", "error_class"),
            ),
            retries=counter("retries", "Retries scheduled in the same group", ("group", "error_class")),
            fallbacks=counter("fallbacks", "Moves to a fallback group", ("group", "to_group", "error_class")),
            upstream=histogram(
                "upstream_requests_per_call",
                "Requests sent upstream per logical call",
                ("group",),
                UPSTREAM_BUCKETS,
            ),
            duration=histogram(
                "call_duration_seconds", "Duration of logical calls", ("group", "outcome"), DURATION_BUCKETS
            ),
            ttft=histogram(
                "time_to_first_token_seconds",
                "Time to the first chunk of streams",
                ("group",),
                DURATION_BUCKETS,
            ),
            tokens=counter("tokens", "Tokens used by calls", ("group", "type")),
            breaker_state=Gauge(
                f"{PREFIX}_breaker_state",
                "Breaker state per deployment: 0 closed, 1 half-open, 2 open",
                ("group", "deployment"),
                registry=registry,
            ),
            breaker_transitions=counter(
                "breaker_transitions",
                "Breaker transitions per deployment",
                ("group", "deployment", "new_state"),
            ),
            spend=counter("spend_usd", "Dollars spent by calls (their response cost)", ("group",)),
            budget_limit=Gauge(
                f"{PREFIX}_budget_limit_usd",
                "Each cost-guard budget's limit in dollars (a scoped budget: per scope value)",
                ("budget", "period"),
                registry=registry,
            ),
            hedges=counter("hedges", "Hedge requests sent", ("group",)),
            hedges_won=counter("hedges_won", "Hedged calls answered by the hedge", ("group",)),
            stream_breaks=counter(
                "stream_breaks",
                "Streams broken after content, by how the break ended (continued, replayed, "
                "diverged, given_up)",
                ("group", "deployment", "end", "error_class"),
            ),
            pacing_wait=histogram(
                "pacing_wait_seconds",
                "Time an attempt waited for a rate-limit slot, by deployment and priority tier",
                ("group", "deployment", "priority"),
                DURATION_BUCKETS,
            ),
            scraped=ScrapedGauges.register(registry),
        )


class ScrapedGauges:
    """A collector of gauges read at scrape time from the routers instrumented into one registry
    (held weakly): retry-budget tokens and capacity per group, and cost-budget spent and
    remaining dollars per budget, period and scope."""

    def __init__(self) -> None:
        self._routers: weakref.WeakSet[ScrapedRouter] = weakref.WeakSet()

    @classmethod
    def register(cls, registry: CollectorRegistry) -> ScrapedGauges:
        collector = cls()
        registry.register(collector)
        return collector

    def add(self, router: ScrapedRouter) -> None:
        self._routers.add(router)

    def discard(self, router: ScrapedRouter) -> None:
        self._routers.discard(router)

    def collect(self) -> Iterator[Metric]:
        tokens = GaugeMetricFamily(
            f"{PREFIX}_retry_budget_tokens", "Retry-budget tokens left per model group", labels=["group"]
        )
        capacity = GaugeMetricFamily(
            f"{PREFIX}_retry_budget_capacity", "Retry-budget capacity per model group", labels=["group"]
        )
        labels = ["budget", "period", "scope"]
        spent = GaugeMetricFamily(
            f"{PREFIX}_budget_spent_usd", "Dollars a cost budget spent in its current window", labels=labels
        )
        remaining = GaugeMetricFamily(
            f"{PREFIX}_budget_remaining_usd",
            "Dollars left in a cost budget's current window (reservations counted)",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            f"{PREFIX}_pacing_queued", "Calls waiting for a rate-limit slot", labels=["group", "deployment"]
        )
        limit = GaugeMetricFamily(
            f"{PREFIX}_pacing_limit_rpm",
            "A deployment's paced limit in requests a minute (0: none known)",
            labels=["group", "deployment"],
        )
        granted = CounterMetricFamily(
            f"{PREFIX}_pacing_granted",
            "Requests admitted by a deployment's pace",
            labels=["group", "deployment"],
        )
        for r in list(self._routers):
            for p in pace_rows(r.router):
                queued.add_metric([p.group, p.deployment], p.queued)
                limit.add_metric([p.group, p.deployment], p.limit_rpm)
                granted.add_metric([p.group, p.deployment], p.granted)
            for row in retry_budget_rows(r.router):
                tokens.add_metric([row.group], row.tokens)
                capacity.add_metric([row.group], row.capacity)
            for b in budget_rows(r.router, scope_values=r.scope_values):
                spent.add_metric([b.budget, b.period, b.scope], b.spent)
                remaining.add_metric([b.budget, b.period, b.scope], b.remaining)
        yield from (tokens, capacity, spent, remaining, queued, limit, granted)


class ScrapedRouter:
    """One router as :class:`ScrapedGauges` reads it."""

    def __init__(self, router: Any, scope_values: bool) -> None:
        self.router = router
        self.scope_values = scope_values


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, PrometheusMetrics] = weakref.WeakKeyDictionary()
_BY_REGISTRY_LOCK = threading.Lock()


def metrics_for(registry: CollectorRegistry | None) -> PrometheusMetrics:
    """The metric families of ``registry`` (default: prometheus-client's global one), made once."""
    reg = registry if registry is not None else REGISTRY
    with _BY_REGISTRY_LOCK:
        found = _BY_REGISTRY.get(reg)
        if found is None:
            found = _BY_REGISTRY[reg] = PrometheusMetrics.create(reg)
        return found


class PrometheusRecorder:
    """Router-event subscriber that updates :class:`PrometheusMetrics`."""

    def __init__(
        self,
        router: ResilientRouter,
        registry: CollectorRegistry | None = None,
        *,
        scope_values: bool = False,
    ) -> None:
        self.m = metrics_for(registry)
        self._scraped = ScrapedRouter(router, scope_values)
        self.m.scraped.add(self._scraped)
        for dep_id, snap in router.breakers().items():
            self.m.breaker_state.labels(snap.get("model_group", ""), dep_id).set(
                sc.breaker_value(snap.get("state"))
            )
        for guard in getattr(router, "guards", ()):  # a CostGuard's budgets, for spend vs budget
            for budget in getattr(guard, "budgets", ()):
                self.m.budget_limit.labels(budget.name, budget.period).set(budget.limit)

    def close(self) -> None:
        """Stop reading this router's gauges at scrape time."""
        self.m.scraped.discard(self._scraped)

    def __call__(self, event: Event) -> None:
        m = self.m
        if isinstance(event, AttemptRecord):
            m.attempts.labels(
                event.model_group,
                event.deployment_id or "",
                event.outcome,
                str(event.error_class) if event.error_class else "",
            ).inc()
        elif isinstance(event, CallReport):
            group, outcome = event.requested_group, event.outcome or "unknown"
            m.calls.labels(group, outcome, str(event.error_class) if event.error_class else "").inc()
            m.upstream.labels(group).observe(event.upstream_requests)
            m.duration.labels(group, outcome).observe(event.total_latency_s)
            if event.ttft_s is not None:
                m.ttft.labels(group).observe(event.ttft_s)
            if event.response_cost:
                m.spend.labels(group).inc(event.response_cost)
            if event.usage:
                m.tokens.labels(group, "input").inc(int(event.usage.get("prompt_tokens") or 0))
                m.tokens.labels(group, "output").inc(int(event.usage.get("completion_tokens") or 0))
            won = hedge_won(event) if event.hedged else None
            if won is not None:
                m.hedges_won.labels(won).inc()
        elif isinstance(event, HedgeSent):
            m.hedges.labels(event.model_group).inc()
        elif isinstance(event, StreamBreak):
            m.stream_breaks.labels(
                event.model_group, event.broken_deployment or "", event.end, str(event.error_class)
            ).inc()
        elif isinstance(event, Paced):
            m.pacing_wait.labels(event.model_group, event.deployment_id, event.priority or "").observe(
                event.waited_s
            )
        elif isinstance(event, RetryScheduled):
            m.retries.labels(event.model_group, str(event.error_class)).inc()
        elif isinstance(event, FallbackTaken):
            m.fallbacks.labels(event.from_group, event.to_group, str(event.reason)).inc()
        elif isinstance(event, BreakerTransition):
            m.breaker_state.labels(event.model_group, event.deployment_id).set(
                sc.breaker_value(event.new_state)
            )
            m.breaker_transitions.labels(event.model_group, event.deployment_id, event.new_state).inc()
