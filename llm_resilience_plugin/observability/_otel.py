"""OpenTelemetry traces and metrics of router events, named per the GenAI semantic conventions.

One span per logical call (``{operation} {group}``: ``chat``, ``embeddings``, ...; kind CLIENT, a
child of the span current when the call started) and one child span per attempt that sent a
request, timed from the attempt's record; retries, fallbacks, hedges, skipped routes, stream
restarts and breaker transitions are span events. Resilience facts live under
``llm_resilience.*``. Needs ``opentelemetry-api`` only.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from llm_resilience_plugin._redaction import redact
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.events import (
    AttemptRecord,
    BreakerTransition,
    CallReport,
    CallStarted,
    Event,
    FallbackTaken,
    HedgeSent,
    Paced,
    RetryScheduled,
    StreamBreak,
    StreamRestart,
)
from llm_resilience_plugin.observability import _semconv as sc
from llm_resilience_plugin.observability._gauges import hedge_won
from llm_resilience_plugin.observability._otel_gauges import observe, unobserve

if TYPE_CHECKING:
    from llm_resilience_plugin.events import DeploymentInfo
    from llm_resilience_plugin.routing._router import ResilientRouter

SCOPE = "llm_resilience_plugin"

# Bucket boundaries the GenAI conventions advise for durations (s) and token counts.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
UPSTREAM_BUCKETS = (1, 2, 3, 4, 6, 8, 12)


def ns(seconds: float) -> int:
    """Epoch seconds as OpenTelemetry's epoch nanoseconds."""
    return int(seconds * 1e9)


def _err(cls: ErrorClass | None) -> str | None:
    return str(cls) if cls is not None else None


@dataclass(slots=True)
class _OpenCall:
    span: Span
    group: str
    started_at: float
    operation: str = "completion"


@dataclass(slots=True)
class _PendingTransition:
    event: BreakerTransition
    seen_at: float  # the router clock's wall time when it was emitted


@dataclass(slots=True)
class _Transitions:
    by_deployment: dict[str, list[_PendingTransition]] = field(default_factory=dict)


class OtelTracer:
    """Router-event subscriber that turns each call into a span tree (see the module docstring)."""

    def __init__(
        self,
        router: ResilientRouter,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        capture_content: bool = False,
        max_open_calls: int = 10_000,
    ) -> None:
        from llm_resilience_plugin import __version__ as version

        self.router = router
        self.tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        self.capture_content = capture_content
        self.max_open_calls = max_open_calls
        self.deployments: dict[str, DeploymentInfo] = {d.id: d for d in router.deployments()}
        self._calls: OrderedDict[str, _OpenCall] = OrderedDict()
        self._transitions = _Transitions()
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        if isinstance(event, AttemptRecord):
            self._attempt(event)
        elif isinstance(event, CallStarted):
            self._start(event)
        elif isinstance(event, CallReport):
            self._end(event)
        elif isinstance(event, BreakerTransition):
            pending = _PendingTransition(event, self.router.clock.wall())
            with self._lock:
                seen = self._transitions.by_deployment.setdefault(event.deployment_id, [])
                seen.append(pending)
                del seen[:-8]  # a transition no attempt ever claims must not pile up
        else:
            self._call_event(event)

    # -- the call span ------------------------------------------------------------------------

    def _start(self, ev: CallStarted) -> None:
        attrs: dict[str, Any] = {
            **sc.operation_attributes(ev.operation),
            sc.REQUEST_MODEL: ev.requested_group,
            f"{sc.NS}.call_id": ev.call_id,
            f"{sc.NS}.stream": ev.stream,
        }
        if self.capture_content and ev.messages is not None:
            attrs[sc.INPUT_MESSAGES] = json.dumps(redact(list(ev.messages)), default=str)
        started = self.router.clock.wall()
        span = self.tracer.start_span(
            f"{sc.operation_name(ev.operation)} {ev.requested_group}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=ns(started),
        )
        self._remember(ev.call_id, _OpenCall(span, ev.requested_group, started, ev.operation))

    def _remember(self, call_id: str, call: _OpenCall) -> None:
        with self._lock:
            self._calls[call_id] = call
            while len(self._calls) > self.max_open_calls:  # calls whose end never came
                _, lost = self._calls.popitem(last=False)
                lost.span.end()

    def _open(self, call_id: str, group: str, started_at: float, operation: str) -> _OpenCall:
        """The call's span; started late (from the current context) if its start was missed."""
        with self._lock:
            known = self._calls.get(call_id)
        if known is not None:
            return known
        attrs = {**sc.operation_attributes(operation), sc.REQUEST_MODEL: group, f"{sc.NS}.call_id": call_id}
        span = self.tracer.start_span(
            f"{sc.operation_name(operation)} {group}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=ns(started_at),
        )
        call = _OpenCall(span, group, started_at, operation)
        self._remember(call_id, call)
        return call

    def _end(self, r: CallReport) -> None:
        call = self._open(r.call_id, r.requested_group, r.started_at, r.operation)
        with self._lock:
            self._calls.pop(r.call_id, None)
        span = call.span
        dep = self.deployments.get(r.deployment_id or "")
        names = sc.names_of(dep)
        attempts = r.attempts
        budget = r.error_class is ErrorClass.BUDGET or any(
            a.error_class is ErrorClass.BUDGET for a in attempts
        )
        attrs: dict[str, Any] = {
            **sc.operation_attributes(r.operation, names.provider),
            f"{sc.NS}.outcome": r.outcome or "unknown",
            f"{sc.NS}.fallback_level": r.fallback_level,
            f"{sc.NS}.upstream_requests": r.upstream_requests,
            f"{sc.NS}.retries": r.retries,
            f"{sc.NS}.hedged": r.hedged,
            f"{sc.NS}.degraded": bool(r.degraded),
            f"{sc.NS}.budget_refused": budget,
            f"{sc.NS}.stream_restarts": r.stream_restarts,
        }
        if r.degraded:
            attrs[f"{sc.NS}.degradations"] = list(r.degraded)
        optional = {
            sc.PROVIDER: names.provider,
            sc.RESPONSE_MODEL: r.served_model,
            f"{sc.NS}.served_group": r.served_group,
            f"{sc.NS}.deployment_id": r.deployment_id,
            f"{sc.NS}.error_class": _err(r.error_class),
            f"{sc.NS}.ttft_s": r.ttft_s,
            sc.TIME_TO_FIRST_CHUNK: r.ttft_s,
            f"{sc.NS}.priority": r.priority,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        if r.usage:
            attrs[sc.INPUT_TOKENS] = int(r.usage.get("prompt_tokens") or 0)
            attrs[sc.OUTPUT_TOKENS] = int(r.usage.get("completion_tokens") or 0)
        if r.outcome == "failure":
            attrs[sc.ERROR_TYPE] = _err(r.error_class) or "unknown"
            span.set_status(Status(StatusCode.ERROR, _err(r.error_class)))
        span.set_attributes(attrs)
        span.end(end_time=ns(max(r.started_at + r.total_latency_s, call.started_at)))

    # -- events on the call span ---------------------------------------------------------------

    def _call_event(self, event: Event) -> None:
        name, attrs = _event_attributes(event)
        if name is None:
            return
        with self._lock:
            call = self._calls.get(getattr(event, "call_id", ""))
        if call is not None:
            call.span.add_event(name, attrs, timestamp=ns(self.router.clock.wall()))

    # -- attempt spans -------------------------------------------------------------------------

    def _attempt(self, a: AttemptRecord) -> None:
        call = self._open(a.call_id, a.model_group, a.started_at, a.operation)
        end = a.started_at + a.latency_s
        transitions = self._claim_transitions(a.deployment_id, a.started_at, end)
        if a.outcome == "skipped":  # nothing was sent: an event, not a span
            attrs: dict[str, Any] = {
                f"{sc.NS}.attempt": a.attempt,
                f"{sc.NS}.model_group": a.model_group,
                f"{sc.NS}.fallback_level": a.fallback_level,
            }
            if a.deployment_id:
                attrs[f"{sc.NS}.deployment_id"] = a.deployment_id
            if a.error_class is not None:
                attrs[f"{sc.NS}.error_class"] = str(a.error_class)
            call.span.add_event(f"{sc.NS}.route_skipped", attrs, timestamp=ns(a.started_at))
            for t in transitions:
                call.span.add_event(*_transition_event(t.event), timestamp=ns(t.seen_at))
            return
        dep = self.deployments.get(a.deployment_id or "")
        names = sc.names_of(dep)
        model = names.model or a.model_group
        span_attrs = self._attempt_attributes(a, names, model)
        span = self.tracer.start_span(
            f"{sc.operation_name(a.operation)} {model}",
            context=trace.set_span_in_context(call.span),
            kind=SpanKind.CLIENT,
            attributes=span_attrs,
            start_time=ns(a.started_at),
        )
        for t in transitions:
            span.add_event(*_transition_event(t.event), timestamp=ns(t.seen_at))
        if a.outcome == "failure":
            span.set_status(Status(StatusCode.ERROR, _err(a.error_class)))
        span.end(end_time=ns(end))

    def _attempt_attributes(self, a: AttemptRecord, names: sc.DeploymentNames, model: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            **sc.operation_attributes(a.operation, names.provider),
            sc.REQUEST_MODEL: model,
            f"{sc.NS}.call_id": a.call_id,
            f"{sc.NS}.attempt": a.attempt,
            f"{sc.NS}.retry_number": a.attempt - 1,
            f"{sc.NS}.model_group": a.model_group,
            f"{sc.NS}.fallback_level": a.fallback_level,
            f"{sc.NS}.outcome": a.outcome,
            f"{sc.NS}.wait_before_s": a.wait_before_s,
            f"{sc.NS}.probe": a.probe,
        }
        optional: Mapping[str, Any] = {
            sc.PROVIDER: names.provider,
            sc.SERVER_ADDRESS: names.address,
            sc.SERVER_PORT: names.port,
            sc.RESPONSE_MODEL: a.served_model,
            sc.HTTP_STATUS: a.status,
            f"{sc.NS}.deployment_id": a.deployment_id,
            f"{sc.NS}.breaker_state": a.breaker_state,
            f"{sc.NS}.error_class": _err(a.error_class),
            f"{sc.NS}.ttft_s": a.ttft_s,
            sc.TIME_TO_FIRST_CHUNK: a.ttft_s,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        if a.usage:
            attrs[sc.INPUT_TOKENS] = int(a.usage.get("prompt_tokens") or 0)
            attrs[sc.OUTPUT_TOKENS] = int(a.usage.get("completion_tokens") or 0)
        if a.outcome == "failure":
            attrs[sc.ERROR_TYPE] = _err(a.error_class) or "unknown"
        return attrs

    def _claim_transitions(self, dep: str | None, start: float, end: float) -> list[_PendingTransition]:
        """Breaker transitions of ``dep`` emitted during this attempt (they come just before its record)."""
        if dep is None:
            return []
        with self._lock:
            pending = self._transitions.by_deployment.pop(dep, [])
        return [t for t in pending if start - 1.0 <= t.seen_at <= end + 1.0]

    def close(self) -> None:
        """End the spans of calls still open (detaching mid-call)."""
        with self._lock:
            calls, self._calls = list(self._calls.values()), OrderedDict()
        for c in calls:
            c.span.end()


def _transition_event(t: BreakerTransition) -> tuple[str, dict[str, Any]]:
    return f"{sc.NS}.breaker_transition", {
        f"{sc.NS}.deployment_id": t.deployment_id,
        f"{sc.NS}.model_group": t.model_group,
        f"{sc.NS}.breaker.old_state": t.old_state,
        f"{sc.NS}.breaker.new_state": t.new_state,
        f"{sc.NS}.breaker.fail_counter": t.fail_counter,
    }


def _event_attributes(event: Event) -> tuple[str | None, dict[str, Any]]:
    """The span event (name, attributes) of a retry, fallback, hedge, stream restart or break."""
    if isinstance(event, RetryScheduled):
        attrs: dict[str, Any] = {
            f"{sc.NS}.retry_number": event.retry_number,
            f"{sc.NS}.sleep_s": event.sleep_s,
            f"{sc.NS}.error_class": str(event.error_class),
            f"{sc.NS}.model_group": event.model_group,
        }
        if event.deployment_id:
            attrs[f"{sc.NS}.deployment_id"] = event.deployment_id
        return f"{sc.NS}.retry", attrs
    if isinstance(event, FallbackTaken):
        return f"{sc.NS}.fallback", {
            f"{sc.NS}.from_group": event.from_group,
            f"{sc.NS}.to_group": event.to_group,
            f"{sc.NS}.fallback_level": event.fallback_level,
            f"{sc.NS}.error_class": str(event.reason),
        }
    if isinstance(event, Paced):
        return f"{sc.NS}.paced", {
            f"{sc.NS}.model_group": event.model_group,
            f"{sc.NS}.deployment_id": event.deployment_id,
            f"{sc.NS}.waited_s": event.waited_s,
            f"{sc.NS}.queued": event.queued,
        }
    if isinstance(event, HedgeSent):
        attrs = {f"{sc.NS}.delay_s": event.delay_s, f"{sc.NS}.model_group": event.model_group}
        if event.first_deployment:
            attrs[f"{sc.NS}.deployment_id"] = event.first_deployment
        return f"{sc.NS}.hedge", attrs
    if isinstance(event, StreamRestart):
        return f"{sc.NS}.stream_restart", {
            f"{sc.NS}.mode": event.mode,
            f"{sc.NS}.error_class": str(event.error_class),
            f"{sc.NS}.model_group": event.model_group,
            f"{sc.NS}.discarded_chars": len(event.discarded_text),
        }
    if isinstance(event, StreamBreak):
        optional = {
            f"{sc.NS}.broken_deployment": event.broken_deployment,
            f"{sc.NS}.deployment_id": event.deployment_id,
            f"{sc.NS}.extra_tokens": event.extra_tokens,
            f"{sc.NS}.extra_cost": event.extra_cost,
            f"{sc.NS}.wait_s": event.wait_s,
        }
        return f"{sc.NS}.stream_break", {
            f"{sc.NS}.end": event.end,
            f"{sc.NS}.error_class": str(event.error_class),
            f"{sc.NS}.model_group": event.model_group,
            f"{sc.NS}.shown_chars": event.shown_chars,
            **{k: v for k, v in optional.items() if v is not None},
        }
    return None, {}


# -- metrics --------------------------------------------------------------------------------------


class OtelMetrics:
    """Router-event subscriber that records GenAI client metrics and ``llm_resilience.*`` metrics
    (calls, attempts, retries, fallbacks, hedges sent and won, stream breaks by how they ended,
    upstream requests per call, breaker state and transitions, time to first chunk; retry-budget
    tokens and cost-budget spend and remaining as gauges read when collected) with
    low-cardinality attributes only (no call ids)."""

    def __init__(
        self,
        router: ResilientRouter,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        scope_values: bool = False,
    ) -> None:
        from llm_resilience_plugin import __version__ as version

        self.router = router
        self.deployments: dict[str, DeploymentInfo] = {d.id: d for d in router.deployments()}
        # Provider-chosen values reach metric attributes only through bounded sets.
        self._served = sc.BoundedNames(
            {n for d in self.deployments.values() for n in (d.model, sc.names_of(d).model) if n}
        )
        self._dep_ids = sc.BoundedNames(self.deployments, extra=0)
        m = metrics.get_meter(SCOPE, version, meter_provider=meter_provider)
        self.provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self.duration = m.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of GenAI operations (one logical call, retries and fallbacks included)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.tokens = m.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens used per call",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.ttfc = m.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to the first chunk of a streamed call",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.calls = m.create_counter(f"{sc.NS}.calls", unit="{call}", description="Logical calls")
        self.attempts = m.create_counter(f"{sc.NS}.attempts", unit="{attempt}", description="Attempts")
        self.retries = m.create_counter(f"{sc.NS}.retries", unit="{retry}", description="Retries scheduled")
        self.fallbacks = m.create_counter(f"{sc.NS}.fallbacks", unit="{fallback}", description="Fallbacks")
        self.upstream = m.create_histogram(
            f"{sc.NS}.upstream_requests",
            unit="{request}",
            description="Requests sent upstream per logical call",
            explicit_bucket_boundaries_advisory=UPSTREAM_BUCKETS,
        )
        self.breaker_state = m.create_gauge(
            f"{sc.NS}.breaker.state", unit="1", description="Breaker state: 0 closed, 1 half-open, 2 open"
        )
        self.breaker_transitions = m.create_counter(
            f"{sc.NS}.breaker.transitions", unit="{transition}", description="Breaker transitions"
        )
        self.hedges = m.create_counter(f"{sc.NS}.hedges", unit="{hedge}", description="Hedge requests sent")
        self.pacing_wait = m.create_histogram(
            f"{sc.NS}.pacing.wait",
            unit="s",
            description="Time an attempt waited for a rate-limit slot, by deployment and priority tier",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.hedges_won = m.create_counter(
            f"{sc.NS}.hedges.won", unit="{hedge}", description="Hedged calls answered by the hedge"
        )
        self.stream_breaks = m.create_counter(
            f"{sc.NS}.stream_breaks",
            unit="{break}",
            description="Streams broken after content, by how the break ended "
            "(continued, replayed, diverged, given_up)",
        )
        self._observed = observe(self.provider, m, router, scope_values=scope_values)
        for dep_id, snap in router.breakers().items():
            self.breaker_state.set(
                sc.breaker_value(snap.get("state")),
                {f"{sc.NS}.model_group": snap.get("model_group", ""), f"{sc.NS}.deployment_id": dep_id},
            )

    def close(self) -> None:
        """Stop reporting this router's gauges (its counters simply stop growing)."""
        unobserve(self.provider, self._observed)

    def __call__(self, event: Event) -> None:
        if isinstance(event, AttemptRecord):
            self.attempts.add(
                1,
                {
                    sc.OPERATION: sc.operation_name(event.operation),
                    f"{sc.NS}.model_group": event.model_group,
                    f"{sc.NS}.deployment_id": self._dep_ids(event.deployment_id)
                    if event.deployment_id
                    else "",
                    f"{sc.NS}.outcome": event.outcome,
                    f"{sc.NS}.error_class": _err(event.error_class) or "",
                },
            )
        elif isinstance(event, CallReport):
            self._call(event)
        elif isinstance(event, RetryScheduled):
            self.retries.add(
                1, {f"{sc.NS}.model_group": event.model_group, f"{sc.NS}.error_class": str(event.error_class)}
            )
        elif isinstance(event, FallbackTaken):
            self.fallbacks.add(
                1,
                {
                    f"{sc.NS}.model_group": event.from_group,
                    f"{sc.NS}.to_group": event.to_group,
                    f"{sc.NS}.error_class": str(event.reason),
                },
            )
        elif isinstance(event, HedgeSent):
            self.hedges.add(1, {f"{sc.NS}.model_group": event.model_group})
        elif isinstance(event, Paced):
            self.pacing_wait.record(
                event.waited_s,
                {
                    f"{sc.NS}.model_group": event.model_group,
                    f"{sc.NS}.deployment_id": event.deployment_id,
                    f"{sc.NS}.priority": event.priority or "",
                },
            )
        elif isinstance(event, StreamBreak):
            self.stream_breaks.add(
                1,
                {
                    f"{sc.NS}.model_group": event.model_group,
                    f"{sc.NS}.deployment_id": self._dep_ids(event.broken_deployment)
                    if event.broken_deployment
                    else "",
                    f"{sc.NS}.stream_break.end": event.end,
                    f"{sc.NS}.error_class": str(event.error_class),
                },
            )
        elif isinstance(event, BreakerTransition):
            where = {f"{sc.NS}.model_group": event.model_group, f"{sc.NS}.deployment_id": event.deployment_id}
            self.breaker_state.set(sc.breaker_value(event.new_state), where)
            self.breaker_transitions.add(1, {**where, f"{sc.NS}.breaker.new_state": event.new_state})

    def _call(self, r: CallReport) -> None:
        names = sc.names_of(self.deployments.get(r.deployment_id or ""))
        gen: dict[str, Any] = {
            sc.OPERATION: sc.operation_name(r.operation),
            sc.REQUEST_MODEL: r.requested_group,
        }
        if names.provider:
            gen[sc.PROVIDER] = names.provider
        if r.served_model:
            gen[sc.RESPONSE_MODEL] = self._served(r.served_model)
        if r.outcome == "failure":
            gen[sc.ERROR_TYPE] = _err(r.error_class) or "unknown"
        self.duration.record(r.total_latency_s, gen)
        if r.ttft_s is not None:
            self.ttfc.record(r.ttft_s, gen)
        if r.usage:
            self.tokens.record(int(r.usage.get("prompt_tokens") or 0), {**gen, sc.TOKEN_TYPE: "input"})
            self.tokens.record(int(r.usage.get("completion_tokens") or 0), {**gen, sc.TOKEN_TYPE: "output"})
        group = {f"{sc.NS}.model_group": r.requested_group}
        self.calls.add(
            1,
            {
                **group,
                sc.OPERATION: gen[sc.OPERATION],
                f"{sc.NS}.outcome": r.outcome or "unknown",
                f"{sc.NS}.error_class": _err(r.error_class) or "",
            },
        )
        self.upstream.record(r.upstream_requests, group)
        won = hedge_won(r) if r.hedged else None
        if won is not None:
            self.hedges_won.add(1, {f"{sc.NS}.model_group": won})
